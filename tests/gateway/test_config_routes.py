"""routes: and models[].adapters in config: what loads, and each refusal naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import ConfigError, parse_config

BASE = "llama-3-8b"


def cfg(routes: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "models": [{"name": BASE, "adapters": {"chat-v3": "/models/adapters/chat-v3"}}],
        "routes": routes,
        **extra,
    }


def chat(**kw: Any) -> dict[str, Any]:
    return {
        "name": "chat",
        "targets": [{"model": BASE, "weight": 90}, {"model": f"{BASE}:chat-v2", "weight": 10}],
        **kw,
    }


def test_the_issue_example_loads() -> None:
    c = parse_config(
        cfg(
            [
                chat(
                    sticky_by=["header:x-session-id", "user", "api_key"],
                    override_header="x-kvgate-force-target",
                    override_tenants=["qa"],
                    tenant_targets={
                        "acme": [{"model": BASE, "weight": 50}, {"model": f"{BASE}:chat-v2", "weight": 50}]
                    },
                    mirror={"model": f"{BASE}:chat-v3", "percent": 5},
                    fallback=BASE,
                )
            ]
        )
    )
    r = c.routes[0]
    assert r.name == "chat" and [t.weight for t in r.targets] == [90, 10] and r.mirror is not None
    assert r.mirror.percent == 5 and r.mirror.max_in_flight == 8
    m = c.models[0]
    assert m.adapters == {"chat-v3": "/models/adapters/chat-v3"} and m.adapter_load_timeout_s == 30.0


def test_a_base_known_from_the_replicas_is_enough() -> None:
    c = parse_config({"replicas": [{"url": "http://r:8000", "model": "qwen"}],
                      "routes": [{"name": "q", "targets": [{"model": "qwen:a", "weight": 1}]}]})  # fmt: skip
    assert c.routes[0].targets[0].model == "qwen:a"


@pytest.mark.parametrize(
    ("routes", "extra", "message"),
    [
        ([chat(targets=[{"model": "mistral", "weight": 1}])], {},
         "routes[0].targets[0].model: 'mistral' is not a configured base model"),
        ([chat(targets=[{"model": "chat-v2", "weight": 1}])], {},  # a served name is not canonical
         "routes[0].targets[0].model: 'chat-v2' is not a configured base model"),
        ([chat(targets=[{"model": BASE, "weight": 0}])], {},
         "routes[0].targets: the weights must have a positive sum"),
        ([chat(targets=[{"model": BASE, "weight": -1}])], {}, "greater than or equal to 0"),
        ([chat(targets=[{"model": BASE, "weight": 1.5}])], {}, "valid integer"),
        ([chat(targets=[])], {}, "at least 1 item"),
        ([chat(targets=[{"model": BASE, "weight": 1}, {"model": BASE, "weight": 2}])], {},
         "'llama-3-8b' is listed twice"),
        ([chat(name=BASE)], {}, "routes[0].name: 'llama-3-8b' is a base model"),
        ([chat(name="chat-v3")], {}, "routes[0].name: 'chat-v3' is an adapter's name"),
        ([chat(name="llama-3-8b:x")], {}, "routes.0.name: String should match pattern"),
        ([chat(), chat()], {}, "routes[1].name: another route is named 'chat'"),
        ([chat(mirror={"model": "nope", "percent": 5})], {}, "routes[0].mirror.model: 'nope'"),
        ([chat(mirror={"model": BASE, "percent": 101})], {}, "less than or equal to 100"),
        ([chat(fallback="nope:x")], {}, "routes[0].fallback: 'nope:x'"),
        ([chat(sticky_by=["cookie"])], {}, "routes[0].sticky_by[0]: 'cookie': expected"),
        ([chat(override_header="x y")], {}, "routes[0].override_header: 'x y' is not a header name"),
        ([chat(tenant_targets={"acme": [{"model": "nope", "weight": 1}]})], {},
         "routes[0].tenant_targets.acme[0].model: 'nope'"),
        ([chat()], {"tenants": [{"name": "t", "models": ["chat", BASE]}]},
         "tenants[0].models: allows route 'chat' but not its target(s) 'llama-3-8b:chat-v2'"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(routes: list[dict[str, Any]], extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(cfg(routes, **extra))
    assert message in str(err.value)


def test_a_tenant_allowed_the_route_and_its_targets_loads() -> None:
    tenants = [
        {"name": "t", "models": ["chat", "llama-3-8b", "llama-3-8b:*"]},
        {"name": "u", "models": ["llama-3-8b"]},  # not allowed the route at all: nothing to check
    ]
    assert len(parse_config(cfg([chat()], tenants=tenants)).tenants) == 2


@pytest.mark.parametrize(
    ("adapters", "message"), [({"a:b": "/p"}, "without ':'"), ({"a": ""}, "source path is empty")]
)
def test_adapter_sources_are_checked(adapters: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"models": [{"name": BASE, "adapters": adapters}]})
