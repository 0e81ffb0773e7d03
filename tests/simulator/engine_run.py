"""Drive an `Engine` in virtual time for tests: no sleeping, the clock is a float we advance."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from simulator.engine import Engine, EngineRequest, EngineStats, FinishedRequest, StepResult


@dataclass
class Run:
    """Everything a run produced, in step order."""

    steps: list[StepResult] = field(default_factory=list)
    stats_after: list[EngineStats] = field(default_factory=list)
    finished: dict[str, FinishedRequest] = field(default_factory=dict)
    token_indexes: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    end: float = 0.0

    def first_token_step(self, request_id: str) -> int:
        return next(i for i, s in enumerate(self.steps) if any(t.request_id == request_id for t in s.tokens))


def run(
    engine: Engine,
    now: float = 0.0,
    *,
    arrivals: Sequence[tuple[float, EngineRequest]] = (),
    after_step: Callable[[Engine, StepResult], None] | None = None,
    max_steps: int = 100_000,
) -> Run:
    """Step until nothing is left and every arrival (time, request) has been added at its time."""
    pending = sorted(arrivals, key=lambda a: a[0])
    out = Run()
    for _ in range(max_steps):
        while pending and pending[0][0] <= now:
            engine.add_request(pending.pop(0)[1], now)
        if not engine.has_unfinished():
            if not pending:
                out.end = now
                return out
            now = pending[0][0]
            continue
        result = engine.step(now)
        assert result.start == now and result.end == now + result.duration
        if result.duration == 0:
            assert not result.tokens and not result.finished
            assert pending, "engine stalled with work left and nothing arriving"
            now = pending[0][0]
            continue
        now = result.end
        out.steps.append(result)
        out.stats_after.append(engine.stats)
        for t in result.tokens:
            out.token_indexes[t.request_id].append(t.index)
        for f in result.finished:
            out.finished[f.request_id] = f
        if after_step is not None:
            after_step(engine, result)
    raise AssertionError(f"engine did not finish in {max_steps} steps")


def request(
    request_id: str, prompt: list[int], max_tokens: int = 4, *, adapter: str | None = None, priority: int = 0
) -> EngineRequest:
    return EngineRequest(request_id, list(prompt), max_tokens, adapter=adapter, priority=priority)


def distinct_prompt(seed: int, length: int) -> list[int]:
    """`length` token ids no other seed shares (the values are arbitrary; the engine never decodes them)."""
    base = 1_000_000 * (seed + 1)
    return list(range(base, base + length))
