"""pytest plugin for mutation runs: every verdict that catches a mutant fails its item.

The conformance plugin skips a NON-STRICT item (a SHOULD not met), but mutmut counts only
failing pytest runs as kills. A mutant a SHOULD case grades NON-STRICT is caught, exactly
as in the hand-written kill matrix (harness/mutation/killmatrix.py), so mutation runs load
this plugin (`-p harness.mutation.strict`, see [tool.mutmut] in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from harness.results.schema import decode_result

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

