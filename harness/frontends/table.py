"""The frontends corewire can drive: one row per spec kind, the one table a new driver joins.

A row says how its specs look (a whole name, a prefix, or both), how to check one cheaply
before any case runs (nothing heavy imported: vLLM costs seconds), how to build its driver
from a `RunConfig`, and which protocol a release-pinned spec speaks. The grammar of
`--frontend`, its usage line and `make_driver` are all read off the table. A driver's
module is imported only when its row builds one.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.frontends.api import FrontendDriver
from harness.frontends.spec import MUTANT_PREFIX, FrontendSpec, SpecGrammar, lookup, parse_spec
from harness.protocol.wire.profiles import ProtocolProfile, profile_for_release

if TYPE_CHECKING:
    from harness.frontends.run_config import RunConfig

REFERENCE_SUBPROCESS = [sys.executable, "-m", "harness.frontends.subprocess.program"]


def _nothing_to_check(spec: FrontendSpec) -> None:
    """Whole names need no check beyond the grammar."""


def _no_release(spec: FrontendSpec) -> ProtocolProfile | None:
    return None


@dataclass(frozen=True)
class DriverKind:
    """One kind of `--frontend` spec."""

    kind: str  # FrontendSpec.kind: the whole name, or the prefix without its separator
    forms: tuple[str, ...]  # how the usage line shows it
    build: Callable[[FrontendSpec, RunConfig], FrontendDriver]
    whole_name: bool = True  # the bare kind is a spec ("vllm-rs")
    prefix: str | None = None  # "mutant:", "vllm-rs@": the kind with an argument
    check: Callable[[FrontendSpec], None] = _nothing_to_check
    # The protocol the spec's frontend speaks when it is pinned to a vLLM release.
    release_profile: Callable[[FrontendSpec], ProtocolProfile | None] = _no_release


def _reference(spec: FrontendSpec, config: RunConfig) -> FrontendDriver:
    from harness.frontends.reference import ReferenceDriver

    return ReferenceDriver(profile=config.frontend_profile)


def _subprocess(spec: FrontendSpec, config: RunConfig) -> FrontendDriver:
    from harness.frontends.subprocess.driver import SubprocessDriver

    command = shlex.split(spec.argument) if spec.argument else REFERENCE_SUBPROCESS
    return SubprocessDriver(command, name=spec.text)


def _check_command(spec: FrontendSpec) -> None:
    try:
        shlex.split(spec.argument)
    except ValueError as exc:
        raise ValueError(f"frontend {spec.text!r}: cannot split the command ({exc})") from None


def _vllm_rs(spec: FrontendSpec, config: RunConfig) -> FrontendDriver:
    from harness.frontends.vllm_rs.driver import VllmRsDriver
    from harness.frontends.vllm_rs.releases import release_of

    return VllmRsDriver(release=release_of(spec.text) if spec.argument else None)


def _check_release(spec: FrontendSpec) -> None:
    if spec.argument:
        from harness.frontends.vllm_rs.releases import release_of

        release_of(spec.text)  # ReleaseSpecError is a ValueError with the one line


def _rs_release_profile(spec: FrontendSpec) -> ProtocolProfile | None:
    """A `vllm-rs@X` release's own protocol: its Rust decoder refuses any other array
    length, so the engines must speak it (unless the run's --profile says otherwise)."""
    if not spec.argument:
        return None
    from harness.frontends.vllm_rs.releases import release_of

    release = release_of(spec.text)
    return None if release is None else profile_for_release(release.version)


def _vllm_py(spec: FrontendSpec, config: RunConfig) -> FrontendDriver:
    from harness.frontends.vllm_py.driver import VllmPyDriver

    return VllmPyDriver()


def _mutant(spec: FrontendSpec, config: RunConfig) -> FrontendDriver:
    from harness.mutation.registry import make_mutant_driver

    return make_mutant_driver(spec.argument)


def _check_mutant(spec: FrontendSpec) -> None:
    from harness.mutation.registry import runnable_mutants

    lookup(runnable_mutants(), spec.argument, "mutant")


def _component(spec: FrontendSpec, config: RunConfig) -> FrontendDriver:
    from harness.frontends.no_frontend import NoFrontend

    return NoFrontend(spec.text)  # component cases: no frontend involved


def _check_component(spec: FrontendSpec) -> None:
    from harness.components import component_slot

    component_slot(spec.kind).check(spec.argument)


DRIVER_KINDS: tuple[DriverKind, ...] = (
    DriverKind("reference", ("reference",), _reference),
    DriverKind("reference-subprocess", ("reference-subprocess",), _subprocess),
    DriverKind("vllm-rs", ("vllm-rs", "vllm-rs@X"), _vllm_rs, prefix="vllm-rs@",
               check=_check_release, release_profile=_rs_release_profile),
    DriverKind("vllm-py", ("vllm-py",), _vllm_py),
    DriverKind("subprocess", ("subprocess:'CMD'",), _subprocess, whole_name=False,
               prefix="subprocess:", check=_check_command),
    DriverKind("mutant", ("mutant:NAME",), _mutant, whole_name=False, prefix=MUTANT_PREFIX,
               check=_check_mutant),
    DriverKind("kv", ("kv:NAME",), _component, whole_name=False, prefix="kv:",
               check=_check_component),
    DriverKind("ec", ("ec:NAME",), _component, whole_name=False, prefix="ec:",
               check=_check_component),
)
_BY_KIND = {row.kind: row for row in DRIVER_KINDS}
_FORMS = [form for row in DRIVER_KINDS for form in row.forms]

FRONTENDS = SpecGrammar("frontend", tuple(r.kind for r in DRIVER_KINDS if r.whole_name),
                        tuple(r.prefix for r in DRIVER_KINDS if r.prefix),
                        ", ".join(_FORMS[:-1]) + " or " + _FORMS[-1])


def parse_frontend(text: str) -> FrontendSpec:
    """A `--frontend` value, parsed by the table's grammar (ValueError: the line to fix)."""
    return parse_spec(text, FRONTENDS)


def driver_kind(spec: FrontendSpec) -> DriverKind:
    return _BY_KIND[spec.kind]


def check_spec(text: str) -> None:
    """Refuse a frontend spec before any case runs (cheap: imports no frontend).

    Raises ValueError with the one line a user needs to fix the command."""
    parsed = parse_frontend(text)
    driver_kind(parsed).check(parsed)


def release_profile(text: str) -> ProtocolProfile | None:
    """The protocol a release-pinned spec (`vllm-rs@X`) speaks; None for every other."""
    parsed = parse_frontend(text)
    return driver_kind(parsed).release_profile(parsed)


def make_driver(config: RunConfig) -> FrontendDriver:
    """The driver of `config.frontend`, its every bound scaled by the run's time scale."""
    parsed = parse_frontend(config.frontend)
    return driver_kind(parsed).build(parsed, config).with_timescale(config.timescale)
