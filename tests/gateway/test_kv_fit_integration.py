"""Placement that respects KV capacity over real loopback HTTP (issue #11's case, small).

Two simulated replicas of 64 blocks of 32 tokens (2,048 tokens each), 12 prefix groups whose system
prompts together need about 0.75x of the two replicas' KV: with the `kv-fit` profile the groups
end 6 and 6 (each replica's usable 80% fits 6, not 7), every group's requests go to its home, and the
replicas really hit their caches.
"""

from __future__ import annotations

import collections
import random

from loadtests.workloads.text import WordText
from policies.kv_fit import group_key
from tests.gateway.stack import MODEL, stack

GROUPS = 12
_TEXT = WordText()


def system(group: int) -> str:
    # 256 of the simulator's tokens (8 engine blocks) a group shares, at about 4 bytes per token: the
    # gateway's estimate, so about 4 of its 64-token (256-byte) index blocks.
    return _TEXT.text(random.Random(f"kv-fit-{group}"), 256)


def body(group: int, question: str) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system(group)}, {"role": "user", "content": question}],
        "max_tokens": 2,
    }


async def test_twelve_groups_end_six_and_six_and_stay_home() -> None:
    config = {"scheduling": {"profile": "kv-fit"}, "flow_control": {"enabled": False}}
    async with stack(replicas=2, config=config, block_size=32, kv_blocks=64, max_num_seqs=16,
                     max_model_len=1024) as s:  # fmt: skip
        router = s.gateway.router
        served: dict[int, list[str]] = collections.defaultdict(list)
        cached: dict[int, list[int]] = collections.defaultdict(list)
        # Every group's first request while the replicas are idle (today a hash of the prompt then
        # decides), then three rounds of every group.
        for round_ in range(4):
            for g in range(GROUPS):
                r = await s.client.post("/v1/chat/completions", json=body(g, f"question {round_} of {g}?"))
                assert r.status_code == 200, r.text
                served[g].append(r.headers["x-kvgate-replica"])
                cached[g].append(r.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))
        per_replica = collections.Counter(router.groups.groups_on(n) for n in ("r0", "r1"))
        assert sorted((router.groups.groups_on(n) for n in ("r0", "r1")), reverse=True) == [6, 6], per_replica
        facts = [router.prompt_facts("chat", body(g, "?"), MODEL, None) for g in range(GROUPS)]
        homes = [router.groups.home_of(group_key(f.prefix_keys, router.groups.group_blocks)) for f in facts]
        for g in range(GROUPS):
            assert served[g][-2:] == [homes[g]] * 2, (g, served[g], homes[g])
            # ... and the home really held the group's prefix: 7 of its 8 blocks at least.
            assert cached[g][-1] >= 7 * 32, (g, cached[g])
