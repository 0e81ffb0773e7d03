"""Checks beyond the schema: do the named scheduling plugins and profiles exist and fit together."""

from __future__ import annotations

from gateway.config import Config, ConfigError


def check_semantics(config: Config) -> None:
    """Raise ConfigError (`path: reason`) for what pydantic cannot see: plugin types, profile names."""
    from gateway.routing import profile_specs
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
    if problems:
        raise ConfigError("\n".join(problems))
