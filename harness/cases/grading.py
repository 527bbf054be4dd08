"""How a case's outcome becomes its verdict: one table, looked up by the exception's class.

Like h2's error codes, every way a case can end says what it means. `GRADES` maps outcome
classes to a `Grade`; the most specific class wins (the lookup walks the exception's MRO), so
no order of except clauses decides a verdict, and a driver fault is ERROR by its type. A
`Grade` with no verdict is graded by the case's level: an unmet MUST fails, an unmet SHOULD
is NON-STRICT, an INFO case records it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from harness.cases.declaration import grade_unmet
from harness.frontends.api import (
    CommandTimeout,
    DriverFault,
    FrontendError,
    StartupError,
    UnsupportedOperation,
)
from harness.hygiene.memory_guard import CaseMemoryExceeded
from harness.results.records import Level, Verdict


class CaseUnmet(Exception):
    """A requirement of the case was not met by the frontend under test."""

    def __init__(self, expected: str, observed: str) -> None:
        super().__init__(f"expected {expected}; observed {observed}")
        self.expected = expected
        self.observed = observed


class CaseUnsupported(Exception):
    """The driver lacks a capability the case needs."""


@dataclass(frozen=True)
class Grade:
    """What an outcome class means."""

    verdict: Verdict | None  # None: by the case's level (grade_unmet)
    prefix: str = ""  # put before the exception's text in the verdict message
    with_type: bool = False  # name the exception's class in the message
    traceback: bool = False  # a fault of ours or the driver's: keep the traceback
    case_bound: bool = False  # the case's own time bound ran out (the message says what hung)


GRADES: dict[type[BaseException], Grade] = {
    CaseUnmet: Grade(None),
    CaseUnsupported: Grade(Verdict.UNSUPPORTED),
    UnsupportedOperation: Grade(Verdict.UNSUPPORTED, "driver cannot: "),
    StartupError: Grade(None, "frontend did not start: "),
    FrontendError: Grade(None, "frontend call failed unexpectedly: ", with_type=True),
    CommandTimeout: Grade(Verdict.TIMEOUT, "driver: "),
    TimeoutError: Grade(Verdict.TIMEOUT, case_bound=True),
    asyncio.TimeoutError: Grade(Verdict.TIMEOUT, case_bound=True),
    DriverFault: Grade(Verdict.ERROR, "driver fault: ", traceback=True),
    CaseMemoryExceeded: Grade(Verdict.ERROR, "memory bound: "),
    Exception: Grade(Verdict.ERROR, with_type=True, traceback=True),
}


def grade_of(exc: BaseException) -> Grade:
    """The grade of the most specific class of `exc` in the table."""
    for cls in type(exc).__mro__:
        if cls in GRADES:
            return GRADES[cls]
    raise TypeError(f"{type(exc).__name__} is not a case outcome")  # BaseException only


def verdict_for(grade: Grade, level: Level) -> Verdict:
    return grade.verdict if grade.verdict is not None else grade_unmet(level)


def message_for(grade: Grade, exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if grade.with_type else str(exc)
    return grade.prefix + text
