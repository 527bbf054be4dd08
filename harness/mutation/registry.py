"""The registry of deliberately broken reference frontends: each violates exactly one rule.

A conformance case that no broken frontend can fail proves nothing, so the self-test
(tests/test_mutants.py) runs the suites against every mutant, asserts each one is caught,
and reports the kill matrix. A mutant lives next to the rule it breaks: in its area's
`conformance/<area>/mutants.py`, registered where it is defined (`@mutant(...)` on its
core or I/O class, `register(Mutant(...))` for a reference core with other settings).
Nothing here names a mutant; the area modules are imported on first use.

History mutants (`history=True`) are bug classes taken from vLLM's own history
(docs/mutation-history.md): runnable as `mutant:NAME` like the others, but not in the kill
matrix until a case catches each one (then `history=True` goes).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from harness.frontends.reference.core import ReferenceFrontendCore
from harness.frontends.reference.driver import ReferenceDriver
from harness.frontends.reference.frontend import CoreFactory, ReferenceFrontend
from harness.locations import CASES_PACKAGE, IMPORT_ROOT

VLLM = "https://github.com/vllm-project/vllm/"  # history mutants' sources: VLLM + "pull/N"


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str  # the one rule it breaks
    core: CoreFactory
    frontend_kwargs: dict[str, Any] | None = None
    frontend_class: type[ReferenceFrontend] = ReferenceFrontend  # for bugs in the I/O layer
    source: str = ""  # where the bug comes from (history mutants: the vLLM issue / PR)
    history: bool = False  # a vLLM-history bug class awaiting a case: not in the kill matrix


_REGISTERED: dict[str, Mutant] = {}
_LOADED = False
C = TypeVar("C", bound=type)


def register(one: Mutant) -> Mutant:
    """Add a mutant; a name given twice is refused (the kill matrix is keyed by name)."""
    if one.name in _REGISTERED:
        raise ValueError(f"mutant {one.name!r} is registered twice")
    _REGISTERED[one.name] = one
    return one


def mutant(name: str, rule: str, *, frontend_kwargs: dict[str, Any] | None = None,
           source: str = "", history: bool = False) -> Callable[[C], C]:
    """Register the decorated class as a mutant: a `ReferenceFrontendCore` subclass (the
    core breaks the rule) or a `ReferenceFrontend` subclass (the I/O layer does)."""

    def mark(cls: C) -> C:
        if issubclass(cls, ReferenceFrontend):
            register(Mutant(name, rule, ReferenceFrontendCore, frontend_kwargs, cls,
                            source, history))
        else:
            core = cast(CoreFactory, cls)  # a ReferenceFrontendCore subclass
            register(Mutant(name, rule, core, frontend_kwargs, source=source,
                            history=history))
        return cls

    return mark


def fired(name: str) -> None:
    """A history mutant's broken branch just acted. Does nothing; the firing check
    (harness/mutation/history_fired.py) replaces it to record which mutants acted. Call it
    as `registry.fired(...)` so the replacement is seen."""


def _load() -> None:
    """Import every area's mutants module (once): they register themselves."""
    global _LOADED
    if _LOADED:
        return
    for path in sorted((IMPORT_ROOT / CASES_PACKAGE).glob("*/mutants.py")):
        importlib.import_module(f"{CASES_PACKAGE}.{path.parent.name}.mutants")
    _LOADED = True


def mutants() -> dict[str, Mutant]:
    """The kill matrix's mutants, by name."""
    _load()
    return {name: m for name, m in _REGISTERED.items() if not m.history}


def history_mutants() -> dict[str, Mutant]:
    """The vLLM-history bug classes no case catches yet, by name."""
    _load()
    return {name: m for name, m in _REGISTERED.items() if m.history}


def runnable_mutants() -> dict[str, Mutant]:
    """What `--frontend mutant:NAME` resolves against: every registered mutant."""
    _load()
    return dict(_REGISTERED)


# Cases that no mutant is expected to fail, with the reason (reported in the kill matrix).
JUSTIFIED_IDLE_CASES: dict[str, str] = {
    "handshake.ready.empty_payload": "INFO case: it records what the frontend does with an "
                                     "empty ready payload and has no requirement to break",
    # INFO since the grounds audit: with one engine no engine reads current_wave
    # (core.py:518), so 0 is an unread default (the mutant that numbered waves from 1 went
    # with the requirement).
    "streaming.sessions_edges.single_engine_add_carries_wave_0":
        "INFO case: with one engine no engine relies on current_wave",
    "streaming.sessions_edges.single_engine_session_adds_carry_wave_0":
        "INFO case: with one engine no engine relies on current_wave",
}


def make_mutant_driver(name: str) -> ReferenceDriver:
    found = runnable_mutants().get(name)
    if found is None:
        raise ValueError(f"unknown mutant {name!r}; known: {sorted(runnable_mutants())}")
    return ReferenceDriver(found.core, name=f"mutant:{name}",
                           frontend_kwargs=found.frontend_kwargs,
                           frontend_class=found.frontend_class)
