"""Which settings a reload may change while kvgate runs, and which need a restart.

Every setting is listed in one of the two tables below, by dotted path; a path covers everything
under it (`tenants` covers each tenant's keys and limits). A reload that changes any restart-only
setting is refused as a whole, naming each one and why; nothing is changed. A path in neither table
(a setting added without being classified here) counts as restart-only: a reload must never accept a
change that nothing applies. tests/gateway/test_reload_scope.py checks that every setting of `Config`
is classified.

Hot settings are taken by the component named beside each (its `prepare`, gateway/reload.py) or read
per request from the config snapshot. Restart-only ones are built into something long-lived at start:
the listening socket and its protocol, the logging set-up, the upstream connection pools, the
scraper, the prefix index's block size, the rate-limit store.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

HOT: Mapping[str, str] = {
    "server.max_body_bytes": "read per request",
    "server.debug_headers": "read per request",
    "server.drain_propagation_s": "read when a drain begins",
    "server.drain_timeout_s": "read when a drain begins",
    "server.watch_config": "read by the config watch at each look",
    "server.watch_config_interval_s": "read by the config watch at each look",
    "models": "replica credentials, tokenizers (a new tokenizer re-keys the pool's prefix picture), KV-event "
    "endpoints (a replica whose endpoints change is subscribed anew: its exact picture starts over)",
    "replicas": "discovery (the static list), KV-event endpoints",
    "discovery": "discovery (sources restarted when their settings change)",
    "scheduling.profile": "router",
    "scheduling.profiles": "router",
    "scheduling.session_header": "read per request",
    "tenants": "tenant registry (buckets and quota counters keep their levels: keyed by name; the admin "
    "API's live changes are laid over the new file again)",
    "routes": "routes (back to the file's weights: runtime overrides dropped on every gateway, logged)",
    "auth": "tenant registry",
    "flow_control.saturation": "admission queue",
    "flow_control.fair_share": "admission queue",
    "flow_control.bands": "admission queue (a request already waiting keeps its deadline)",
    "flow_control.max_queue": "admission queue",
    "flow_control.max_queue_per_tenant": "admission queue",
    "flow_control.pass_priority": "tenancy",
    "flow_control.retry_after_fallback_s": "admission queue",
    "flow_control.predicted_admission": "admission queue (the latency gate, read at each decision), "
    "router (the `latency-knee` filter)",
    "flow_control.knee_factor": "admission queue, router (the `latency-knee` filter)",
    "flow_control.solo_knee_factor": "admission queue",
    "flow_control.light_knee_factor": "admission queue",
    "flow_control.light_reserve": "admission queue",
    "headroom": "read at each /metrics scrape and GET /admin/pools (the default mix: until a pool's first "
    "answer)",
}

RESTART_ONLY: Mapping[str, str] = {
    "server.host": "the listen address",
    "server.port": "the listen address",
    "server.header_timeout_s": "built into the listener's protocol at start",
    "server.body_timeout_s": "built into the listener's protocol at start",
    "server.keep_alive_timeout_s": "built into the listener's protocol at start",
    "server.max_connections": "built into the listener's protocol at start",
    "server.send_timeout_s": "built into the forwarder at start",
    "server.log_level": "logging is set up at start",
    "server.access_log": "logging is set up at start",
    "server.workers": "the worker processes are started at start",
    "upstream": "the upstream connection pools and the forwarder are built at start",
    "fleet": "the scraper and the fleet state are built at start",
    "simulator": "the simulated fleet was started with it",
    "scheduling.prefix_index": "the prefix indexes keep their blocks across a reload; the KV-event "
    "subscribers are built with its timeouts",
    "scheduling.seed": "the random source is seeded at start",
    "state": "the rate-limit store is built with it at start",
    "ledger": "the usage ledger and its store are built at start",
    "flow_control.enabled": "flow control is switched on or off at start",
}

UNCLASSIFIED = "not known to be reloadable"


def classify(path: str) -> tuple[bool, str]:
    """(hot, why) for a dotted setting path: the longest table entry that is the path or a parent of
    it decides; none -> restart-only, UNCLASSIFIED."""
    best, hot, why = -1, False, UNCLASSIFIED
    for table, is_hot in ((HOT, True), (RESTART_ONLY, False)):
        for prefix, reason in table.items():
            if (path == prefix or path.startswith(prefix + ".")) and len(prefix) > best:
                best, hot, why = len(prefix), is_hot, reason
    return hot, why


def changed_paths(old: BaseModel, new: BaseModel, prefix: str = "") -> list[str]:
    """Dotted paths of the settings that differ between two configs of the same model: a nested
    section is compared field by field, anything else (lists, mappings, optional sections) whole."""
    out: list[str] = []
    for name in type(old).model_fields:
        a, b = getattr(old, name), getattr(new, name)
        if a == b:
            continue
        path = f"{prefix}{name}"
        if isinstance(a, BaseModel) and type(a) is type(b):
            out += changed_paths(a, b, path + ".")
        else:
            out.append(path)
    return out


def restart_needed(old: BaseModel, new: BaseModel) -> list[str]:
    """Each changed restart-only setting as `path (why)`, in the config's order; [] = reloadable."""
    return [f"{p} ({why})" for p in changed_paths(old, new) for hot, why in [classify(p)] if not hot]
