"""pytest plugin for mutation runs: every verdict that catches a mutant fails its item, and
every run writes its reports into a directory of its own.

The conformance plugin skips a NON-STRICT item (a SHOULD not met), but mutmut counts only
failing pytest runs as kills. A mutant a SHOULD case grades NON-STRICT is caught, exactly
as in the hand-written kill matrix (harness/report/killmatrix.py), so mutation runs load
this plugin (`-p harness.mutation.strict`, see [tool.mutmut] in pyproject.toml).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Generator
from pathlib import Path

import pytest

from harness.report.schema import decode_result

CAUGHT = ("FAIL", "ERROR", "TIMEOUT", "NON-STRICT")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    result = getattr(item, "corewire_result", None)
    if call.when == "call" and result is not None and report.skipped:
        decoded = decode_result(result)
        verdict = decoded.verdict.value
        if verdict in CAUGHT:
            report.outcome = "failed"
            report.longrepr = f"{verdict} (caught): {decoded.message}"
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """mutmut runs up to --max-children pytest sessions at once, all with the pyproject's
    one --report-dir; one run owns a report dir (harness/report/dirlock.py), so every
    concurrent child was refused (exit 4) and counted as a kill, on any mutant. Each run
    gets a subdirectory named by its pid instead, removed when it ends (nothing reads a
    mutation child's reports: mutmut reads its exit code)."""
    base = config.getoption("report_dir", None)
    if base:
        config.option.report_dir = str(Path(base) / f"run-{os.getpid()}")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    own = config.getoption("report_dir", None)
    if own and Path(own).name == f"run-{os.getpid()}":
        shutil.rmtree(own, ignore_errors=True)
