"""Frontend specs on the command line -> drivers (imports are lazy: vllm is heavy)."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

from harness.frontends.driver import FrontendDriver

REFERENCE_SUBPROCESS = [sys.executable, "-m", "harness.frontends.subprocess.program"]


KNOWN = ("reference", "reference-subprocess", "vllm-rs", "vllm-py")
PREFIXES = ("subprocess:", "mutant:", "kv:", "ec:", "vllm-rs@")
USAGE = ("reference, reference-subprocess, vllm-rs, vllm-rs@X, vllm-py, subprocess:'CMD', "
         "mutant:NAME, kv:NAME or ec:NAME")


@dataclass(frozen=True)
class FrontendSpec:
    """A `--frontend` value, parsed once: its kind and what follows the prefix."""

    text: str
    kind: str  # a KNOWN name, or a prefix without its separator: "subprocess", "mutant", ...
    argument: str = ""  # the command, mutant name, release or component unit


def parse_spec(text: str) -> FrontendSpec:
    """The one parser of frontend specs. ValueError carries the line a user needs."""
    if text in KNOWN:
        return FrontendSpec(text, text)
    prefix = next((p for p in PREFIXES if text.startswith(p)), None)
    if prefix is None:
        raise ValueError(f"unknown frontend {text!r}: use {USAGE}")
    argument = text[len(prefix):].strip()
    if not argument:
        raise ValueError(f"frontend {text!r} names nothing after {prefix!r}")
    return FrontendSpec(text, prefix.rstrip(":@"), argument)


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
            from harness.frontends.vllm_rs_releases import release_of

            release_of(spec)  # ReleaseSpecError is a ValueError with the one line
    elif parsed.kind == "mutant":
        from harness.frontends.mutants import MUTANTS

        if parsed.argument not in MUTANTS:
            raise ValueError(f"unknown mutant {parsed.argument!r}; known: "
                             f"{', '.join(sorted(MUTANTS))}")


def make_driver(spec: str) -> FrontendDriver:
    """`reference`, `reference-subprocess`, `vllm-rs`, `vllm-rs@X` (vLLM release X's
    binary), `vllm-py`, `subprocess:CMD`, `mutant:NAME`, `kv:`/`ec:` (component cases)."""
    parsed = parse_spec(spec)
    if parsed.kind == "reference":
        from harness.frontends.reference import ReferenceDriver

        return ReferenceDriver()
    if parsed.kind in ("reference-subprocess", "subprocess"):
        from harness.frontends.subprocess_driver import SubprocessDriver

        command = (shlex.split(parsed.argument) if parsed.argument
                   else REFERENCE_SUBPROCESS)
        return SubprocessDriver(command, name=spec)
    if parsed.kind == "vllm-rs":
        from harness.frontends.vllm_rs import VllmRsDriver

        if not parsed.argument:
            return VllmRsDriver()
        from harness.frontends.vllm_rs_releases import release_of

        return VllmRsDriver(release=release_of(spec))
    if parsed.kind == "vllm-py":
        from harness.frontends.vllm_py import VllmPyDriver

        return VllmPyDriver()
    if parsed.kind in ("kv", "ec"):  # component cases: no frontend involved
        from harness.frontends.no_frontend import NoFrontend

        return NoFrontend(spec)
    from harness.frontends.mutants import make_mutant_driver

    return make_mutant_driver(parsed.argument)  # the only kind left: "mutant"
