"""Graded verdicts and the case model (requirement, level, source, capabilities).

Autobahn-style grading: a MUST that is broken FAILs, a SHOULD that is not met is
NON-STRICT, INFO records behaviour without judging it, and a driver that cannot observe
what a case needs gets UNSUPPORTED -- never a silent pass.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from harness.frontends.driver import Capability


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

    @property
    def area(self) -> str:
        return self.case_id.split(".", 1)[0]


CaseFn = Callable[..., Coroutine[Any, Any, None]]


def case(case_id: str, level: Level, requirement: str, *, source: str,
         needs: Iterable[Capability] = (), timeout: float = 10.0) -> Callable[[CaseFn], CaseFn]:
    """Declare an async function as a conformance case (collected by the plugin)."""
    if not CASE_ID.match(case_id) or case_id.split(".")[0] not in AREAS:
        raise ValueError(f"case id {case_id!r} must be <area>.<topic>.<case> with area in "
                         f"{AREAS} and only [a-z0-9_] in each part")
    spec = CaseSpec(case_id, level, requirement, source, frozenset(needs), timeout)

    def mark(fn: CaseFn) -> CaseFn:
        fn.__corewire_case__ = spec  # type: ignore[attr-defined]
        return fn

    return mark


@dataclass
class Evidence:
    """Why a verdict is what it is: expected vs observed, plus a transcript excerpt."""

    expected: str = ""
    observed: str = ""
    notes: list[str] = field(default_factory=list)
    transcript: list[dict[str, Any]] = field(default_factory=list)
    transcript_file: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"expected": self.expected, "observed": self.observed, "notes": self.notes,
                "transcript_file": self.transcript_file,
                "transcript_excerpt": self.transcript}


@dataclass
class CaseResult:
    """One case x frontend outcome, the unit every report is made of."""

    case_id: str
    frontend: str
    level: str
    source: str
    requirement: str
    verdict: Verdict
    message: str
    duration: float
    evidence: Evidence = field(default_factory=Evidence)
    baseline: str | None = None  # the baseline reason when a non-PASS is tolerated

    def to_json(self) -> dict[str, Any]:
        return {"id": self.case_id, "frontend": self.frontend, "level": self.level,
                "source": self.source, "requirement": self.requirement,
                "verdict": self.verdict.value, "message": self.message,
                "duration": round(self.duration, 4), "baseline": self.baseline,
                "evidence": self.evidence.as_dict()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseResult:
        ev = data.get("evidence") or {}
        return cls(data["id"], data["frontend"], data["level"], data["source"],
                   data["requirement"], Verdict(data["verdict"]), data.get("message", ""),
                   float(data.get("duration", 0.0)),
                   Evidence(ev.get("expected", ""), ev.get("observed", ""),
                            list(ev.get("notes", [])), list(ev.get("transcript_excerpt", [])),
                            ev.get("transcript_file")),
                   data.get("baseline"))


def grade_unmet(level: Level) -> Verdict:
    """The verdict for a requirement that was not met, by its level."""
    return {Level.MUST: Verdict.FAIL, Level.SHOULD: Verdict.NON_STRICT,
            Level.INFO: Verdict.INFO}[level]
