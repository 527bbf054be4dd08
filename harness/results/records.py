"""Graded verdicts and the result record every report reads.

Autobahn-style grading: a MUST that is broken FAILs, a SHOULD that is not met is
NON-STRICT, INFO records behaviour without judging it, and a driver that cannot observe
what a case needs gets UNSUPPORTED -- never a silent pass. NOT-RUN is no grade: the case
was left out because its frontend could not start (the run exits 6 instead).
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

# The areas a case id begins with (`<area>.<topic>.<case>`): a case's folder, and how
# reports group rows.
AREAS = ("handshake", "dp", "abort", "failure", "streaming", "utility", "components")


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
    NOT_RUN = "NOT-RUN"  # its frontend was stopped after failing to start (harness/run/failfast.py)

    @property
    def failing(self) -> bool:
        return self in (Verdict.FAIL, Verdict.ERROR, Verdict.TIMEOUT)



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
    (harness/results/schema.py encodes and decodes it). JSON names: `id` for `case_id`."""

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
