"""Scheduling: filters -> weighted scorers in [0, 1] -> picker, over a fleet snapshot.

Build a profile once (`build_profile(spec)` or `build_builtin_profile("default")`), then per request
make a `SchedulingContext` and call `profile.schedule(ctx, candidates, rng)`. Plugin types live in
`registry.PLUGIN_TYPES`; the contracts in `contracts`.
"""

from policies.scheduling.builtin_profiles import (
    BUILTIN_PROFILE_NAMES,
    build_builtin_profile,
    builtin_profile_spec,
)
from policies.scheduling.context import SchedulingContext
from policies.scheduling.profile import Decision, SchedulingProfile, WeightedScorer
from policies.scheduling.registry import PLUGIN_TYPES, PluginType, build_profile

__all__ = [
    "BUILTIN_PROFILE_NAMES",
    "PLUGIN_TYPES",
    "Decision",
    "PluginType",
    "SchedulingContext",
    "SchedulingProfile",
    "WeightedScorer",
    "build_builtin_profile",
    "build_profile",
    "builtin_profile_spec",
]
