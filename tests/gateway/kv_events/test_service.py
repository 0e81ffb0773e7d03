"""Which replicas get a KV-event subscriber, from where, and when: the config's endpoints, replicas
joining, moving and leaving, a reload, and the engine's capacity once scraped."""

from __future__ import annotations

import pytest

from gateway.config import Config, ConfigError, FleetConfig, parse_config
from gateway.fleet.membership import ReplicaSpec
from gateway.fleet.metrics_parse import ReplicaMetrics
from gateway.fleet.state import FleetState
from gateway.kv_events.endpoints import KvEndpoints, resolve
from gateway.kv_events.service import KvEvents
from tests.gateway.kv_events.publisher import FakePublisher
from tests.gateway.stack import wait_for

MODEL = "tiny"


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"kv_events": "http://h:5557"}, "replicas.0.kv_events: must be a tcp://host:port address"),
        ({"kv_events": "tcp://*:5557"}, "replicas.0.kv_events: needs a host kvgate can connect to"),
        ({"kv_events": "tcp://h"}, "replicas.0.kv_events: needs a port"),
        ({"kv_events": "tcp://h:5557/x"}, "replicas.0.kv_events: must be tcp://host:port and nothing more"),
        ({"kv_events_replay": "tcp://h:5558"}, "kv_events_replay: needs kv_events"),
    ],
)
def test_the_config_refuses_endpoints_kvgate_cannot_connect_to(entry: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"replicas": [{"url": "http://h:8000", "model": MODEL, **entry}]})
    assert problem in str(err.value)


def test_the_config_refuses_a_bad_pool_port() -> None:
    with pytest.raises(ConfigError, match=r"models\.0\.kv_events\.port"):
        parse_config({"models": [{"name": MODEL, "kv_events": {"port": 70000}}]})


def test_a_replicas_own_endpoints_win_and_others_get_the_pools_at_their_host() -> None:
    config = parse_config(
        {
            "models": [{"name": MODEL, "kv_events": {"port": 5557, "replay_port": 5558, "topic": "kv"}}],
            "replicas": [{"url": "http://a:8000", "model": MODEL, "kv_events": "tcp://pub-a:7000"}],
        }
    )
    own = ReplicaSpec.from_config(config.replicas[0])
    assert resolve(own, MODEL, config) == KvEndpoints("tcp://pub-a:7000", None, "kv")
    found = ReplicaSpec("d", "http://10.0.0.7:8000", MODEL, source="dns")
    assert resolve(found, MODEL, config) == KvEndpoints("tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558", "kv")
    v6 = ReplicaSpec("d6", "http://[fd00::7]:8000", MODEL, source="kubernetes")
    assert resolve(v6, MODEL, config) == KvEndpoints("tcp://[fd00::7]:5557", "tcp://[fd00::7]:5558", "kv")
    assert resolve(found, "another-pool", config) is None
    assert resolve(found, "", config) is None  # its pool is not known yet


def _config(pub: FakePublisher) -> Config:
    assert pub.replay_endpoint is not None
    port = int(pub.endpoint.rsplit(":", 1)[1])
    replay = int(pub.replay_endpoint.rsplit(":", 1)[1])
    return parse_config({"models": [{"name": MODEL, "kv_events": {"port": port, "replay_port": replay}}]})


async def test_replicas_are_subscribed_as_they_join_and_forgotten_as_they_leave() -> None:
    async with FakePublisher() as p1, FakePublisher() as p2:
        config = _config(p1)
        fleet = FleetState([], FleetConfig())
        kv = KvEvents(config, fleet)
        await kv.start()
        try:
            fleet.apply({"d1": ReplicaSpec("d1", "http://127.0.0.1:9", MODEL, source="dns")})
            await p1.wait_subscribed()
            assert kv.index.replicas() == ("d1",)
            assert kv.mode("d1", 0.0) == "approximate"  # no tokenizer in this pool, and no events yet

            fleet.record_scrape("d1", ReplicaMetrics(0, 0, 0.0, block_size=16, num_gpu_blocks=321))
            assert kv.index.capacity("d1") == 321

            new = _config(p2)
            step = kv.prepare(config, new)
            step.commit()
            assert step.settle is not None
            await step.settle()
            await p2.wait_subscribed()  # the pool's endpoints changed: subscribed anew
            feed = kv.feed("d1")
            assert feed is not None and feed.index.capacity("d1") == 321

            fleet.apply({})
            assert kv.feed("d1") is None and kv.index.replicas() == ()
        finally:
            await kv.stop()


async def test_a_replica_that_moves_is_a_new_engine() -> None:
    async with FakePublisher() as p1:
        fleet = FleetState([], FleetConfig())
        kv = KvEvents(_config(p1), fleet)
        await kv.start()
        try:
            fleet.apply({"d1": ReplicaSpec("d1", "http://127.0.0.1:9", MODEL, source="dns")})
            await p1.wait_subscribed()
            first = kv.feed("d1")
            fleet.apply({"d1": ReplicaSpec("d1", "http://127.0.0.1:10", MODEL, source="dns")})
            await wait_for(lambda: kv.feed("d1") is not first and kv.feed("d1") is not None)
        finally:
            await kv.stop()
