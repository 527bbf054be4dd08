"""Graded verdicts and the case model (requirement, level, source, capabilities).

Autobahn-style grading: a MUST that is broken FAILs, a SHOULD that is not met is
NON-STRICT, INFO records behaviour without judging it, and a driver that cannot observe
what a case needs gets UNSUPPORTED -- never a silent pass. NOT-RUN is no grade: the case
was left out because its frontend could not start (the run exits 6 instead).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from harness.frontends.driver import Capability
from harness.grounds import Grounds


class Level(str, enum.Enum):
    MUST = "MUST"
    SHOULD = "SHOULD"
    INFO = "INFO"


class Verdict(str, enum.Enum):
    PASS = "PASS"
    NON_STRICT = "NON-STRICT"
    INFO = "INFO"
    UNSUPPORTED = "UNSUPPORTED"
    FAIL = "FAIL"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"
    NOT_RUN = "NOT-RUN"  # its frontend was stopped after failing to start (harness/failfast.py)

    @property
    def failing(self) -> bool:
        return self in (Verdict.FAIL, Verdict.ERROR, Verdict.TIMEOUT)


CASE_ID = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+){2}$")
AREAS = ("handshake", "dp", "abort", "failure", "streaming", "utility", "components")


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


def case(case_id: str, level: Level, requirement: str, *, grounds: Grounds | None = None,
         source: str = "", needs: Iterable[Capability] = (),
         timeout: float = 10.0) -> Callable[[CaseFn], CaseFn]:
    """Declare an async function as a conformance case (collected by the plugin).

    A wire case states its `grounds` (harness.grounds); its `source` is then their rendering.
    A component case (kv:/ec:) names its `source` (the vLLM PR of its contract)."""
    if not CASE_ID.match(case_id) or case_id.split(".")[0] not in AREAS:
        raise ValueError(f"case id {case_id!r} must be <area>.<topic>.<case> with area in "
                         f"{AREAS} and only [a-z0-9_] in each part")
    if grounds is not None and source:
        raise ValueError(f"{case_id}: give grounds or a source, not both")
    if grounds is None and not source:
        raise ValueError(f"{case_id}: a case needs grounds (or, for a component, a source)")
    spec = CaseSpec(case_id, level, requirement, grounds.render() if grounds else source,
                    frozenset(needs), timeout, grounds)

    def mark(fn: CaseFn) -> CaseFn:
        fn.__corewire_case__ = spec  # type: ignore[attr-defined]
        return fn

    return mark


class Evidence(msgspec.Struct):
    """Why a verdict is what it is: expected vs observed, plus a transcript excerpt.

    Field order is the order of the JSON keys in results.json."""

    expected: str = ""
    observed: str = ""
    notes: list[str] = msgspec.field(default_factory=list)
    transcript_file: str | None = None
    transcript: list[dict[str, Any]] = msgspec.field(default_factory=list,
                                                     name="transcript_excerpt")


class CaseResult(msgspec.Struct):
    """One case x frontend outcome, the unit every report is made of.

    The one schema of a result row: results.json, the hop from an xdist worker to the
    controller, JUnit system-out, HTML, compliance, merge and diff all read this struct
    (harness/report/schema.py encodes and decodes it). JSON names: `id` for `case_id`."""

    case_id: str = msgspec.field(name="id")
    frontend: str
    level: str
    source: str
    requirement: str
    verdict: Verdict
    message: str = ""
    duration: float = 0.0  # seconds, rounded to 0.1 ms (as results.json has always held)
    baseline: str | None = None  # the baseline reason when a non-PASS is tolerated
    evidence: Evidence = msgspec.field(default_factory=Evidence)

    def __post_init__(self) -> None:
        self.duration = round(self.duration, 4)


def grade_unmet(level: Level) -> Verdict:
    """The verdict for a requirement that was not met, by its level."""
    return {Level.MUST: Verdict.FAIL, Level.SHOULD: Verdict.NON_STRICT,
            Level.INFO: Verdict.INFO}[level]
