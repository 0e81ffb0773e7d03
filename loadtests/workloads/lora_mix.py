"""`lora-mix`: requests spread over several LoRA adapters with Zipf-skewed popularity.

Adapter i (0-based, in the order given) is picked with probability proportional to 1 / (i + 1)^s
(`zipf_s`; s = 0 is uniform, s = 1 the classic Zipf). The request's `model` is the adapter's name,
which is how vLLM selects an adapter. Run it on replicas with fewer adapter slots (`--max-loras`)
than adapters: routing that keeps an adapter where it is already loaded avoids load delays and
batch splits. Prompts are unique; an optional per-adapter system prompt (`system_prompt_tokens`)
adds prefix sharing within an adapter.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterator, Sequence
from typing import Any

from loadtests.workloads.spec import Endpoint, RequestSpec, check_positive, request_body
from loadtests.workloads.text import WordText


def zipf_weights(n: int, s: float) -> list[float]:
    """Probabilities of ranks 0..n-1 under Zipf with exponent `s` (>= 0); they sum to 1."""
    check_positive(n=n)
    if s < 0:
        raise ValueError(f"zipf exponent must be >= 0, got {s}")
    raw = [1.0 / (i + 1) ** s for i in range(n)]
    total = sum(raw)
    return [w / total for w in raw]


class LoraMixWorkload:
    """`requests` chat/completion requests over `adapters` (names, most popular first, or a count n
    for `lora-0` ... `lora-<n-1>`). Lengths in tokens. `group` is the adapter name; `request_id` is
    `lora-<i>`."""

    name = "lora-mix"

    def __init__(
        self,
        *,
        adapters: Sequence[str] | int,
        requests: int,
        prompt_tokens: int,
        output_tokens: int,
        zipf_s: float = 1.0,
        system_prompt_tokens: int = 0,
        base_model: str | None = None,
        seed: int = 0,
        endpoint: Endpoint = "chat",
    ) -> None:
        names = [f"lora-{i}" for i in range(adapters)] if isinstance(adapters, int) else list(adapters)
        if not names or len(set(names)) != len(names):
            raise ValueError("adapters must be at least one distinct name")
        check_positive(requests=requests, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
        if system_prompt_tokens < 0:
            raise ValueError(f"system_prompt_tokens must be >= 0, got {system_prompt_tokens}")
        self.adapters = names
        self.popularity = zipf_weights(len(names), zipf_s)
        self.zipf_s = zipf_s
        self.n_requests = requests
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.system_prompt_tokens = system_prompt_tokens
        self.base_model = base_model
        self.seed = seed
        self.endpoint: Endpoint = endpoint
        self._cumulative = list(itertools.accumulate(self.popularity))
        self._text = WordText()

    def size(self) -> int:
        return self.n_requests

    def requests(self) -> Iterator[RequestSpec]:
        rng = random.Random(f"lora-mix:{self.seed}")
        systems: list[str | None] = [
            self._text.text(rng, self.system_prompt_tokens) if self.system_prompt_tokens else None
            for _ in self.adapters
        ]
        last = len(self.adapters) - 1
        for i in range(self.n_requests):
            a = min(bisect.bisect_right(self._cumulative, rng.random()), last)
            adapter = self.adapters[a]
            prompt = self._text.text(rng, self.prompt_tokens)
            yield RequestSpec(
                request_id=f"lora-{i}",
                endpoint=self.endpoint,
                body=request_body(self.endpoint, adapter, systems[a], prompt, self.output_tokens),
                group=adapter,
            )

    def describe(self) -> dict[str, Any]:
        return {
            "workload": self.name,
            "adapters": self.adapters,
            "popularity": {a: round(p, 6) for a, p in zip(self.adapters, self.popularity, strict=True)},
            "zipf_s": self.zipf_s,
            "requests": self.n_requests,
            "prompt_tokens": self.prompt_tokens,
            "system_prompt_tokens": self.system_prompt_tokens,
            "output_tokens": self.output_tokens,
            "base_model": self.base_model,
            "endpoint": self.endpoint,
            "seed": self.seed,
        }
