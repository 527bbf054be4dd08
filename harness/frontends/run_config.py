"""One run's settings as one value: built and validated once at each entry point (the
pytest plugin, `corewire run`, a driver program's `init`, `corewire bench`), then passed
whole -- to the driver it builds, to every case's context, to the report labels.

Nothing below the entry points picks a default profile or time scale of its own, and no
setting travels through os.environ: `$COREWIRE_TIMESCALE`, `$COREWIRE_KV_WORKER` and
`$COREWIRE_EC_SCHEDULER` are read here, as user input, and nowhere else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from harness.components import component_slot
from harness.frontends.spec import COMPONENT_KINDS, FrontendSpec
from harness.frontends.table import check_spec, parse_frontend, release_profile
from harness.protocol.timing import DEFAULT, Timescale
from harness.protocol.wire.profiles import (
    VLLM_0_33,
    ProtocolProfile,
    UnknownProfileError,
    get_profile,
)

DEFAULT_UNIT = "reference"  # the component unit when none is named


class RunConfigError(ValueError):
    """A setting a user gave cannot be used; the message is the line to fix."""


@dataclass(frozen=True)
class RunConfig:
    """The settings one frontend runs under.

    `frontend`: its spec. `profile`: the run's --profile (None: the frontend's own).
    `timescale`: the factor of every bound. `component_units`: the unit under test per
    component kind (kv, ec)."""

    frontend: str = "reference"
    profile: ProtocolProfile | None = None
    timescale: Timescale = DEFAULT
    component_units: Mapping[str, str] = field(default_factory=dict)

    @cached_property
    def parsed(self) -> FrontendSpec:
        return parse_frontend(self.frontend)

    @cached_property
    def frontend_profile(self) -> ProtocolProfile:
        """The protocol the frontend speaks: a release-pinned spec's own, else vllm-0.33."""
        return release_profile(self.frontend) or VLLM_0_33

    @property
    def engine_profile(self) -> ProtocolProfile:
        """The protocol the mock engines speak: the run's --profile, else the frontend's."""
        return self.profile or self.frontend_profile

    def component_unit(self, kind: str) -> str:
        """The unit under test of a component kind ("kv", "ec")."""
        return self.component_units.get(kind, DEFAULT_UNIT)

    def for_frontend(self, spec: str) -> RunConfig:
        """The same run's settings for another of its frontends."""
        return dataclasses.replace(self, frontend=spec)

    @classmethod
    def from_options(cls, frontends: Sequence[str], profile: str | None = None,
                     timescale: float | None = None,
                     environ: Mapping[str, str] | None = None) -> RunConfig:
        """Validate a run's options once (RunConfigError: the line to fix) and build its
        settings, for its first frontend (`for_frontend` gives the others')."""
        environ = environ or {}
        for spec in frontends:
            try:
                check_spec(spec)
            except ValueError as exc:
                raise RunConfigError(str(exc)) from None
        try:
            chosen = None if profile is None else get_profile(profile)
        except UnknownProfileError as exc:
            raise RunConfigError(f"--profile: {exc}") from None
        try:
            scale = Timescale.from_user(timescale, environ)
        except ValueError as exc:
            raise RunConfigError(str(exc)) from None
        units: dict[str, str] = {}
        for kind in COMPONENT_KINDS:
            named = {s.argument for s in map(parse_frontend, frontends) if s.kind == kind}
            if len(named) > 1:
                raise RunConfigError(f"one {kind}: component per run, got {sorted(named)}")
            slot = component_slot(kind)
            unit = named.pop() if named else environ.get(slot.env, "").strip()
            if unit:
                try:
                    slot.check(unit)
                except ValueError as exc:
                    raise RunConfigError(str(exc)) from None
                units[kind] = unit
        first = frontends[0] if frontends else "reference"
        return cls(first, chosen, scale, units)
