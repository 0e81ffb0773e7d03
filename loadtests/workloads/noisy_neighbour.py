"""`noisy-neighbour`: several tenants share the fleet and one offers far more than its share.

Each tenant has a weight: its share of the offered requests is weight / sum of weights, so in an
open-loop run at R requests/s tenant i offers R x share_i requests/s, and in a closed loop it holds
about share_i of the slots. The fair share is 1 / tenants. Each request's tenant is drawn, seeded,
by weight; the spec carries `tenant` and the tenant's `api_key` (sent as a bearer token, which is how
the gateway tells tenants apart). A fair gateway keeps the quiet tenants' latency near what they would
see alone while the noisy one absorbs the queueing.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from loadtests.workloads.spec import Endpoint, RequestSpec, check_positive, request_body
from loadtests.workloads.text import WordText


@dataclass(frozen=True, slots=True)
class TenantShare:
    """A tenant's relative offered load (`weight` > 0) and API key (default `sk-<name>`)."""

    name: str
    weight: float
    api_key: str | None = None

    def key(self) -> str:
        return self.api_key if self.api_key is not None else f"sk-{self.name}"


DEFAULT_TENANTS: tuple[TenantShare, ...] = (
    TenantShare("noisy", 7.0),
    TenantShare("quiet-a", 1.0),
    TenantShare("quiet-b", 1.0),
    TenantShare("quiet-c", 1.0),
)  # the noisy tenant offers 70% of the requests against a fair share of 25%


class NoisyNeighbourWorkload:
    """`requests` requests from `tenants`; lengths in tokens; unique prompts (no prefix sharing, so
    only admission and queueing differ between policies). `request_id` is `nn-<i>`, `group` is the
    tenant's name."""

    name = "noisy-neighbour"

    def __init__(
        self,
        *,
        requests: int,
        prompt_tokens: int,
        output_tokens: int,
        model: str,
        tenants: Sequence[TenantShare] = DEFAULT_TENANTS,
        seed: int = 0,
        endpoint: Endpoint = "chat",
    ) -> None:
        check_positive(requests=requests, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
        if len(tenants) < 2 or len({t.name for t in tenants}) != len(tenants):
            raise ValueError("noisy-neighbour needs at least two tenants with distinct names")
        for t in tenants:
            check_positive(**{f"weight of tenant {t.name!r}": t.weight})
        self.tenants = list(tenants)
        total = sum(t.weight for t in tenants)
        self.shares = [t.weight / total for t in tenants]
        self.n_requests = requests
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.model = model
        self.seed = seed
        self.endpoint: Endpoint = endpoint
        self._cumulative = list(itertools.accumulate(self.shares))
        self._text = WordText()

    def size(self) -> int:
        return self.n_requests

    def requests(self) -> Iterator[RequestSpec]:
        rng = random.Random(f"noisy-neighbour:{self.seed}")
        last = len(self.tenants) - 1
        keys = [t.key() for t in self.tenants]
        for i in range(self.n_requests):
            t = min(bisect.bisect_right(self._cumulative, rng.random()), last)
            tenant = self.tenants[t]
            prompt = self._text.text(rng, self.prompt_tokens)
            yield RequestSpec(
                request_id=f"nn-{i}",
                endpoint=self.endpoint,
                body=request_body(self.endpoint, self.model, None, prompt, self.output_tokens),
                tenant=tenant.name,
                api_key=keys[t],
                group=tenant.name,
            )

    def describe(self) -> dict[str, Any]:
        fair = 1.0 / len(self.tenants)
        return {
            "workload": self.name,
            "tenants": [
                {
                    "name": t.name,
                    "weight": t.weight,
                    "offered_share": round(s, 6),
                    "fair_share": round(fair, 6),
                }
                for t, s in zip(self.tenants, self.shares, strict=True)
            ],
            "requests": self.n_requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "model": self.model,
            "endpoint": self.endpoint,
            "seed": self.seed,
        }
