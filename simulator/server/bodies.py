"""Non-streaming response bodies, shaped like vLLM 0.32's (it adds fields beyond OpenAI's)."""

from __future__ import annotations

import orjson

from simulator.server.sse import SYSTEM_FINGERPRINT


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, object]:
    return {
        "prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def chat_body(response_id: str, created: int, model: str, text: str, finish_reason: str,
              stop_reason: str | None, usage_: dict[str, object]) -> bytes:
    return orjson.dumps({
        "id": response_id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": None, "annotations": None,
                        "audio": None, "function_call": None, "reasoning": None},
            "logprobs": None, "finish_reason": finish_reason, "stop_reason": stop_reason, "token_ids": None,
        }],
        "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT, "usage": usage_,
        "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None,
    })


def completion_body(response_id: str, created: int, model: str, text: str, finish_reason: str,
                    stop_reason: str | None, usage_: dict[str, object]) -> bytes:
    return orjson.dumps({
        "id": response_id, "object": "text_completion", "created": created, "model": model,
        "choices": [{
            "index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
            "stop_reason": stop_reason, "prompt_logprobs": None, "prompt_token_ids": None, "token_ids": None,
        }],
        "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT, "usage": usage_,
        "kv_transfer_params": None,
    })
