from __future__ import annotations

import orjson

from loadtests.workloads import (
    WORKLOAD_TYPES,
    LoraMixWorkload,
    MultiTurnWorkload,
    NoisyNeighbourWorkload,
    RandomWorkload,
    SharedPrefixWorkload,
    Workload,
)


def test_every_workload_is_registered_by_its_name_and_describes_itself() -> None:
    made: list[Workload] = [
        SharedPrefixWorkload(
            groups=2,
            prompts_per_group=2,
            system_prompt_tokens=10,
            question_tokens=5,
            output_tokens=3,
            model="m",
        ),
        MultiTurnWorkload(
            conversations=2, turns=2, system_prompt_tokens=5, user_tokens=5, output_tokens=3, model="m"
        ),
        LoraMixWorkload(adapters=2, requests=3, prompt_tokens=5, output_tokens=3),
        NoisyNeighbourWorkload(requests=3, prompt_tokens=5, output_tokens=3, model="m"),
        RandomWorkload(requests=3, prompt_tokens=5, output_tokens=3, model="m"),
    ]
    assert sorted(WORKLOAD_TYPES) == sorted(w.name for w in made)
    assert sorted(WORKLOAD_TYPES) == ["lora-mix", "multi-turn", "noisy-neighbour", "random", "shared-prefix"]
    for w in made:
        assert WORKLOAD_TYPES[w.name] is type(w)
        described = w.describe()
        assert described["workload"] == w.name and described["requests"] == w.size() == len(
            list(w.requests())
        )
        orjson.dumps(described)  # JSON-serializable for results.json
        orjson.dumps([s.body for s in w.requests()])
