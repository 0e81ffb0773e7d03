"""`shared-prefix`: groups of requests that share a long system prompt, each with its own question.

The case prefix-aware routing exists for: a replica that already holds a group's system prompt in its
KV cache skips prefilling it. The effect only shows when the groups' prefixes together are larger than
one replica's KV cache (so cache-blind routing keeps evicting them) yet fit in the fleet's (so routing
each group to "its" replica can keep them all): `size_shared_prefix` chooses the number of groups that
way. With a prefix set that fits one replica, any routing gets the hits and the comparison shows
nothing (napkin.md, "Published routing results").
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from loadtests.workloads.spec import Endpoint, RequestSpec, check_positive, request_body
from loadtests.workloads.text import WordText


@dataclass(frozen=True, slots=True)
class PrefixSizing:
    """The outcome of `size_shared_prefix`; token figures are prompt tokens."""

    groups: int
    system_prompt_tokens: int
    prefix_tokens_total: int
    replica_kv_tokens: int
    replicas: int
    multiple_of_replica: float  # prefix_tokens_total / replica_kv_tokens
    fraction_of_fleet: float  # prefix_tokens_total / (replicas * replica_kv_tokens)


def size_shared_prefix(
    replica_kv_tokens: int,
    replicas: int,
    system_prompt_tokens: int,
    *,
    target_multiple: float = 4.0,
    min_multiple: float = 3.0,
    max_multiple: float = 6.0,
    max_fleet_fraction: float = 0.75,
) -> PrefixSizing:
    """How many groups make the prefixes need `target_multiple` times one replica's KV cache.

    Arithmetic, all in tokens (K = one replica's KV capacity, R = replicas, P = system prompt length):

    - the prefixes together need W = groups x P;
    - cache-blind routing sends every group everywhere, so each replica would need W: with W >= 3K it
      cannot hold them and keeps evicting;
    - prefix-aware routing spreads the groups, so the fleet needs W once: W <= f x R x K, where f
      (`max_fleet_fraction`, 0.75) leaves a quarter of the fleet's KV for the questions and outputs
      of the running requests;
    - the multiple aimed at is m = min(target_multiple, f x R); groups = round(m x K / P) (at least
      1), lowered by one while the result overshoots f x R x K or `max_multiple` x K.

    Example: K = 16,384 (the `tiny` profile), R = 8, P = 1,024: f x R = 6, m = 4, groups = 64,
    W = 65,536 = 4.0 x K = 50% of the fleet.

    Raises ValueError when the fleet is too small (it needs R >= min_multiple / f replicas), when P is
    more than a quarter of K (a replica should hold several groups next to running requests), or when
    no group count lands in [min_multiple, max_multiple] x K within f x R x K.
    """
    check_positive(
        replica_kv_tokens=replica_kv_tokens,
        replicas=replicas,
        system_prompt_tokens=system_prompt_tokens,
        target_multiple=target_multiple,
        max_fleet_fraction=max_fleet_fraction,
    )
    if not 0 < min_multiple <= target_multiple <= max_multiple:
        raise ValueError(
            f"need 0 < min_multiple <= target_multiple <= max_multiple, got "
            f"{min_multiple}, {target_multiple}, {max_multiple}"
        )
    if system_prompt_tokens * 4 > replica_kv_tokens:
        raise ValueError(
            f"a {system_prompt_tokens}-token system prompt is more than a quarter of a replica's KV cache "
            f"({replica_kv_tokens} tokens): use a shorter prompt or a larger replica"
        )
    fleet_room = max_fleet_fraction * replicas * replica_kv_tokens
    if fleet_room < min_multiple * replica_kv_tokens:
        raise ValueError(
            f"a fleet of {replicas} replicas can give prefixes {max_fleet_fraction:.0%} of its KV, "
            f"{max_fleet_fraction * replicas:.2f}x one replica's; prefix routing needs >= {min_multiple}x: "
            f"use at least {math.ceil(min_multiple / max_fleet_fraction)} replicas"
        )
    aim = min(target_multiple, max_fleet_fraction * replicas)
    groups = max(1, round(aim * replica_kv_tokens / system_prompt_tokens))
    limit = min(fleet_room, max_multiple * replica_kv_tokens)
    while groups > 1 and groups * system_prompt_tokens > limit:
        groups -= 1
    total = groups * system_prompt_tokens
    multiple = total / replica_kv_tokens
    if not min_multiple <= multiple <= max_multiple or total > fleet_room:
        raise ValueError(
            f"no group count of {system_prompt_tokens}-token prefixes lands in "
            f"[{min_multiple}, {max_multiple}]x a {replica_kv_tokens}-token replica within the fleet's room "
            f"({fleet_room:.0f} tokens); closest is {groups} groups = {multiple:.2f}x: change the "
            f"system prompt length"
        )
    return PrefixSizing(
        groups=groups,
        system_prompt_tokens=system_prompt_tokens,
        prefix_tokens_total=total,
        replica_kv_tokens=replica_kv_tokens,
        replicas=replicas,
        multiple_of_replica=multiple,
        fraction_of_fleet=total / (replicas * replica_kv_tokens),
    )


class SharedPrefixWorkload:
    """`groups` x `prompts_per_group` requests; each = its group's system prompt + a unique question.

    Lengths are in tokens (see `loadtests.workloads.text`). Requests come in a seeded shuffle of all
    (group, prompt) pairs, so a group's prompts are interleaved with other groups' as real users'
    would be. `request_id` is `sp-<group>-<prompt>`, `group` is `g<group>`.
    """

    name = "shared-prefix"

    def __init__(
        self,
        *,
        groups: int,
        prompts_per_group: int,
        system_prompt_tokens: int,
        question_tokens: int,
        output_tokens: int,
        model: str,
        seed: int = 0,
        endpoint: Endpoint = "chat",
        sizing: PrefixSizing | None = None,
    ) -> None:
        check_positive(
            groups=groups,
            prompts_per_group=prompts_per_group,
            system_prompt_tokens=system_prompt_tokens,
            question_tokens=question_tokens,
            output_tokens=output_tokens,
        )
        self.groups = groups
        self.prompts_per_group = prompts_per_group
        self.system_prompt_tokens = system_prompt_tokens
        self.question_tokens = question_tokens
        self.output_tokens = output_tokens
        self.model = model
        self.seed = seed
        self.endpoint: Endpoint = endpoint
        self.sizing = sizing
        self._text = WordText()

    @classmethod
    def sized(
        cls,
        *,
        replica_kv_tokens: int,
        replicas: int,
        prompts_per_group: int,
        system_prompt_tokens: int,
        question_tokens: int,
        output_tokens: int,
        model: str,
        seed: int = 0,
        endpoint: Endpoint = "chat",
        target_multiple: float = 4.0,
    ) -> SharedPrefixWorkload:
        """A workload whose group count comes from `size_shared_prefix` for this fleet."""
        sizing = size_shared_prefix(
            replica_kv_tokens, replicas, system_prompt_tokens, target_multiple=target_multiple
        )
        return cls(
            groups=sizing.groups,
            prompts_per_group=prompts_per_group,
            system_prompt_tokens=system_prompt_tokens,
            question_tokens=question_tokens,
            output_tokens=output_tokens,
            model=model,
            seed=seed,
            endpoint=endpoint,
            sizing=sizing,
        )

    def size(self) -> int:
        return self.groups * self.prompts_per_group

    def requests(self) -> Iterator[RequestSpec]:
        rng = random.Random(f"shared-prefix:{self.seed}")
        systems = [self._text.text(rng, self.system_prompt_tokens) for _ in range(self.groups)]
        order = [(g, k) for g in range(self.groups) for k in range(self.prompts_per_group)]
        rng.shuffle(order)
        for g, k in order:
            question = self._text.text(rng, self.question_tokens)
            yield RequestSpec(
                request_id=f"sp-{g}-{k}",
                endpoint=self.endpoint,
                body=request_body(self.endpoint, self.model, systems[g], question, self.output_tokens),
                group=f"g{g}",
            )

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "workload": self.name,
            "groups": self.groups,
            "prompts_per_group": self.prompts_per_group,
            "requests": self.size(),
            "system_prompt_tokens": self.system_prompt_tokens,
            "question_tokens": self.question_tokens,
            "output_tokens": self.output_tokens,
            "prefix_tokens_total": self.groups * self.system_prompt_tokens,
            "model": self.model,
            "endpoint": self.endpoint,
            "seed": self.seed,
        }
        if self.sizing is not None:
            out["sizing"] = asdict(self.sizing)
        return out
