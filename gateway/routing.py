"""From a parsed request to a ranked list of replicas: prefix keys, index match, profile, record.

The I/O-free work of `policies/` glued to the gateway's live state (fleet snapshot, prefix index,
session map). Runs on the request path: everything that can be built once is built in `__init__`.

Two prefix indexes, per replica. The approximate one (`PrefixIndex`) learns from kvgate's own
dispatches and answers for every replica. A replica whose KV events are in exact mode (`exact`,
gateway/kv_events/) is matched on the exact index too, when the pool has a tokenizer: the
request's tokens cut at that engine's block size and keyed as its events are, so a mixed fleet is
scored replica by replica on the best picture kvgate has of each. Exact counts are engine blocks,
converted to index blocks (tokens / `index_block_tokens`) so one scorer compares both. An exact-mode
replica's figure is the larger of its exact match and the approximate index's (where this gateway
sent the prefix: routing memory, so a home that evicted a prefix's tail keeps its group; see
`Router._exact_match`).
"""

from __future__ import annotations

import asyncio
import random
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway.config import Config
from gateway.config_latency import profile_prior
from gateway.errors import bad_request
from gateway.fleet.state import FleetChange, FleetState
from gateway.reload import ReloadStep
from gateway.tokenizers import PromptNotReproducible, PromptRejected, Tokenizer, prompt_ids, tokenizer_for
from policies.exact_index import ExactIndex
from policies.exact_keys import lazy_request_keys, pack_tokens
from policies.kv_fit import GroupFit, GroupLedger, group_key
from policies.latency.estimator import LatencyEstimator, Prediction
from policies.latency.prior import LatencyPrior
from policies.prefix import TOKEN_ID_BYTES, byte_block_keys, seed_for
from policies.prefix_index import PrefixIndex, capacity_blocks
from policies.prefix_source import PrefixSource
from policies.prompt_text import batch_prompts, canonical_chat_bytes, canonical_completion_bytes
from policies.scheduling.builtin_profiles import BUILTIN_PROFILE_NAMES, builtin_profile_spec
from policies.scheduling.context import SchedulingContext
from policies.scheduling.profile import Decision, SchedulingProfile
from policies.scheduling.registry import build_profile
from policies.scheduling.scorers.kv_fit import KvFitScorer
from policies.scheduling.scorers.predicted_latency import predicted_ttfts
from policies.tenancy import estimate_prompt_tokens, estimate_tokens
from policies.types import FleetSnapshot, ReplicaState, RequestInfo

SESSION_MAP_SIZE = 100_000
# A prompt with more text than this is tokenized in a worker thread when its tokenizer releases the GIL:
# measured 0.55-0.72 us of CPU per character for template, encoding and keys, so a prompt kept on the
# loop costs it at most ~1.5 ms, and one sent off costs it 0.2-0.4 ms for the hop (docs/benchmarks.md).
OFF_LOOP_CHARS = 2048


@dataclass(frozen=True, slots=True)
class PromptFacts:
    """What the prompt tells the gateway: estimated size and prefix block keys."""

    prompt_tokens: int
    exact: bool
    prefix_keys: tuple[int, ...]
    token_bytes: bytes = b""  # the (first) prompt's token ids, packed; b"" without a tokenizer
    cache_salt: str | None = None


@dataclass(frozen=True, slots=True)
class Routed:
    decision: Decision
    match: Mapping[str, float]  # leading index blocks each candidate was believed to hold


class ExactSource(Protocol):
    """What routing needs of the KV-event side (gateway/kv_events/service.py `KvEvents`)."""

    @property
    def index(self) -> ExactIndex: ...

    def exact_block_sizes(self, names: Iterable[str], now: float) -> dict[str, int]: ...

    def dispatched(self, replica: str) -> None: ...


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
        self._knee = _knee_factor(config)
        self._tokenizers: dict[str, Tokenizer | None] = {
            m.name: tokenizer_for(m.tokenizer) for m in config.models
        }
        self.exact: ExactSource | None = None  # set by the Gateway when replicas publish KV events
        # Prefix groups and their homes, for the `kv-fit` scorer; kept only while the active profile
        # has one (`groups_on`), so other profiles pay nothing for it.
        self.groups = GroupLedger()
        self._groups_on = _uses_kv_fit(self.profile)
        self._now = 0.0
        # Per-replica latency models (policies/latency): scorers that predict TTFT read them; every
        # dispatch's prediction and observation go through gateway/latency_store.py.
        self.latency = LatencyEstimator(self.index_block_tokens, *latency_priors(config))

    def prepare(self, old: Config, new: Config) -> ReloadStep:
        """Reload (gateway/reload.py): the profiles and the active one, the pools' tokenizers (one
        loaded from files that have not changed is kept as it is). The prefix index and the session
        map are kept (`scheduling.prefix_index` needs a restart); a profile chosen with `use_profile`
        gives way to the file's. Raises ValueError for a profile that does not build or a tokenizer
        that does not load."""
        profiles = _build_profiles(new)
        tokenizers = {m.name: tokenizer_for(m.tokenizer, self._tokenizers.get(m.name)) for m in new.models}
        name = new.scheduling.profile

        cap = _in_flight_cap(new)
        knee = _knee_factor(new)
        priors = latency_priors(new)

        def commit() -> None:
            self.latency.set_priors(*priors)
            self._config = new
            self._in_flight_cap = cap
            self._knee = knee
            self.profiles = profiles
            self.profile = profiles[name]
            self.profile_name = name
            self._groups_on = _uses_kv_fit(self.profile)
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
        self._groups_on = _uses_kv_fit(profile)

    async def prompt_facts_async(
        self, endpoint: str, body: Mapping[str, Any], base: str, adapter: str | None
    ) -> PromptFacts:
        """`prompt_facts`, in a worker thread when the prompt is long and its tokenizer encodes without
        the GIL (so the event loop goes on meanwhile); on the loop otherwise."""
        tok = self._tokenizers.get(base)
        if tok is not None and tok.releases_gil and _text_chars(endpoint, body) > OFF_LOOP_CHARS:
            return await asyncio.to_thread(self.prompt_facts, endpoint, body, base, adapter)
        return self.prompt_facts(endpoint, body, base, adapter)

    def prompt_facts(
        self, endpoint: str, body: Mapping[str, Any], base: str, adapter: str | None
    ) -> PromptFacts:
        """Prompt tokens (exact with a tokenizer, else estimated) and prefix block keys. A completions
        batch counts the tokens of every prompt but is keyed on its first: the batch goes to one
        replica, and its first prompt decides where the shared prefix lives. A prompt the tokenizer
        cannot reproduce is estimated; one the engine would refuse (its chat template raised) is a
        GatewayError 400. Safe to call from a worker thread: reads only what a reload swaps whole."""
        tok = self._tokenizers.get(base)
        seed = seed_for(base, adapter)
        batch = None if endpoint == "chat" else batch_prompts(body["prompt"])
        if tok is not None:
            try:
                ids = prompt_ids(tok, endpoint, body)
                tokens = len(ids)
                if batch is not None:
                    tokens += sum(len(tok.encode_prompt(p, body)) for p in batch[1:])
            except PromptRejected as err:
                raise bad_request(str(err), "messages" if endpoint == "chat" else "prompt") from None
            except PromptNotReproducible:
                pass  # estimated below, as without a tokenizer
            else:
                packed = pack_tokens(ids)
                keys = byte_block_keys(packed, self.index_block_tokens * TOKEN_ID_BYTES, seed)
                given = body.get("cache_salt")
                salt = given if isinstance(given, str) and given else None
                return PromptFacts(tokens, True, keys, packed, salt)
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
        match: Mapping[str, float] = self.index.match(info.prefix_keys, names) if info.prefix_keys else {}
        if self.exact is not None and info.token_bytes and info.prefix_keys:
            match = self._exact_match(info, names, match, now)
        self._sequence += 1
        self._now = now
        session_replica = self._sessions.get(info.session_id) if info.session_id else None
        fit: GroupFit | None = None
        if self._groups_on and info.prefix_keys:
            per_block = 1.0 / self.index_block_tokens
            capacity = {r.name: r.num_gpu_blocks * r.block_size * per_block for r in candidates}
            fit = self.groups.fit_view(info.prefix_keys, capacity, now)
        ctx = SchedulingContext(
            request=info,
            now=now,
            prefix_match=match,
            prefix_blocks=len(info.prefix_keys),
            session_replica=session_replica,
            sequence=self._sequence,
            stale_after_s=self._stale_after,
            max_in_flight_per_replica=self._in_flight_cap,
            kv_fit=fit,
            latency=self.latency,
            knee_factor=self._knee,
            quotes={},  # the decision's latency quotes: the knee filter's, read again by the scorer
        )
        return Routed(self.profile.schedule(ctx, candidates, self._rng), match)

    def predicted_ttfts(
        self, info: RequestInfo, routed: Routed, now: float, count: int = 2
    ) -> list[tuple[str, float]]:
        """(replica, predicted TTFT in seconds) of the first `count` ranked replicas of `routed`, for
        the debug header: the latency models are asked whatever the profile."""
        ranked = routed.decision.ranked[:count]
        ctx = SchedulingContext(
            request=info, now=now, prefix_match=routed.match, prefix_blocks=len(info.prefix_keys),
            stale_after_s=self._stale_after, latency=self.latency,
        )  # fmt: skip
        return [(r.name, t) for r, t in zip(ranked, predicted_ttfts(ctx, ranked), strict=True)]

    def predict(self, info: RequestInfo, replica: ReplicaState, matched: float, now: float) -> Prediction:
        """The latency ticket of a dispatch of `info` to `replica`, believed to hold `matched` index
        blocks of its prompt (pass it to `LatencyEstimator.dispatched`)."""
        est = self.latency
        return est.predict(
            replica, est.uncached_tokens(info.prompt_tokens, matched), now, self._stale_after,
            prompt_tokens=info.prompt_tokens, output_tokens=info.max_tokens, prefix_keys=info.prefix_keys,
        )  # fmt: skip

    def _exact_match(
        self, info: RequestInfo, names: list[str], approx: Mapping[str, float], now: float
    ) -> Mapping[str, float]:
        """`approx` with the replicas in exact mode matched on the exact index instead, except where
        this gateway's own memory says more: a replica's figure is the larger of what its events
        say it holds and what the approximate index says this gateway sent it (routing memory).

        Why both: under KV pressure the home replica of a prefix evicts the prefix's tail blocks
        between two of its requests. On the exact index alone its match then drops below another
        replica's, the group moves, and from then on two replicas hold partial copies and trade it
        back and forth (docs/benchmarks.md, "Exact vs approximate index under KV pressure (live, one
        gateway)": it lost hits against the approximate index). Keeping the memory, a home that evicted
        part of a prefix keeps its group (the request re-prefills the tail there); one whose events
        show none of the prompt (evicted whole, or reset) is matched at 0 whatever the memory says;
        the exact index still shows prefixes this gateway never sent (other gateways' dispatches)."""
        assert self.exact is not None
        sizes = self.exact.exact_block_sizes(names, now)
        if not sizes:
            return approx
        match = dict(approx)
        groups: dict[int, list[str]] = {}
        for name, size in sizes.items():
            groups.setdefault(size, []).append(name)
        most = float(len(info.prefix_keys))
        per_index_block = 1.0 / self.index_block_tokens
        for size, group in groups.items():
            keys = lazy_request_keys(info.token_bytes, size, info.base_model, info.adapter, info.cache_salt)
            held = self.exact.index.match(keys, tuple(group))
            for name in group:
                blocks = held.get(name, 0)
                # The memory only keeps a home whose events still show the prefix's head (its tail
                # evicted, as engines evict): one the events say holds none of it is matched at 0.
                exact = min(most, blocks * size * per_index_block)
                match[name] = max(match.get(name, 0.0), exact) if blocks else 0.0
        return match

    def dispatched(self, info: RequestInfo, replica: str) -> None:
        """Record that `replica` now holds this prompt's blocks (and this session)."""
        if self.exact is not None:
            self.exact.dispatched(replica)
        if info.prefix_keys:
            if self._groups_on:
                self._record_group(info.prefix_keys, replica)
            self.index.record(replica, info.prefix_keys)
        if info.session_id:
            sessions = self._sessions
            sessions[info.session_id] = replica
            sessions.move_to_end(info.session_id)
            if len(sessions) > SESSION_MAP_SIZE:
                sessions.popitem(last=False)


    def _record_group(self, keys: tuple[int, ...], replica: str) -> None:
        """Tell the group ledger what the index believed `replica` (and the group's home) held."""
        home = self.groups.home_of(group_key(keys, self.groups.group_blocks))
        names = (replica,) if home is None or home == replica else (replica, home)
        held = self.index.match(keys, names)
        on_home = held.get(home, 0) if home is not None and home != replica else 0
        self.groups.record(keys, replica, held.get(replica, 0), self._now, on_home)

    def observe_prefix_counters(self, replica: str, hits_tokens: int, queries_tokens: int) -> None:
        """A scrape's cumulative prefix-cache counters of `replica`: the group ledger compares them
        with the hits kvgate believed it would get there (belief against reality)."""
        if self._groups_on:
            self.groups.observe_counters(replica, hits_tokens, queries_tokens)

    def observe_scrape(self, fleet: FleetState, replica: str, change: FleetChange) -> None:
        """What a scrape of `replica` tells routing: its cumulative prefix-cache counters (METRICS:
        the group ledger's belief against reality) and its KV cache size (CAPACITY: the prefix
        index's bound for it). The gateway and the discrete-event mode both call this."""
        if FleetChange.METRICS in change:
            counters = fleet.prefix_counters(replica)
            if counters is not None:
                self.observe_prefix_counters(replica, *counters)
        if FleetChange.CAPACITY in change:
            state = fleet.snapshot().by_name(replica)
            if state is not None and state.num_gpu_blocks > 0:
                blocks = capacity_blocks(state.num_gpu_blocks, state.block_size, self.index_block_tokens)
                self.index.set_capacity(replica, blocks)

    def forget_replica(self, replica: str) -> None:
        """`replica` left or restarted: nothing kvgate sent it is cached there any more."""
        self.index.remove_replica(replica)
        self.groups.forget_replica(replica)


def _uses_kv_fit(profile: SchedulingProfile) -> bool:
    return any(isinstance(w.scorer, KvFitScorer) for w in profile.weighted_scorers)


def _text_chars(endpoint: str, body: Mapping[str, Any]) -> int:
    """Characters of text in a request's prompt (string contents and text parts; a batch's strings)."""
    if endpoint != "chat":
        prompt = body["prompt"]
        if isinstance(prompt, str):
            return len(prompt)
        return sum(len(p) for p in prompt if isinstance(p, str)) if isinstance(prompt, list) else 0
    total = 0
    for m in body["messages"]:
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            texts = (p.get("text") for p in content if isinstance(p, Mapping))
            total += sum(len(t) for t in texts if isinstance(t, str))
    return total


def latency_priors(config: Config) -> tuple[dict[str, LatencyPrior], LatencyPrior]:
    """Each pool's latency prior (`models[].latency_prior`) and the default for the others: the
    embedded simulated fleet's profile when kvgate runs one (no replicas, no discovery), else
    `LatencyPrior()`'s napkin numbers."""
    priors = {m.name: m.latency_prior.prior() for m in config.models if m.latency_prior is not None}
    if not config.replicas and not config.discovery.configured:
        sim = config.simulator
        try:
            return priors, profile_prior(sim.profile, sim.time_scale)
        except ValueError:  # a profile the embedded fleet will refuse itself, at start
            pass
    return priors, LatencyPrior()


def _in_flight_cap(config: Config) -> int | None:
    """What one replica may hold in flight (`in-flight-cap`): flow control's cap, None when it is off."""
    fc = config.flow_control
    return fc.saturation.max_in_flight_per_replica if fc.enabled else None


def _knee_factor(config: Config) -> float | None:
    """The latency gate's knee for the `latency-knee` filter: `flow_control.knee_factor` while flow
    control and predicted admission are on, None (the filter keeps every candidate) otherwise."""
    fc = config.flow_control
    return fc.knee_factor if fc.enabled and fc.predicted_admission else None
