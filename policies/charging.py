"""What a finished request is charged: the rule behind token buckets, quotas and the usage ledger.

- the replica reported usage: `prompt_tokens + completion_tokens`, 1 request;
- no usage, but a replica was working on it (the stream broke, or the client left mid-stream or
  while the replica was prefilling): the best estimate, prompt tokens (the admission estimate, exact
  with a tokenizer) + one token per SSE event relayed (the role chunk counts as one, so this may
  over-charge by one), at most the output cap reserved (a replica cannot make a request cost more
  than it could produce), 1 request, marked `estimated`;
- a replica answered an error status itself (4xx/5xx passed through): 0 tokens, 1 request;
- it never reached a replica, or every attempt failed before any answer (kvgate answered 502/503/504
  itself, or the client left before dispatch): 0 tokens and 0 requests: the tenant got no service,
  and its retries during an outage must not eat its limits or quotas.

Inputs are plain values (the gateway reads them off its usage and forwarding records): `status` is
the HTTP status the replica answered (0: none yet), `attempts` the replicas tried, `error_kind` why
the last attempt failed (None: it did not), `events` the SSE events relayed, `output_cap` the output
tokens the request reserved (None: no cap).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Charge:
    """`requests` (0 or 1) and `tokens` charged; `tokens` = `prompt_tokens + output_tokens`.
    `cached_tokens` (part of the prompt the replica served from its cache) is reported, not charged
    apart. `estimated`: the replica sent no usage, so the tokens are kvgate's estimate."""

    requests: int
    tokens: int
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    estimated: bool = False


NOTHING = Charge(0, 0)


def charge(
    prompt_estimate: int,
    usage: tuple[int, int, int] | None,
    *,
    attempts: int,
    status: int,
    error_kind: str | None,
    events: int,
    output_cap: int | None = None,
) -> Charge:
    """The charge for one request; `usage` is the replica's (prompt, completion, cached) tokens."""
    if usage is not None:
        prompt, completion, cached = usage
        return Charge(1, prompt + completion, prompt, completion, cached)
    if attempts == 0:
        return NOTHING
    if status == 0:
        if error_kind is not None:
            return NOTHING
        return Charge(1, prompt_estimate, prompt_estimate, 0, 0, True)
    if status == 200:
        output = events if output_cap is None else min(events, output_cap)
        return Charge(1, prompt_estimate + output, prompt_estimate, output, 0, True)
    return Charge(1, 0)
