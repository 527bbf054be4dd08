"""How long a stateful run searches: the default, the "nightly" profile, the env overrides.

Nothing here runs at import. The "nightly" hypothesis profile is registered when someone
asks for it: `register_profiles()` (the replay pytest plugin calls it before hypothesis
reads ``--hypothesis-profile``), or `stateful_settings()` when HYPOTHESIS_PROFILE names it.
"""

from __future__ import annotations

import os
from typing import Any

import hypothesis

from harness.protocol.timing import Timescale

EXAMPLES_ENV = "COREWIRE_STATEFUL_EXAMPLES"
STOP_STRINGS_ENV = "COREWIRE_STATEFUL_STOP_STRINGS"  # "0": requests never carry stop strings
DEFAULT_EXAMPLES = 200
DEFAULT_STEPS = 50
NIGHTLY = "nightly"


def register_profiles() -> None:
    """Register the "nightly" profile (5000 examples of 100 steps); idempotent."""
    hypothesis.settings.register_profile(
        NIGHTLY, max_examples=5000, stateful_step_count=100, deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck))


def stateful_settings(*, max_examples: int | None = None, step_count: int | None = None,
                      **overrides: Any) -> hypothesis.settings:
    """Settings for a stateful run: 200 examples, or the nightly profile, or the env's count.

    Precedence: explicit `max_examples` > $COREWIRE_STATEFUL_EXAMPLES > the "nightly"
    profile (HYPOTHESIS_PROFILE=nightly or --hypothesis-profile=nightly) > 200.
    """
    profile = os.environ.get("HYPOTHESIS_PROFILE") or hypothesis.settings.get_current_profile_name()
    if profile == NIGHTLY:
        register_profiles()
        base = hypothesis.settings.get_profile(NIGHTLY)
    else:
        base = hypothesis.settings(hypothesis.settings.default, max_examples=DEFAULT_EXAMPLES,
                                   stateful_step_count=DEFAULT_STEPS)
    examples = base.max_examples
    if os.environ.get(EXAMPLES_ENV):
        examples = int(os.environ[EXAMPLES_ENV])
    if max_examples is not None:
        examples = max_examples
    # No explain phase: it re-runs a failure many times to annotate a report the replay file
    # already gives, and it costs several times the search and the shrink together.
    phases = [p for p in base.phases if p is not hypothesis.Phase.explain]
    values: dict[str, Any] = {"phases": phases, "deadline": None,
                              "suppress_health_check": list(hypothesis.HealthCheck)}
    values.update(overrides)
    return hypothesis.settings(base, max_examples=examples,
                               stateful_step_count=step_count or base.stateful_step_count,
                               **values)


def stateful_timescale() -> Timescale:
    """The time scale of a stateful run ($COREWIRE_TIMESCALE, read with the run's other
    settings); the socket world scales its bounds by it."""
    return Timescale.from_environment(os.environ)


def stop_strings_enabled() -> bool:
    return os.environ.get(STOP_STRINGS_ENV, "1") not in ("", "0", "false", "no")
