"""Who sends which request when, in virtual time, with the live load generator's semantics.

`LoadClients` reads a `loadtests.runner.LoadConfig` as `run_load` does, with its seconds taken as
virtual seconds from 0:

- closed loop: `concurrency` clients each send a request at 0 and the next one the instant the
  previous one ends (zero think time, zero network);
- open loop: arrivals from `loadtests.runner.inter_arrival_gaps` with the same seeded rng as the live
  runner (`random.Random(f"arrivals:{seed}")`), so live and simulated runs offer the same gaps; an
  arrival beyond `max_in_flight` open requests waits for one to end and that wait counts in its TTFT,
  as it waits for a connection live;
- specs go through the live runner's `SessionSequencer` (a session's requests one at a time, in
  workload order; `max_requests` counts every request sent): a client or arrival that finds only
  busy sessions waits until one frees;
- no request starts at or after `duration_s`; what runs then is the caller's to drain.

Times are virtual seconds; the load point starts at `start` (its `duration_s` counts from there).

Each method returns the requests to send now as `(spec, start)` pairs; `start` is when the request's
clock starts (its arrival, which is earlier than now only for one that waited for a connection).
Owned by one run; not thread-safe.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Iterator

from loadtests.runner import LoadConfig, inter_arrival_gaps
from loadtests.workloads.sequencer import Hold, SessionSequencer
from loadtests.workloads.spec import RequestSpec

Send = tuple[RequestSpec, float]


class LoadClients:
    """The load generator in virtual time (see the module docstring)."""

    def __init__(self, specs: Iterable[RequestSpec], load: LoadConfig, *, start: float = 0.0) -> None:
        self.load = load
        self._sequencer = SessionSequencer(iter(specs), load.max_requests)
        self._deadline = start + load.duration_s
        self._closed = load.concurrency is not None
        self._gaps: Iterator[float] | None = None
        self.next_arrival: float | None = None  # open loop: when the next arrival is due
        if not self._closed:
            assert load.rate is not None
            rng = random.Random(f"arrivals:{load.seed}")
            self._gaps = inter_arrival_gaps(rng, load.rate, load.burstiness)
            self.next_arrival = start
        self._max_in_flight = load.max_in_flight
        self._in_flight = 0
        self._waiting = 0  # clients (closed) or arrivals (open) waiting for a busy session to free
        self._for_connection: deque[Send] = deque()
        self._stopped = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def dispensed(self) -> int:
        """Specs handed out so far (every one of them is sent)."""
        return self._sequencer.dispensed

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet ended."""
        return self._in_flight

    def start(self, now: float) -> list[Send]:
        """The closed loop's first requests, one per client ([] in the open loop)."""
        out: list[Send] = []
        if self._closed:
            assert self.load.concurrency is not None
            for _ in range(self.load.concurrency):
                self._client_takes(now, out)
        return out

    def arrive(self, now: float) -> list[Send]:
        """The open-loop arrival due at `now`; advances `next_arrival` (None once arrivals end)."""
        out: list[Send] = []
        assert self._gaps is not None
        if self._stopped or now >= self._deadline:
            self.next_arrival = None
            return out
        spec = self._sequencer.take()
        if spec is None:
            self.next_arrival = None
            return out
        if isinstance(spec, RequestSpec):
            self._connect(spec, now, out)
        else:
            self._waiting += 1
        due = now + next(self._gaps)
        self.next_arrival = due if due < self._deadline else None
        return out

    def finished(self, spec: RequestSpec, now: float) -> list[Send]:
        """`spec`'s request ended at `now` (whatever the outcome): what to send next."""
        self._in_flight -= 1
        self._sequencer.finished(spec)
        out: list[Send] = []
        if self._closed:
            # The client that finished asks first (live, its worker loops without yielding); then
            # the clients that were waiting for a session retry.
            self._client_takes(now, out)
            while self._waiting and not self._stopped:
                self._waiting -= 1
                if not self._client_takes(now, out):
                    break
        else:
            while self._waiting and not self._stopped:
                spec_next = self._take(now)
                if spec_next is Hold.WAIT:
                    break
                self._waiting -= 1
                if spec_next is not None:
                    self._connect(spec_next, now, out)
            if self._for_connection and self._in_flight < self._max_in_flight:
                waiting_spec, start = self._for_connection.popleft()
                self._in_flight += 1
                out.append((waiting_spec, start))
        return out

    def stop(self) -> None:
        """Send nothing more (the run is being cut short)."""
        self._stopped = True
        self._sequencer.stop()
        self.next_arrival = None

    def _take(self, now: float) -> RequestSpec | Hold | None:
        if self._stopped or now >= self._deadline:
            if not self._stopped:
                self.stop()
            return None
        return self._sequencer.take()

    def _client_takes(self, now: float, out: list[Send]) -> bool:
        """A closed-loop client asks for its next spec. False when it has to wait for a session."""
        spec = self._take(now)
        if spec is Hold.WAIT:
            self._waiting += 1
            return False
        if spec is not None:
            self._in_flight += 1
            out.append((spec, now))
        return True

    def _connect(self, spec: RequestSpec, start: float, out: list[Send]) -> None:
        if self._in_flight < self._max_in_flight:
            self._in_flight += 1
            out.append((spec, start))
        else:
            self._for_connection.append((spec, start))
