"""`random`: unique prompts with nothing shared, the control case.

Prefix-aware routing has nothing to find here, so it should not help and must not hurt: kvgate's
default profile must stay within a few percent of least-loaded routing. Prompt lengths are fixed or,
with `length_jitter` j in [0, 1), uniform in [(1 - j) x prompt_tokens, (1 + j) x prompt_tokens];
output lengths likewise with `output_jitter` (fixed outputs make requests started together finish
together, the worst case for anyone waiting for a slot).
Each prompt starts with its request number (`Req <i>.`), so no two share even a first block whatever the seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from loadtests.workloads.spec import Endpoint, RequestSpec, check_positive, request_body
from loadtests.workloads.text import WordText, word_tokens


class RandomWorkload:
    """`requests` unique prompts; lengths in tokens; `request_id` is `rnd-<i>`."""

    name = "random"

    def __init__(
        self,
        *,
        requests: int,
        prompt_tokens: int,
        output_tokens: int,
        model: str,
        length_jitter: float = 0.0,
        output_jitter: float = 0.0,
        seed: int = 0,
        endpoint: Endpoint = "chat",
    ) -> None:
        check_positive(requests=requests, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
        for name, j in (("length_jitter", length_jitter), ("output_jitter", output_jitter)):
            if not 0.0 <= j < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {j}")
        self.n_requests = requests
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.model = model
        self.length_jitter = length_jitter
        self.output_jitter = output_jitter
        self.seed = seed
        self.endpoint: Endpoint = endpoint
        self._text = WordText()

    def size(self) -> int:
        return self.n_requests

    def requests(self) -> Iterator[RequestSpec]:
        rng = random.Random(f"random:{self.seed}")
        low = max(1, round(self.prompt_tokens * (1 - self.length_jitter)))
        high = max(low, round(self.prompt_tokens * (1 + self.length_jitter)))
        for i in range(self.n_requests):
            tokens = rng.randint(low, high) if high > low else low
            out = self.output_tokens
            if self.output_jitter:  # drawn only when asked, so older seeds replay unchanged
                j = self.output_jitter
                out = rng.randint(max(1, round(out * (1 - j))), max(1, round(out * (1 + j))))
            # The tag makes the first block unique; "Req", " <i>" and "." are its tokens.
            tag_tokens = 2 + word_tokens(str(i), leading_space=True)
            prompt = f"Req {i}." + self._text.text(rng, max(0, tokens - tag_tokens), leading_space=True)
            yield RequestSpec(
                request_id=f"rnd-{i}",
                endpoint=self.endpoint,
                body=request_body(self.endpoint, self.model, None, prompt, out),
            )

    def describe(self) -> dict[str, Any]:
        return {
            "workload": self.name,
            "requests": self.n_requests,
            "prompt_tokens": self.prompt_tokens,
            "length_jitter": self.length_jitter,
            "output_jitter": self.output_jitter,
            "output_tokens": self.output_tokens,
            "model": self.model,
            "endpoint": self.endpoint,
            "seed": self.seed,
        }
