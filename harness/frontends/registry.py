"""Spec strings -> what they name: frontends on the command line -> drivers, and the same
grammar for the component units (`kv:`/`ec:` and $COREWIRE_KV_WORKER / $COREWIRE_EC_SCHEDULER)
and the stateful fuzzer's cores. Imports are lazy: vllm is heavy."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from harness.frontends.api import FrontendDriver
from harness.protocol.timing import DEFAULT, Timescale
from harness.protocol.wire.profiles import ProtocolProfile, profile_for_release

REFERENCE_SUBPROCESS = [sys.executable, "-m", "harness.frontends.subprocess.program"]


KNOWN = ("reference", "reference-subprocess", "vllm-rs", "vllm-py")
MUTANT_PREFIX = "mutant:"
PREFIXES = ("subprocess:", MUTANT_PREFIX, "kv:", "ec:", "vllm-rs@")
COMPONENT_KINDS = ("kv", "ec")  # a component unit under test, not a frontend
USAGE = ("reference, reference-subprocess, vllm-rs, vllm-rs@X, vllm-py, subprocess:'CMD', "
         "mutant:NAME, kv:NAME or ec:NAME")

T = TypeVar("T")


@dataclass(frozen=True)
class SpecGrammar:
    """What one family of spec strings may be: whole names, and prefixes followed by an
    argument (`mutant:NAME`). Frontends, component units and stateful cores each have one."""

    what: str  # how an error names the spec: "frontend", "KV worker"
    known: tuple[str, ...]
    prefixes: tuple[str, ...] = (MUTANT_PREFIX,)
    usage: str = ""  # the forms, for the error line
    other: str | None = None  # the kind of any other text (None: any other text is an error)


FRONTENDS = SpecGrammar("frontend", KNOWN, PREFIXES, USAGE)


@dataclass(frozen=True)
class FrontendSpec:
    """A spec (a `--frontend` value by default), parsed once: its kind and what follows the
    prefix."""

    text: str
    kind: str  # a known name, or a prefix without its separator: "subprocess", "mutant", ...
    argument: str = ""  # the command, mutant name, release or component unit

    @property
    def is_component(self) -> bool:
        """`kv:NAME` / `ec:NAME`: a component unit for the component cases, not a frontend."""
        return self.kind in COMPONENT_KINDS


def parse_spec(text: str, grammar: SpecGrammar = FRONTENDS) -> FrontendSpec:
    """The one parser of spec strings. ValueError carries the line a user needs."""
    if text in grammar.known:
        return FrontendSpec(text, text)
    prefix = next((p for p in grammar.prefixes if text.startswith(p)), None)
    if prefix is None:
        if grammar.other is not None:
            return FrontendSpec(text, grammar.other, text)
        raise ValueError(f"unknown {grammar.what} {text!r}: use {grammar.usage}")
    argument = text[len(prefix):].strip()
    if not argument:
        raise ValueError(f"{grammar.what} {text!r} names nothing after {prefix!r}")
    return FrontendSpec(text, prefix.rstrip(":@"), argument)


def lookup(table: Mapping[str, T], name: str, what: str) -> T:
    """`table[name]`, or ValueError naming what is known (mutant tables, mostly)."""
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(table))}"
                         ) from None


def check_spec(spec: str) -> None:
    """Refuse a frontend spec before any case runs (cheap: imports no frontend).

    Raises ValueError with the one line a user needs to fix the command.
    """
    parsed = parse_spec(spec)
    if parsed.kind == "subprocess":
        try:
            shlex.split(parsed.argument)
        except ValueError as exc:
            raise ValueError(f"frontend {spec!r}: cannot split the command ({exc})") from None
    elif parsed.kind == "vllm-rs":
        if parsed.argument:
            from harness.frontends.vllm_rs.releases import release_of

            release_of(spec)  # ReleaseSpecError is a ValueError with the one line
    elif parsed.kind == "mutant":
        from harness.mutation.registry import runnable_mutants

        lookup(runnable_mutants(), parsed.argument, "mutant")
    elif parsed.is_component:
        from harness.components import component_slot

        component_slot(parsed.kind).check(parsed.argument)


def spec_profile(spec: str) -> ProtocolProfile | None:
    """The protocol the engines behind `spec` speak when the run gives no --profile: a
    `vllm-rs@X` release's own (its Rust decoder refuses any other array length, so its
    driver declares it: VllmRsDriver.protocol_profile); None for every other spec
    (vllm-0.33). What the report labels say, without building a driver."""
    from harness.frontends.vllm_rs.releases import release_of

    release = release_of(spec) if parse_spec(spec).kind == "vllm-rs" else None
    return None if release is None else profile_for_release(release.version)


def make_driver(spec: str, timescale: Timescale = DEFAULT) -> FrontendDriver:
    """The driver of a frontend spec, its every bound scaled by `timescale` (the run's)."""
    return _build_driver(spec).with_timescale(timescale)


def _build_driver(spec: str) -> FrontendDriver:
    """`reference`, `reference-subprocess`, `vllm-rs`, `vllm-rs@X` (vLLM release X's
    binary), `vllm-py`, `subprocess:CMD`, `mutant:NAME`, `kv:`/`ec:` (component cases)."""
    parsed = parse_spec(spec)
    if parsed.kind == "reference":
        from harness.frontends.reference import ReferenceDriver

        return ReferenceDriver()
    if parsed.kind in ("reference-subprocess", "subprocess"):
        from harness.frontends.subprocess.driver import SubprocessDriver

        command = (shlex.split(parsed.argument) if parsed.argument
                   else REFERENCE_SUBPROCESS)
        return SubprocessDriver(command, name=spec)
    if parsed.kind == "vllm-rs":
        from harness.frontends.vllm_rs.driver import VllmRsDriver

        if not parsed.argument:
            return VllmRsDriver()
        from harness.frontends.vllm_rs.releases import release_of

        return VllmRsDriver(release=release_of(spec))
    if parsed.kind == "vllm-py":
        from harness.frontends.vllm_py.driver import VllmPyDriver

        return VllmPyDriver()
    if parsed.is_component:  # component cases: no frontend involved
        from harness.frontends.no_frontend import NoFrontend

        return NoFrontend(spec)
    from harness.mutation.registry import make_mutant_driver

    return make_mutant_driver(parsed.argument)  # the only kind left: "mutant"
