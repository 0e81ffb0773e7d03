"""policies/route_choice: override permission, sticky sources in order, the tenant's own split, the
mirror draw."""

from __future__ import annotations

import pytest

from policies.route_choice import (
    OverrideNotAllowed,
    Route,
    StickySource,
    UnknownTarget,
    choose_target,
    forced_target,
    mirror_sampled,
    sticky_key,
)
from policies.traffic_split import Split, bucket_of, route_key

BASE, V2, V3 = "llama-3-8b", "llama-3-8b:chat-v2", "llama-3-8b:chat-v3"


def route(**kw: object) -> Route:
    values: dict[str, object] = {
        "name": "chat",
        "split": Split.fresh([BASE, V2], [90, 10]),
        "tenant_splits": {"acme": Split.fresh([BASE, V2], [50, 50]), "solo": Split.fresh([V3], [1])},
        "override_tenants": frozenset({"qa"}),
        "mirror": V3,
        "mirror_percent": 5.0,
        "fallback": BASE,
    }
    values.update(kw)
    return Route(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("header:x-session-id", StickySource("header", b"x-session-id")),
        ("header:X-Session-ID", StickySource("header", b"x-session-id")),
        ("user", StickySource("user")),
        ("api_key", StickySource("api_key")),
        ("tenant", StickySource("tenant")),
    ],
)
def test_sticky_sources_parse(spec: str, expected: StickySource) -> None:
    assert StickySource.parse(spec) == expected


@pytest.mark.parametrize("spec", ["header:", "header: x", "cookie", "header:a:b", "User", ""])
def test_bad_sticky_sources_are_refused_with_the_forms_allowed(spec: str) -> None:
    with pytest.raises(ValueError, match="expected 'header:<name>', 'user', 'api_key' or 'tenant'"):
        StickySource.parse(spec)


SOURCES = tuple(StickySource.parse(s) for s in ("header:x-session-id", "user", "api_key"))


@pytest.mark.parametrize(
    ("headers", "user", "api_key", "expected"),
    [
        ({b"x-session-id": b"s1"}, "u1", b"k1", b"s1"),  # first present wins
        ({}, "u1", b"k1", b"u1"),
        ({b"x-session-id": b""}, "u1", b"k1", b"u1"),  # empty counts as absent
        ({}, "", b"k1", b"k1"),
        ({}, 42, b"k1", b"k1"),  # a `user` that is not a string is not a key
        ({}, None, None, None),  # none present: per request
    ],
)
def test_sticky_key_takes_the_first_source_present(
    headers: dict[bytes, bytes], user: object, api_key: bytes | None, expected: bytes | None
) -> None:
    assert sticky_key(SOURCES, headers.get, user, api_key, "acme") == expected


def test_tenant_as_a_sticky_source() -> None:
    assert sticky_key((StickySource("tenant"),), {}.get, None, None, "acme") == b"acme"


def test_sticky_choice_is_the_key_bucket_in_the_tenants_split_or_the_routes() -> None:
    r = route()
    key = b"session-7"
    bucket = bucket_of(route_key("chat"), key)
    assert choose_target(r, "anyone", key, 0.0) == (r.split.target(bucket), "sticky")
    assert choose_target(r, "acme", key, 0.0) == (r.tenant_splits["acme"].target(bucket), "sticky")
    assert choose_target(r, "solo", key, 0.0) == (V3, "sticky")


@pytest.mark.parametrize(("draw", "target"), [(0.0, BASE), (0.8999, BASE), (0.9, V2), (0.9999, V2)])
def test_without_a_key_the_draw_picks(draw: float, target: str) -> None:
    assert choose_target(route(), "anyone", None, draw) == (target, "random")


@pytest.mark.parametrize(
    ("tenant", "value", "outcome"),
    [
        ("qa", V2, V2),
        ("qa", V3, V3),  # the mirror may be forced too: that is how QA tries it before it gets weight
        ("qa", BASE, BASE),
        ("qa", "llama-3-8b:other", UnknownTarget),
        ("qa", "chat", UnknownTarget),
        ("acme", V2, OverrideNotAllowed),  # not allowed, whatever the value
        ("acme", "nonsense", OverrideNotAllowed),
    ],
)
def test_override_needs_permission_and_a_target_of_the_route(
    tenant: str, value: str, outcome: str | type[Exception]
) -> None:
    if isinstance(outcome, str):
        assert forced_target(route(), tenant, value) == outcome
    else:
        with pytest.raises(outcome):
            forced_target(route(), tenant, value)


def test_unknown_target_message_lists_what_may_be_forced() -> None:
    with pytest.raises(UnknownTarget, match=f"expected one of: {BASE}, {V2}, {V3}"):
        forced_target(route(), "qa", "x")


def test_targets_are_every_split_and_the_fallback_once_each() -> None:
    assert route().targets() == (BASE, V2, V3)
    assert route(tenant_splits={}, fallback=None, mirror=None).targets() == (BASE, V2)


@pytest.mark.parametrize(("percent", "draw", "sampled"), [(5, 0.0, True), (5, 0.0499, True), (5, 0.05, False),
                                                          (0, 0.0, False), (100, 0.9999, True)])  # fmt: skip
def test_mirror_sampling(percent: float, draw: float, sampled: bool) -> None:
    assert mirror_sampled(route(mirror_percent=percent), draw) is sampled
    assert mirror_sampled(route(mirror=None, mirror_percent=percent), draw) is False


def test_a_new_split_makes_a_new_route_and_leaves_the_old_one_alone() -> None:
    r = route()
    r2 = r.with_splits(r.split.reweighted([80, 20]), r.tenant_splits)
    assert r.split.weights == (90, 10) and r2.split.weights == (80, 20)
    assert r2.prefix == r.prefix and r2.mirror == r.mirror and r2.override_tenants == r.override_tenants


def test_mirror_percent_is_checked() -> None:
    with pytest.raises(ValueError, match="mirror percent"):
        route(mirror_percent=101)
