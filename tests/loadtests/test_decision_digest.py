"""The decision digest is a function of the decisions: the same run twice agrees, another policy not."""

from loadtests.decision_digest import digest


def test_the_digest_is_reproducible_and_sees_the_policy() -> None:
    first = digest("default", tokens=1024, replicas=4, decisions=40, seed=3)
    assert first == digest("default", tokens=1024, replicas=4, decisions=40, seed=3)
    assert first != digest("predicted-latency", tokens=1024, replicas=4, decisions=40, seed=3)
