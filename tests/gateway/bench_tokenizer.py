"""What a model's own tokenizer (`models[].tokenizer` a directory) costs per request, at ~1k, 8k and 32k
prompt tokens, chat and completion; no network.

    python -m tests.gateway.bench_tokenizer [--rounds 5] [--gil-only]

For each size: `Router.prompt_facts` (what routing runs per request: chat template, encoding, block keys)
and its parts, CPU microseconds per request (the calling thread's, `time.thread_time`: steady on a busy
machine) and wall for the whole; then `Router.prompt_facts_async` as the proxy calls it:
wall per request and the event loop thread's own CPU per request (`time.thread_time` on the loop; a
prompt over `OFF_LOOP_CHARS` is encoded in a worker thread, so the loop only pays the hop), one request
at a time and four at once; and the longest the event loop went without running (a task that yields in
a loop measures the gaps) while four such prompts are tokenized at once, on the loop (sync) and the
async way. Baselines: no tokenizer (`none`, the byte estimate) and the simulator's (`sim`). Last, why
kvgate encodes with `encode_batch_fast` and the library's thread pool off: how fast a pure-Python loop
runs while another thread encodes that way, with the pool on, and with `encode` (which holds the GIL).

The tokenizer is the captured one (tests/fixtures/vllm-0.32-cpu/tiny-llama-tokenizer: byte-level BPE,
2,048 tokens): a model's real vocabulary (32k-256k) changes the per-token cost somewhat. Prompts are
English-like sentences with numbers (the captures' style), not one word repeated (which the BPE's word
cache would make unrealistically cheap). With `--rounds N` every measurement runs N times, round-robin,
and medians are printed. Not a test: numbers, for the report.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from gateway.config import parse_config
from gateway.hf_tokenizer import HfTokenizer, load_tokenizer_dir
from gateway.routing import OFF_LOOP_CHARS, Router
from policies.prefix import seed_for, token_block_keys
from tests.vllm_fixtures import VLLM_FIXTURES

FIXTURE = str(VLLM_FIXTURES / "tiny-llama-tokenizer")
SIZES = (1_000, 8_000, 32_000)
BLOCK = 16  # the default scheduling.prefix_index.block_tokens
WORDS = ("policy", "clause", "applies", "customer", "account", "balance", "statement", "payment",
         "refund", "section", "period", "notice", "written", "company", "service", "days")  # fmt: skip


def text_of(tok: HfTokenizer, tokens: int, seed: int) -> str:
    """English-like text of `tokens` tokens, give or take a sentence (the byte-level pre-tokenizer cuts
    at spaces, so sentences count apart the same as together, to a token or so)."""
    rng = random.Random(seed)
    parts: list[str] = []
    n = 0
    while n < tokens:
        w = [rng.choice(WORDS) for _ in range(5)]
        a, b = rng.randint(1, 999), rng.randint(1, 99)
        sentence = f"{w[0].capitalize()} {w[1]} {a} {w[2]} the {w[3]} of {w[4]} {b}. "
        parts.append(sentence)
        n += len(tok.encode_text(sentence, False))
    return "".join(parts)


def bodies(tok: HfTokenizer, tokens: int) -> dict[str, dict[str, Any]]:
    system = text_of(tok, tokens - 12, tokens)
    return {
        "chat": {"messages": [{"role": "system", "content": system},
                              {"role": "user", "content": "Which clause covers refunds?"}]},
        "completions": {"prompt": system + "Which clause covers refunds?"},
    }  # fmt: skip


def per_call(fn: Callable[[], object], budget_s: float = 0.4) -> tuple[float, float]:
    """Median (wall, CPU of this thread) microseconds of `fn` over as many calls as fit in `budget_s`
    (at least 15). CPU is what a call costs whatever else the machine runs; wall adds the waiting."""
    fn()
    walls: list[float] = []
    cpus: list[float] = []
    end = time.perf_counter() + budget_s
    while len(walls) < 15 or time.perf_counter() < end:
        t, c = time.perf_counter(), time.thread_time()
        fn()
        cpus.append(time.thread_time() - c)
        walls.append(time.perf_counter() - t)
    return statistics.median(walls) * 1e6, statistics.median(cpus) * 1e6


async def async_cost(
    router: Router, endpoint: str, body: dict[str, Any], at_once: int
) -> tuple[float, float]:
    """(wall us, event-loop-thread CPU us) per request through prompt_facts_async, `at_once` at a time."""
    calls = max(8, 64 // at_once)
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        await asyncio.gather(*(router.prompt_facts_async(endpoint, body, "m", None) for _ in range(at_once)))
    n = calls * at_once
    return (time.perf_counter() - wall) / n * 1e6, (time.thread_time() - cpu) / n * 1e6


async def longest_stall(router: Router, endpoint: str, body: dict[str, Any], off_loop: bool) -> float:
    """The longest the event loop went without running, in ms, while 4 such prompts are tokenized."""
    gaps: list[float] = []
    done = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async def one() -> None:
        if off_loop:
            await router.prompt_facts_async(endpoint, body, "m", None)
        else:
            await asyncio.sleep(0)
            router.prompt_facts(endpoint, body, "m", None)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    await asyncio.gather(*(one() for _ in range(4)))
    done = True
    await task
    return max(gaps) * 1e3


def gil_share(tok: HfTokenizer, text: str, how: str) -> float:
    """How fast a pure-Python loop runs on this thread while another thread encodes `text` over and
    over, relative to running alone (1.0: encoding takes nothing from it). `how`: "encode", the
    tokenizers library's single-text call; "fast", encode_batch_fast as kvgate runs it (the library's
    thread pool off); "fast+pool", the same with its thread pool on (the library's default)."""
    rust = tok._tok
    fast = how != "encode"
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if how == "fast+pool" else "false"

    def spin(seconds: float) -> int:
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            n += 1
        return n

    alone = spin(1.0)
    stop = threading.Event()

    def encode() -> None:
        while not stop.is_set():
            if fast:
                rust.encode_batch_fast([text], add_special_tokens=False)
            else:
                rust.encode(text, add_special_tokens=False)

    worker = threading.Thread(target=encode)
    worker.start()
    try:
        return spin(1.0) / alone
    finally:
        stop.set()
        worker.join()
        if saved is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def router(tokenizer: str) -> Router:
    cfg = parse_config({"replicas": [{"url": "http://m:1", "model": "m", "name": "r0"}],
                        "models": [{"name": "m", "tokenizer": tokenizer}]})  # fmt: skip
    return Router(cfg, random.Random(1))


async def measure_one(
    tok: HfTokenizer, routers: dict[str, Router], endpoint: str, body: dict[str, Any]
) -> dict[str, float]:
    hf = routers["hf"]
    out: dict[str, float] = {"tokens": hf.prompt_facts(endpoint, body, "m", None).prompt_tokens}
    if endpoint == "chat":
        template = tok._template(False)
        text = template.render(body["messages"], body, tok.special_tokens)
        out["chars"] = sum(len(m["content"]) for m in body["messages"])
        _, out["render"] = per_call(lambda: template.render(body["messages"], body, tok.special_tokens))
    else:
        text = body["prompt"]
        out["chars"] = len(text)
    for name, r in routers.items():
        wall, out[f"facts {name}"] = per_call(lambda r=r: r.prompt_facts(endpoint, body, "m", None))  # type: ignore[misc]
        if name == "hf":
            out["facts hf wall"] = wall
    _, out["encode"] = per_call(lambda: tok.encode_text(text, False))
    ids = tok.encode_text(text, False)
    seed = seed_for("m", None)
    _, out["keys"] = per_call(lambda: token_block_keys(ids, BLOCK, seed))
    for at_once in (1, 4):
        out[f"async wall x{at_once}"], out[f"async loop cpu x{at_once}"] = await async_cost(
            hf, endpoint, body, at_once
        )
    out["stall sync"] = await longest_stall(hf, endpoint, body, off_loop=False)
    out["stall async"] = await longest_stall(hf, endpoint, body, off_loop=True)
    return out


async def measure(tok: HfTokenizer, routers: dict[str, Router]) -> dict[tuple[int, str, str], float]:
    out: dict[tuple[int, str, str], float] = {}
    for size in SIZES:
        for endpoint, body in bodies(tok, size).items():
            for name, value in (await measure_one(tok, routers, endpoint, body)).items():
                out[(size, endpoint, name)] = value
    return out


def print_gil_shares(tok: HfTokenizer, rounds: int) -> None:
    text = bodies(tok, 32_000)["completions"]["prompt"]
    hows = ("encode", "fast", "fast+pool")
    shares = {how: statistics.median(gil_share(tok, text, how) for _ in range(rounds)) for how in hows}
    print(
        "a Python loop's speed while another thread encodes 32k tokens, against its speed alone: "
        + ", ".join(f"{how} {shares[how]:.2f}" for how in hows)
    )


async def main(rounds: int, gil_only: bool) -> None:
    print(f"load average {os.getloadavg()[0]:.2f}; {rounds} round(s); OFF_LOOP_CHARS={OFF_LOOP_CHARS}")
    tok = load_tokenizer_dir(FIXTURE)
    if gil_only:
        print_gil_shares(tok, rounds)
        return
    routers = {"hf": router(FIXTURE), "none": router("none"), "sim": router("sim")}
    runs = [await measure(tok, routers) for _ in range(rounds)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    tables = [
        ("on the loop, per request: CPU us (wall us for 'hf wall')",
         ["facts hf", "facts hf wall", "render", "encode", "keys", "facts none", "facts sim"]),
        ("prompt_facts_async, per request: wall us and the loop thread's CPU us, 1 and 4 at once; "
         "the loop's longest gap (ms) with 4 at once",
         ["async wall x1", "async loop cpu x1", "async wall x4", "async loop cpu x4", "stall sync",
          "stall async"]),
    ]  # fmt: skip
    for title, cols in tables:
        print(title)
        print(f"{'size':>6} {'endpoint':11} {'tokens':>6} {'chars':>6} " + " ".join(f"{c:>17}" for c in cols))
        for size in SIZES:
            for endpoint in ("chat", "completions"):
                cells = [f"{med.get((size, endpoint, c), float('nan')):17.1f}" for c in cols]
                tokens, chars = med[(size, endpoint, "tokens")], med[(size, endpoint, "chars")]
                print(f"{size:>6} {endpoint:11} {tokens:6.0f} {chars:6.0f} " + " ".join(cells))
    print_gil_shares(tok, rounds)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=1, help="run everything this many times; medians printed")
    p.add_argument("--gil-only", action="store_true", help="only the GIL measurement (the last line)")
    args = p.parse_args()
    asyncio.run(main(args.rounds, args.gil_only))
