"""The case model: how a case is declared (id, requirement, level, grounds, capabilities).

A case is an async function marked with its `CaseSpec`; the plugin collects the marks.
Verdicts and result rows are harness.results.records.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.cases.grounds import Grounds
from harness.frontends.api import Capability
from harness.results.records import AREAS, Level, Verdict

CASE_ID = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+){2}$")


@dataclass(frozen=True)
class CaseSpec:
    """What a conformance case claims, independent of any frontend."""

    case_id: str
    level: Level
    requirement: str
    source: str
    needs: frozenset[Capability] = frozenset()
    timeout: float = 10.0  # seconds before the time-scale factor
    grounds: Grounds | None = None  # the vLLM 0.33.0 lines the rule stands on (wire cases)

    @property
    def area(self) -> str:
        return self.case_id.split(".", 1)[0]


CaseFn = Callable[..., Coroutine[Any, Any, None]]
# Keys of a `params` entry that set the case's spec instead of being the function's
# arguments (a MUST for some values, a SHOULD for others; a capability only some need).
SPEC_KEYS = frozenset({"level", "needs", "grounds", "timeout"})


@dataclass(frozen=True)
class DeclaredCase:
    """One case as the plugin runs it: its spec and a coroutine function of the context."""

    spec: CaseSpec
    run: CaseFn


def case(case_id: str, level: Level, requirement: str, *, grounds: Grounds | None = None,
         source: str = "", needs: Iterable[Capability] = (), timeout: float = 10.0,
         params: Iterable[Mapping[str, Any]] | None = None) -> Callable[[CaseFn], CaseFn]:
    """Declare an async function as a conformance case (collected by the plugin).

    A wire case states its `grounds` (harness.cases.grounds); its `source` is then their
    rendering. A component case (kv:/ec:) names its `source` (the vLLM PR of its contract).
    `params`: one case per entry, the id and requirement formatted with the entry, the
    function called with the entry's values its signature names (keys in SPEC_KEYS set
    that case's level, needs, grounds or timeout instead)."""
    entries = None if params is None else [dict(entry) for entry in params]
    # A single case's declaration is checked at once, where it is written.
    single = None if entries is not None else _spec(case_id, level, requirement, grounds,
                                                   source, needs, timeout)

    def mark(fn: CaseFn) -> CaseFn:
        if single is not None:
            declared: tuple[DeclaredCase, ...] = (DeclaredCase(single, fn),)
        else:
            declared = tuple(_bound(fn, entry, case_id, level, requirement, grounds, source,
                                    needs, timeout) for entry in entries or ())
        ids = [d.spec.case_id for d in declared]
        if not ids or len(set(ids)) != len(ids):
            raise ValueError(f"{case_id}: params give no case, or one id twice: {ids}")
        fn.__corewire_cases__ = declared  # type: ignore[attr-defined]
        return fn

    return mark


def _spec(case_id: str, level: Level, requirement: str, grounds: Grounds | None, source: str,
          needs: Iterable[Capability], timeout: float) -> CaseSpec:
    if not CASE_ID.match(case_id) or case_id.split(".")[0] not in AREAS:
        raise ValueError(f"case id {case_id!r} must be <area>.<topic>.<case> with area in "
                         f"{AREAS} and only [a-z0-9_] in each part")
    if grounds is not None and source:
        raise ValueError(f"{case_id}: give grounds or a source, not both")
    if grounds is None and not source:
        raise ValueError(f"{case_id}: a case needs grounds (or, for a component, a source)")
    return CaseSpec(case_id, level, requirement, grounds.render() if grounds else source,
                    frozenset(needs), timeout, grounds)


def _bound(fn: CaseFn, entry: dict[str, Any], case_id: str, level: Level, requirement: str,
           grounds: Grounds | None, source: str, needs: Iterable[Capability],
           timeout: float) -> DeclaredCase:
    """One entry of `params`: its spec, and `fn` with the entry's arguments bound."""
    values = {k: v for k, v in entry.items() if k not in SPEC_KEYS}
    spec = _spec(case_id.format(**values), entry.get("level", level),
                 requirement.format(**values), entry.get("grounds", grounds), source,
                 entry.get("needs", needs), entry.get("timeout", timeout))
    wanted = list(inspect.signature(fn).parameters)[1:]  # after the context
    missing = [name for name in wanted if name not in values]
    if missing:
        raise ValueError(f"{spec.case_id}: params entry lacks {missing} for {fn.__name__}")
    arguments = {name: values[name] for name in wanted}

    async def run(ctx: Any) -> None:
        await fn(ctx, **arguments)

    run.__name__ = run.__qualname__ = spec.case_id.rsplit(".", 1)[1]
    run.__module__ = fn.__module__
    return DeclaredCase(spec, run)


def cases_of(value: object) -> tuple[DeclaredCase, ...]:
    """The cases `value` declares (none unless it is a function marked by `case`)."""
    declared: tuple[DeclaredCase, ...] = getattr(value, "__corewire_cases__", ())
    return declared


def module_cases(namespace: Mapping[str, object]) -> list[DeclaredCase]:
    """Every case a module declares, in definition order (`vars(module)`)."""
    return [d for value in namespace.values() for d in cases_of(value)]


def grade_unmet(level: Level) -> Verdict:
    """The verdict for a requirement that was not met, by its level."""
    return {Level.MUST: Verdict.FAIL, Level.SHOULD: Verdict.NON_STRICT,
            Level.INFO: Verdict.INFO}[level]
