"""Running the machine under hypothesis, and naming the core it runs against.

A failing run leaves one replay file per minimal failure (replays.py) and says where on
the exception, so the person reading the failure has a command to run next.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random
from typing import Any

import hypothesis
from hypothesis.stateful import run_state_machine_as_test

from harness.frontends.reference.core import ReferenceFrontendCore
from harness.frontends.reference.frontend import CoreFactory
from harness.frontends.spec import SpecGrammar, lookup, parse_spec
from harness.stateful.machine import FrontendMachine
from harness.stateful.replays import write_replay
from harness.stateful.settings import stateful_settings, stateful_timescale

SEED_ENV = "COREWIRE_STATEFUL_SEED"


# What the machine may run against: the same grammar as `--frontend`'s, any other text an
# import path.
CORES = SpecGrammar("core spec", ("reference",), usage="reference, mutant:NAME or module:Attr",
                    other="import")


def resolve_core(spec: str) -> CoreFactory:
    """"reference", "mutant:NAME" (harness/mutation/registry.py) or "package.module:Attr"."""
    parsed = parse_spec(spec or "reference", CORES)
    if parsed.kind == "reference":
        return ReferenceFrontendCore
    if parsed.kind == "mutant":
        from harness.frontends.reference.frontend import ReferenceFrontend
        from harness.mutation.registry import runnable_mutants

        mutant = lookup(runnable_mutants(), parsed.argument, "mutant")
        if mutant.frontend_class is not ReferenceFrontend:
            raise ValueError(f"core spec {spec!r}: that mutant's bug is in the I/O layer "
                             f"({mutant.frontend_class.__name__}), which the stateful "
                             f"machine does not run; it drives cores only")
        return mutant.core
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"core spec {spec!r}: expected {CORES.usage}")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    return target  # type: ignore[no-any-return]


def _new_seed() -> int:
    if os.environ.get(SEED_ENV):
        return int(os.environ[SEED_ENV])
    return random.SystemRandom().getrandbits(32)


def run_stateful(core_factory: CoreFactory = ReferenceFrontendCore, *,
                 transport: str = "sansio", settings: hypothesis.settings | None = None,
                 seed: int | None = None,
                 replay_directory: str | os.PathLike[str] | None = None) -> None:
    """Run the machine under hypothesis; on failure write replay file(s), then re-raise.

    The exception gets a note naming each replay file, and a `replay_files` attribute.
    """
    chosen = settings or stateful_settings()
    run_seed = _new_seed() if seed is None else seed
    failed: list[FrontendMachine] = []
    timescale = stateful_timescale()  # read once per run, handed to every example

    def factory() -> FrontendMachine:
        machine = FrontendMachine(core_factory, transport, timescale=timescale)
        machine.on_failure = failed.append
        return machine

    try:
        # Any callable returning a machine will do (hypothesis documents it); the stub says type.
        seeded: Any = hypothesis.seed(run_seed)(factory)
        run_state_machine_as_test(seeded, settings=chosen)
    except BaseException as exc:
        # Hypothesis re-runs each minimal failing example last: those are the newest failures.
        reported = len(getattr(exc, "exceptions", None) or [exc])
        paths = [write_replay(mach, seed=run_seed, settings=chosen, directory=replay_directory)
                 for mach in failed[-reported:]]
        with contextlib.suppress(AttributeError, TypeError):
            exc.replay_files = paths  # type: ignore[attr-defined]
        for path in paths:
            note = (f"corewire replay file: {path}  (re-run: python -m harness.stateful "
                    f"replay {path}; promote: python -m harness.stateful promote {path})")
            if hasattr(exc, "add_note"):
                exc.add_note(note)
        raise
