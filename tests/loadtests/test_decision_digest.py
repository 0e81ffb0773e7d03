"""The decision digest is a function of the decisions: the same run twice agrees, another policy not."""

from loadtests.decision_digest import digest


def test_the_digest_is_reproducible_and_sees_the_policy() -> None:
    first = digest("default", tokens=1024, replicas=4, decisions=40, seed=3)
    assert first == digest("default", tokens=1024, replicas=4, decisions=40, seed=3)
    assert first != digest("predicted-latency", tokens=1024, replicas=4, decisions=40, seed=3)


def test_the_digest_runs_the_latency_knee_filter_as_a_gateway_with_the_gate_on() -> None:
    # The default knee (the gate on, the gateway's default) drops replicas in this cell; without it
    # the latency-knee filter keeps every candidate, so the two digests differ.
    assert digest("default", tokens=1024, replicas=4, decisions=40, seed=3) != digest(
        "default", tokens=1024, replicas=4, decisions=40, seed=3, knee=None
    )
