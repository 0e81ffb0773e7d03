"""Checks beyond the schema, and the one way a command loads a config.

`load_checked` is what every command (`serve`, `up`, `check-config`) calls: the schema
(`gateway.config`) and then `check_semantics`, so what `check-config` accepts is exactly what the
server starts with, and no command can skip a check again.
"""

from __future__ import annotations

from pathlib import Path

from gateway.config import Config, ConfigError, load_config, parse_config


def load_checked(path: str | Path | None) -> Config:
    """The config at `path` (None: the empty config, every default), schema- and semantics-checked.
    Raises ConfigError listing each problem as `path: reason`; reads nothing else, starts nothing."""
    config = parse_config({}) if path is None else load_config(path)
    check_semantics(config)
    return config


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
