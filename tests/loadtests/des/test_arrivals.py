from __future__ import annotations

import itertools
import random

from loadtests.des.arrivals import LoadClients
from loadtests.runner import LoadConfig, inter_arrival_gaps
from loadtests.workloads.spec import RequestSpec

INF = float("inf")


def spec(rid: str, session: str | None = None) -> RequestSpec:
    return RequestSpec(request_id=rid, endpoint="chat", body={}, session_id=session)


def specs(n: int) -> list[RequestSpec]:
    return [spec(str(i)) for i in range(n)]


def ids(sends: list[tuple[RequestSpec, float]]) -> list[str]:
    return [s.request_id for s, _ in sends]


def test_closed_loop_starts_one_request_per_client_and_replaces_each_that_ends() -> None:
    clients = LoadClients(specs(6), LoadConfig(concurrency=4, duration_s=INF))
    first = clients.start(0.0)
    assert ids(first) == ["0", "1", "2", "3"] and {t for _, t in first} == {0.0}
    assert clients.in_flight == 4
    assert clients.finished(first[2][0], 1.5) == [(spec("4"), 1.5)]
    assert ids(clients.finished(first[0][0], 2.0)) == ["5"]
    assert clients.finished(first[1][0], 2.5) == [] and clients.in_flight == 3
    assert clients.dispensed == 6


def test_closed_loop_max_requests_and_deadline() -> None:
    clients = LoadClients(specs(100), LoadConfig(concurrency=2, duration_s=10.0, max_requests=3))
    a, b = clients.start(0.0)
    assert ids(clients.finished(a[0], 1.0)) == ["2"]
    assert clients.finished(b[0], 2.0) == []  # max_requests reached
    clients = LoadClients(specs(100), LoadConfig(concurrency=1, duration_s=10.0))
    (a,) = clients.start(0.0)
    assert clients.finished(a[0], 10.0) == []  # nothing starts at or after duration_s


def test_sessions_go_one_at_a_time_and_a_waiting_client_sends_when_its_session_frees() -> None:
    turns = [spec("c1-t1", "c1"), spec("c1-t2", "c1"), spec("c1-t3", "c1")]
    clients = LoadClients(turns, LoadConfig(concurrency=2, duration_s=INF))
    first = clients.start(0.0)
    assert ids(first) == ["c1-t1"]  # the second client waits: only c1's later turns remain
    assert ids(clients.finished(first[0][0], 1.0)) == ["c1-t2"]
    second = clients.finished(spec("c1-t2", "c1"), 2.0)
    assert ids(second) == ["c1-t3"] and clients.in_flight == 1


def test_open_loop_arrivals_use_the_live_runners_seeded_gaps() -> None:
    load = LoadConfig(rate=50.0, burstiness=0.5, duration_s=INF, seed=3)
    clients = LoadClients(specs(20), load)
    times: list[float] = []
    while clients.next_arrival is not None and len(times) < 10:
        now = clients.next_arrival
        times += [t for _, t in clients.arrive(now)]
    gaps = inter_arrival_gaps(random.Random("arrivals:3"), 50.0, 0.5)
    expected = list(itertools.accumulate(itertools.islice(gaps, 9), initial=0.0))
    assert times == expected


def test_open_loop_beyond_max_in_flight_waits_with_its_clock_running() -> None:
    clients = LoadClients(specs(5), LoadConfig(rate=10.0, duration_s=INF, max_in_flight=2))
    sent: list[tuple[RequestSpec, float]] = []
    arrivals = []
    for _ in range(4):
        assert clients.next_arrival is not None
        arrivals.append(clients.next_arrival)
        sent += clients.arrive(clients.next_arrival)
    assert ids(sent) == ["0", "1"] and clients.in_flight == 2
    later = clients.finished(sent[0][0], 5.0)
    assert later == [(spec("2"), arrivals[2])]  # its start is its arrival, not when it got through


def test_open_loop_stops_at_the_deadline_and_when_specs_run_out() -> None:
    clients = LoadClients(specs(100), LoadConfig(rate=1000.0, duration_s=0.01))
    n = 0
    while clients.next_arrival is not None:
        assert clients.next_arrival < 0.01
        n += len(clients.arrive(clients.next_arrival))
    assert 0 < n < 100
    clients = LoadClients(specs(2), LoadConfig(rate=1.0, duration_s=INF))
    assert ids(clients.arrive(0.0)) == ["0"]
    assert clients.next_arrival is not None
    assert ids(clients.arrive(clients.next_arrival)) == ["1"]
    assert clients.next_arrival is not None
    assert clients.arrive(clients.next_arrival) == [] and clients.next_arrival is None
