"""From a parsed request to a ranked list of replicas: prefix keys, index match, profile, record.

The I/O-free work of `policies/` glued to the gateway's live state (fleet snapshot, prefix index,
session map). Runs on the request path: everything that can be built once is built in `__init__`.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.config import Config
from gateway.reload import ReloadStep
from gateway.tokenizers import Tokenizer, tokenizer_for
from policies.prefix import byte_block_keys, seed_for, token_block_keys
from policies.prefix_index import PrefixIndex
from policies.prefix_source import PrefixSource
from policies.prompt_text import batch_prompts, canonical_chat_bytes, canonical_completion_bytes
from policies.scheduling.builtin_profiles import BUILTIN_PROFILE_NAMES, builtin_profile_spec
from policies.scheduling.context import SchedulingContext
from policies.scheduling.profile import Decision, SchedulingProfile
from policies.scheduling.registry import build_profile
from policies.tenancy import estimate_prompt_tokens, estimate_tokens
from policies.types import FleetSnapshot, RequestInfo

SESSION_MAP_SIZE = 100_000


@dataclass(frozen=True, slots=True)
class PromptFacts:
    """What the prompt tells the gateway: estimated size and prefix block keys."""

    prompt_tokens: int
    exact: bool
    prefix_keys: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Routed:
    decision: Decision
    match: Mapping[str, int]  # leading index blocks each candidate was believed to hold


def profile_specs(config: Config) -> dict[str, Mapping[str, Any]]:
    """Built-in profiles, overridden or extended by the config's `scheduling.profiles`."""
    specs: dict[str, Mapping[str, Any]] = {n: builtin_profile_spec(n) for n in BUILTIN_PROFILE_NAMES}
    for name, p in config.scheduling.profiles.items():
        specs[name] = p.model_dump(exclude_none=True)
    return specs


def _build_profiles(config: Config) -> dict[str, SchedulingProfile]:
    """Every profile of `config`, built; ValueError for an unknown active profile or a bad plugin."""
    specs = profile_specs(config)
    if config.scheduling.profile not in specs:
        raise ValueError(f"scheduling.profile: no profile named {config.scheduling.profile!r}")
    return {n: build_profile(s) for n, s in specs.items()}


class Router:
    """Owns the prefix index and the session map; one per Gateway, one event loop.

    `index` replaces the approximate `PrefixIndex` the router builds from `scheduling.prefix_index`
    (any `PrefixSource`: the discrete-event mode gives each simulated gateway its own, and an exact,
    event-fed source can stand in for it).
    """

    def __init__(self, config: Config, rng: random.Random, index: PrefixSource | None = None) -> None:
        sched = config.scheduling
        self._config = config
        self.profiles: dict[str, SchedulingProfile] = _build_profiles(config)
        self.profile = self.profiles[sched.profile]
        self.profile_name = sched.profile
        self.index_block_tokens = sched.prefix_index.block_tokens
        self.index: PrefixSource = index if index is not None else PrefixIndex(
            default_capacity=max(1, sched.prefix_index.default_capacity_tokens // self.index_block_tokens)
        )
        self._rng = rng
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._sequence = 0
        self._stale_after = config.fleet.stale_after_s
        self._in_flight_cap = _in_flight_cap(config)
        self._tokenizers: dict[str, Tokenizer | None] = {
            m.name: tokenizer_for(m.tokenizer) for m in config.models
        }

    def prepare(self, old: Config, new: Config) -> ReloadStep:
        """Reload (gateway/reload.py): the profiles and the active one, the pools' tokenizers. The
        prefix index and the session map are kept (`scheduling.prefix_index` needs a restart); a
        profile chosen with `use_profile` gives way to the file's. Raises ValueError for a profile
        that does not build."""
        profiles = _build_profiles(new)
        tokenizers = {m.name: tokenizer_for(m.tokenizer) for m in new.models}
        name = new.scheduling.profile

        cap = _in_flight_cap(new)

        def commit() -> None:
            self._config = new
            self._in_flight_cap = cap
            self.profiles = profiles
            self.profile = profiles[name]
            self.profile_name = name
            self._tokenizers = tokenizers

        return ReloadStep(commit)

    def use_profile(self, name: str) -> None:
        """Switch the active profile (benchmarks compare policies on one running gateway). An unknown
        name is a ValueError, as in the constructor, and leaves the active profile as it was."""
        profile = self.profiles.get(name)
        if profile is None:
            raise ValueError(f"no profile named {name!r} (known: {', '.join(sorted(self.profiles))})")
        self.profile = profile
        self.profile_name = name

    def prompt_facts(
        self, endpoint: str, body: Mapping[str, Any], base: str, adapter: str | None
    ) -> PromptFacts:
        """Prompt tokens (exact with a tokenizer, else estimated) and prefix block keys. A completions
        batch counts the tokens of every prompt but is keyed on its first: the batch goes to one
        replica, and its first prompt decides where the shared prefix lives."""
        tok = self._tokenizers.get(base)
        seed = seed_for(base, adapter)
        batch = None if endpoint == "chat" else batch_prompts(body["prompt"])
        if tok is not None:
            if endpoint == "chat":
                ids = tok.encode_chat(body["messages"])
            else:
                ids = tok.encode_prompt(body["prompt"] if batch is None else batch[0])
            tokens = len(ids)
            if batch is not None:
                tokens += sum(len(tok.encode_prompt(p)) for p in batch[1:])
            keys = token_block_keys(ids, self.index_block_tokens, seed)
            return PromptFacts(tokens, True, keys)
        if endpoint == "chat":
            data = canonical_chat_bytes(body["messages"])
            tokens = estimate_tokens(len(data))
        else:
            prompt = body["prompt"]
            try:
                data = canonical_completion_bytes(prompt)
                tokens = estimate_tokens(len(data))
            except ValueError:  # token ids beyond 32 bits: still a valid request, hash its JSON...
                data = orjson.dumps(prompt)
                # ... but count its ids (its first prompt's), as for small ids: the JSON text is 3-4
                # times longer, and would reserve that much more and refuse it as too large.
                tokens = estimate_prompt_tokens(prompt if batch is None else batch[0])
            if batch is not None:
                tokens += sum(estimate_prompt_tokens(p) for p in batch[1:])
        keys = byte_block_keys(data, self.index_block_tokens * 4, seed)
        return PromptFacts(tokens, False, keys)

    def decide(self, info: RequestInfo, snapshot: FleetSnapshot, now: float) -> Routed:
        candidates = snapshot.pool(info.base_model)
        names = [r.name for r in candidates]
        match = self.index.match(info.prefix_keys, names) if info.prefix_keys else {}
        self._sequence += 1
        session_replica = self._sessions.get(info.session_id) if info.session_id else None
        ctx = SchedulingContext(
            request=info,
            now=now,
            prefix_match=match,
            prefix_blocks=len(info.prefix_keys),
            session_replica=session_replica,
            sequence=self._sequence,
            stale_after_s=self._stale_after,
            max_in_flight_per_replica=self._in_flight_cap,
        )
        return Routed(self.profile.schedule(ctx, candidates, self._rng), match)

    def dispatched(self, info: RequestInfo, replica: str) -> None:
        """Record that `replica` now holds this prompt's blocks (and this session)."""
        if info.prefix_keys:
            self.index.record(replica, info.prefix_keys)
        if info.session_id:
            sessions = self._sessions
            sessions[info.session_id] = replica
            sessions.move_to_end(info.session_id)
            if len(sessions) > SESSION_MAP_SIZE:
                sessions.popitem(last=False)


def _in_flight_cap(config: Config) -> int | None:
    """What one replica may hold in flight (`in-flight-cap`): flow control's cap, None when it is off."""
    fc = config.flow_control
    return fc.saturation.max_in_flight_per_replica if fc.enabled else None
