"""Checks beyond the schema, and the one way a command loads a config.

`load_checked` is what every command (`serve`, `up`, `check-config`) calls: the schema
(`gateway.config`) and then `check_semantics`, so what `check-config` accepts is exactly what the
server starts with, and no command can skip a check again. `config_warnings` names settings that
work but weaken something (e.g. TLS verification off).
"""

from __future__ import annotations

from pathlib import Path

from gateway.config import Config, ConfigError, config_from_text, load_config, parse_config


def load_checked(path: str | Path | None) -> Config:
    """The config at `path` (None: the empty config, every default), schema- and semantics-checked.
    Raises ConfigError listing each problem as `path: reason`; reads nothing else, starts nothing."""
    config = parse_config({}) if path is None else load_config(path)
    check_semantics(config)
    return config


def checked_from_text(text: str, source: str) -> Config:
    """`load_checked` for a file's text already read (a reload reads the bytes it hashes)."""
    config = config_from_text(text, source)
    check_semantics(config)
    return config


def check_semantics(config: Config) -> None:
    """Raise ConfigError (`path: reason`) for what pydantic cannot see: plugin types, profile names,
    an unreadable `upstream.tls_ca_file`, a `models[].tokenizer` directory without a usable tokenizer
    (both read here, from disk)."""
    from gateway.routing import profile_specs
    from gateway.upstream.tls import client_tls_context
    from policies.scheduling.registry import build_profile

    problems: list[str] = []
    specs = profile_specs(config)
    for name, spec in specs.items():
        try:
            build_profile(spec)
        except ValueError as err:
            problems.append(f"scheduling.profiles.{name}: {err}")
    if config.scheduling.profile not in specs:
        problems.append(
            f"scheduling.profile: no profile named {config.scheduling.profile!r} "
            f"(known: {', '.join(sorted(specs))})"
        )
    for i, m in enumerate(config.models):
        if m.tokenizer not in ("none", "sim"):
            from gateway.hf_tokenizer import load_tokenizer_dir  # tokenizers and jinja2: only when named

            try:
                load_tokenizer_dir(m.tokenizer)
            except ValueError as err:
                problems.append(f"models.{i}.tokenizer: {err}")
    if config.upstream.tls_ca_file is not None:
        try:
            client_tls_context(config.upstream.tls_ca_file)
        except ValueError as err:
            problems.append(f"upstream.tls_ca_file: {err}")
    if problems:
        raise ConfigError("\n".join(problems))


def config_warnings(config: Config) -> list[str]:
    """Settings that are allowed but weaken something, one `path: what it means` line each."""
    warnings = []
    tenants = {t.name for t in config.tenants}
    for i, r in enumerate(config.routes):
        for where, names in (("override_tenants", r.override_tenants), ("tenant_targets", r.tenant_targets)):
            unknown = sorted(set(names) - tenants)
            if unknown:
                warnings.append(
                    f"routes[{i}].{where}: no tenant named {', '.join(map(repr, unknown))} in this config "
                    "(it applies only once such a tenant exists)"
                )
    if not config.upstream.tls_verify:
        warnings.append(
            "upstream.tls_verify is false: https:// replicas' certificates and host names are not "
            "checked, so anyone on the network path can pose as a replica"
        )
    return warnings
