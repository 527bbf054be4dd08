"""Frontend specs on the command line -> drivers (imports are lazy: vllm is heavy)."""

from __future__ import annotations

import shlex
import sys

from harness.frontends.driver import FrontendDriver

REFERENCE_SUBPROCESS = [sys.executable, "-m", "harness.frontends.driver_main"]


KNOWN = ("reference", "reference-subprocess", "vllm-rs", "vllm-py")
PREFIXES = ("subprocess:", "mutant:", "kv:", "ec:", "vllm-rs@")
USAGE = ("reference, reference-subprocess, vllm-rs, vllm-rs@X, vllm-py, subprocess:'CMD', "
         "mutant:NAME, kv:NAME or ec:NAME")


def check_spec(spec: str) -> None:
    """Refuse a frontend spec before any case runs (cheap: imports no frontend).

    Raises ValueError with the one line a user needs to fix the command.
    """
    if spec in KNOWN:
        return
    prefix = next((p for p in PREFIXES if spec.startswith(p)), None)
    rest = spec[len(prefix):].strip() if prefix else ""
    if prefix is None:
        raise ValueError(f"unknown frontend {spec!r}: use {USAGE}")
    if not rest:
        raise ValueError(f"frontend {spec!r} names nothing after {prefix!r}")
    if prefix == "subprocess:":
        try:
            shlex.split(rest)
        except ValueError as exc:
            raise ValueError(f"frontend {spec!r}: cannot split the command ({exc})") from None
    if prefix == "vllm-rs@":
        from harness.frontends.vllm_rs_releases import release_of

        release_of(spec)  # ReleaseSpecError is a ValueError with the one line
    if prefix == "mutant:":
        from harness.frontends.mutants import MUTANTS

        if rest not in MUTANTS:
            raise ValueError(f"unknown mutant {rest!r}; known: {', '.join(sorted(MUTANTS))}")


def make_driver(spec: str) -> FrontendDriver:
    """`reference`, `reference-subprocess`, `vllm-rs`, `vllm-rs@X` (vLLM release X's
    binary), `vllm-py`, `subprocess:CMD`, `mutant:NAME`."""
    if spec == "reference":
        from harness.frontends.reference import ReferenceDriver

        return ReferenceDriver()
    if spec == "reference-subprocess":
        from harness.frontends.subprocess_driver import SubprocessDriver

        return SubprocessDriver(REFERENCE_SUBPROCESS, name=spec)
    if spec.startswith("subprocess:"):
        from harness.frontends.subprocess_driver import SubprocessDriver

        return SubprocessDriver(shlex.split(spec.split(":", 1)[1]), name=spec)
    if spec == "vllm-rs":
        from harness.frontends.vllm_rs import VllmRsDriver

        return VllmRsDriver()
    if spec.startswith("vllm-rs@"):
        from harness.frontends.vllm_rs import VllmRsDriver
        from harness.frontends.vllm_rs_releases import release_of

        return VllmRsDriver(release=release_of(spec))
    if spec == "vllm-py":
        from harness.frontends.vllm_py import VllmPyDriver

        return VllmPyDriver()
    if spec.startswith(("kv:", "ec:")):  # component cases: no frontend involved
        from harness.frontends.no_frontend import NoFrontend

        return NoFrontend(spec)
    if spec.startswith("mutant:"):
        from harness.frontends.mutants import make_mutant_driver

        return make_mutant_driver(spec.split(":", 1)[1])
    raise ValueError(f"unknown frontend {spec!r}: use {USAGE}")
