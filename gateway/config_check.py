"""Checks beyond the schema: do the named scheduling plugins and profiles exist and fit together, can
the TLS CA file be loaded; and warnings about settings that work but weaken something."""

from __future__ import annotations

from gateway.config import Config, ConfigError


def check_semantics(config: Config) -> None:
    """Raise ConfigError (`path: reason`) for what pydantic cannot see: plugin types, profile names,
    an unreadable `upstream.tls_ca_file` (read here, from disk)."""
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
    if not config.upstream.tls_verify:
        warnings.append(
            "upstream.tls_verify is false: https:// replicas' certificates and host names are not "
            "checked, so anyone on the network path can pose as a replica"
        )
    return warnings
