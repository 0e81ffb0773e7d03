"""Requests in the gateways' admission queues, in virtual time (`DesConfig.flow_control`).

Each gateway model admits a request through the live `AdmissionQueue` (`GatewayModel.admit`) before
routing it. A refused request ends with the gateway's answer (503, 429, 400). A held one waits in its
queue until the queue wakes it: a release, at an ADMIT event at that instant (as the waiter's task
resumes on the next turn of the live event loop), or a refusal; or until its band's `max_wait_s`
passes (a WAIT_END event: 503). A client that leaves while its request waits takes it out of the
queue (`leave`). The queue may wake a request inside the `admit` that queued it (its drain after the
push), so its place is recorded before that call.

Owned by one `Simulation`, which routes what is let through (`dispatch`) and ends what is refused
(`fail`). Not thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

from gateway.admission import Held
from gateway.errors import GatewayError
from loadtests.des.events import EventQueue
from loadtests.des.gateway_model import GatewayModel
from policies.types import RequestInfo

if TYPE_CHECKING:
    from loadtests.des.traces import OpenRequest

Dispatch = Callable[["OpenRequest", GatewayModel, RequestInfo, list[int]], None]
Fail = Callable[["OpenRequest", int, str], None]


class Waiting:
    """A request in a gateway's admission queue: the gateway, the request as it saw it, its prompt's
    token ids, its place (`held`, set once `admit` returns) and whether it was woken (released or
    refused; then an ADMIT event is due)."""

    __slots__ = ("gateway", "held", "ids", "info", "woken")

    def __init__(self, gateway: GatewayModel, info: RequestInfo, ids: list[int]) -> None:
        self.gateway = gateway
        self.info = info
        self.ids = ids
        self.held: Held | None = None
        self.woken = False


def _answer(err: GatewayError) -> str:
    return f"http: {err.status} {err.message}"


class Admissions:
    """The waits of one run's requests (module docstring). `admit_kind`/`wait_end_kind` are the run's
    event kinds whose handlers call `woken` and `wait_end`; `is_open(o)`: `o` has not ended."""

    def __init__(self, queue: EventQueue, admit_kind: int, wait_end_kind: int,
                 is_open: Callable[[OpenRequest], bool], dispatch: Dispatch, fail: Fail) -> None:  # fmt: skip
        self._queue = queue
        self._kinds = (admit_kind, wait_end_kind)
        self._is_open = is_open
        self._dispatch = dispatch
        self._fail = fail

    def enter(
        self, o: OpenRequest, gw: GatewayModel, info: RequestInfo, ids: list[int],
        headers: Mapping[str, str] | None,
    ) -> bool:  # fmt: skip
        """Admit `o` on `gw` (its flow control on): True when it may be routed now (`o.admitted` is
        set), False when it waits or was refused (then it has ended)."""
        o.wait = wait = Waiting(gw, info, ids)  # before `admit`: it may be woken inside it
        try:
            held = gw.admit(info, partial(self._wake, o, wait), headers)
        except GatewayError as err:
            o.wait = None
            self._fail(o, err.status, _answer(err))
            return False
        if held is not None:
            wait.held = held
            self._queue.push(self._queue.now + held.max_wait_s, self._kinds[1], o)
            return False
        o.wait = None
        o.admitted = (gw, info)
        return True

    def _wake(self, o: OpenRequest, wait: Waiting, refused: GatewayError | None) -> bool:
        if wait.woken or o.wait is not wait:
            return False
        wait.woken = True
        self._queue.push(self._queue.now, self._kinds[0], (o, refused))
        return True

    def woken(self, o: OpenRequest, refused: GatewayError | None) -> None:
        """The ADMIT event of `o`: route it (released) or end it (refused)."""
        wait = o.wait
        if wait is None or wait.held is None or not self._is_open(o):
            return  # it left while the wake was on its way (`leave` ended the wait)
        o.wait = None
        gw, held = wait.gateway, wait.held
        assert gw.admission is not None
        if refused is not None:
            gw.admission.end_wait(held, False, "cancelled")
            self._fail(o, refused.status, _answer(refused))
            return
        gw.admission.end_wait(held, True, "dispatched")
        o.admitted = (gw, wait.info)
        self._dispatch(o, gw, wait.info, wait.ids)

    def wait_end(self, o: OpenRequest) -> None:
        """The WAIT_END event of `o`: still waiting, it is refused (503, Retry-After)."""
        wait = o.wait
        if wait is None or wait.woken or wait.held is None or not self._is_open(o):
            return  # released, or it left, before its band's max wait
        o.wait = None
        admission = wait.gateway.admission
        assert admission is not None
        err = admission.timed_out(wait.held)
        admission.end_wait(wait.held, False, "timeout")
        self._fail(o, err.status, _answer(err))

    @staticmethod
    def leave(o: OpenRequest) -> None:
        """The client of `o` left: if it waits (or was woken and not yet routed), its wait ends."""
        wait = o.wait
        if wait is not None and wait.held is not None:
            o.wait = None
            admission = wait.gateway.admission
            assert admission is not None
            admission.end_wait(wait.held, wait.woken, "cancelled")
