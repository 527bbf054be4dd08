"""Grading is one lookup: each outcome class names its verdict, the most specific class wins."""

from __future__ import annotations

import asyncio

import pytest

from harness.cases.grading import (
    GRADES,
    CaseUnmet,
    CaseUnsupported,
    grade_of,
    message_for,
    verdict_for,
)
from harness.frontends.api import (
    CommandTimeout,
    DriverFault,
    FrontendError,
    StartupError,
    StartupHang,
    UnsupportedOperation,
)
from harness.frontends.subprocess.program_process import DriverProgramFault
from harness.frontends.subprocess.protocol import DriverProtocolError
from harness.results.records import Level, Verdict

CASES = [
    # outcome, level, verdict, message
    (CaseUnmet("x", "y"), Level.MUST, Verdict.FAIL, "expected x; observed y"),
    (CaseUnmet("x", "y"), Level.SHOULD, Verdict.NON_STRICT, "expected x; observed y"),
    (CaseUnsupported("no abort"), Level.MUST, Verdict.UNSUPPORTED, "no abort"),
    (UnsupportedOperation("gRPC"), Level.MUST, Verdict.UNSUPPORTED, "driver cannot: gRPC"),
    (StartupError("refused"), Level.MUST, Verdict.FAIL, "frontend did not start: refused"),
    (StartupError("refused"), Level.INFO, Verdict.INFO, "frontend did not start: refused"),
    (StartupHang("hung"), Level.SHOULD, Verdict.NON_STRICT,
     "frontend call failed unexpectedly: StartupHang: hung"),
    (FrontendError("500"), Level.MUST, Verdict.FAIL,
     "frontend call failed unexpectedly: FrontendError: 500"),
    (CommandTimeout("no reply to `generate` (id 7)"), Level.MUST, Verdict.TIMEOUT,
     "driver: no reply to `generate` (id 7)"),
    (DriverProtocolError("stray line 'hi'"), Level.MUST, Verdict.ERROR,
     "driver fault: stray line 'hi'"),
    (DriverProgramFault("driver exited (code 3)"), Level.SHOULD, Verdict.ERROR,
     "driver fault: driver exited (code 3)"),
    (KeyError("k"), Level.MUST, Verdict.ERROR, "KeyError: 'k'"),
]


@pytest.mark.parametrize(("exc", "level", "verdict", "message"), CASES,
                         ids=[f"{type(c[0]).__name__}-{c[1].value}" for c in CASES])
def test_outcome_grades(exc: BaseException, level: Level, verdict: Verdict,
                        message: str) -> None:
    grade = grade_of(exc)
    assert verdict_for(grade, level) is verdict
    assert message_for(grade, exc) == message


def test_driver_faults_are_errors_by_type_not_by_falling_through() -> None:
    """Before: a driver fault became ERROR only through the final `except Exception`."""
    assert DriverFault in GRADES
    assert grade_of(DriverProtocolError("x")) is GRADES[DriverFault]
    assert grade_of(DriverProtocolError("x")).traceback


def test_the_case_bound_is_told_from_a_driver_command_timeout() -> None:
    assert grade_of(asyncio.TimeoutError()).case_bound
    assert grade_of(TimeoutError()).case_bound
    assert not grade_of(CommandTimeout("x")).case_bound


def test_only_exceptions_are_outcomes() -> None:
    with pytest.raises(TypeError):
        grade_of(KeyboardInterrupt())
