"""`LinearFit`: y ~ a + b x, fitted online by a two-state Kalman filter (recursive least squares).

Why a Kalman form rather than plain RLS with a forgetting factor: the prior is a real belief with a
stated uncertainty (`prior_rel_std`, 1.0: "could be 2x off either way"), each observation's noise is
relative to its size (`noise_rel_std` of the prediction: a 2 s TTFT is not known to the millisecond),
and a small process noise (`drift`, a share of the prior variance per observation) keeps the gain
from vanishing, so a replica that slows down (another tenant's load, a thermal throttle) is followed
without the covariance blow-up a forgetting factor gives when the inputs stop varying.

Robustness:
- coefficients are clamped to [prior / `bound`, prior x `bound`]: one absurd sample cannot make a
  replica look free or dead;
- an observation whose innovation is beyond `gate` standard deviations is refused as an outlier
  (a client that read slowly, a retry, a GC pause), unless `gate_after` in a row were: then the
  replica has truly changed and the next one is taken.

Mutable and tiny (slots, plain floats; an update is a few dozen float operations). No I/O.
"""

from __future__ import annotations

import math


class LinearFit:
    """Online fit of y = a + b * x (x in the caller's scaled unit). `a0`, `b0`: the prior, both > 0."""

    __slots__ = (
        "_bound",
        "_drift",
        "_gate",
        "_gate_after",
        "_noise",
        "_q0",
        "_q1",
        "_refused_in_row",
        "a",
        "a0",
        "b",
        "b0",
        "observations",
        "p00",
        "p01",
        "p11",
        "refused",
    )

    def __init__(
        self,
        a0: float,
        b0: float,
        *,
        prior_rel_std: float = 1.0,
        noise_rel_std: float = 0.15,
        drift: float = 0.002,
        bound: float = 20.0,
        gate: float = 4.0,
        gate_after: int = 3,
    ) -> None:
        if not (a0 > 0 and b0 > 0 and math.isfinite(a0) and math.isfinite(b0)):
            raise ValueError(f"prior coefficients must be finite and > 0, got {a0}, {b0}")
        self.a0, self.b0 = a0, b0
        self.a, self.b = a0, b0
        self.p00 = (prior_rel_std * a0) ** 2
        self.p11 = (prior_rel_std * b0) ** 2
        self.p01 = 0.0
        self._q0 = drift * self.p00
        self._q1 = drift * self.p11
        self._noise = noise_rel_std
        self._bound = bound
        self._gate = gate
        self._gate_after = gate_after
        self._refused_in_row = 0
        self.observations = 0  # taken into the fit
        self.refused = 0  # refused as outliers

    def predict(self, x: float) -> float:
        return self.a + self.b * x

    def update(self, x: float, y: float) -> bool:
        """Take the observation (x, y); False when it was refused (non-finite, or an outlier)."""
        if not (math.isfinite(x) and math.isfinite(y)) or x < 0 or y <= 0:
            return False
        predicted = self.a + self.b * x
        innovation = y - predicted
        # P x and x' P x for x = (1, x).
        px0 = self.p00 + self.p01 * x
        px1 = self.p01 + self.p11 * x
        noise = self._noise * max(predicted, y * 0.5)
        s = px0 + px1 * x + noise * noise
        if innovation * innovation > self._gate * self._gate * s and self._refused_in_row < self._gate_after:
            self._refused_in_row += 1
            self.refused += 1
            return False
        self._refused_in_row = 0
        k0, k1 = px0 / s, px1 / s
        self.a = _clamp(self.a + k0 * innovation, self.a0, self._bound)
        self.b = _clamp(self.b + k1 * innovation, self.b0, self._bound)
        # P - K x' P (symmetric), then the drift.
        self.p00 = max(self.p00 - k0 * px0, 0.0) + self._q0
        self.p01 = self.p01 - k0 * px1
        self.p11 = max(self.p11 - k1 * px1, 0.0) + self._q1
        self.observations += 1
        return True


def _clamp(value: float, prior: float, bound: float) -> float:
    low, high = prior / bound, prior * bound
    return low if value < low else high if value > high else value
