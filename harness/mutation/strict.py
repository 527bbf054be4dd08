"""pytest plugin for mutation runs: every verdict that catches a mutant fails its item.

The conformance plugin skips a NON-STRICT item (a SHOULD not met), but mutmut counts only
failing pytest runs as kills. A mutant a SHOULD case grades NON-STRICT is caught, exactly
as in the hand-written kill matrix (harness/report/killmatrix.py), so mutation runs load
this plugin (`-p harness.mutation.strict`, see [tool.mutmut] in pyproject.toml).
"""

from __future__ import annotations

import json
from collections.abc import Generator

import pytest

CAUGHT = ("FAIL", "ERROR", "TIMEOUT", "NON-STRICT")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    result = getattr(item, "corewire_result", None)
    if call.when == "call" and result is not None and report.skipped:
        verdict = json.loads(result)["verdict"]
        if verdict in CAUGHT:
            report.outcome = "failed"
            report.longrepr = f"{verdict} (caught): {json.loads(result)['message']}"
    return report
