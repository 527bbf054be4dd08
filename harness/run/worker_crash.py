"""An xdist worker that died mid-case: its case becomes that case's ERROR row.

pytest-xdist reports the item a crashed worker was running as a bare failed report (phase
"???"), which reads as an error outside any case: the case loses its row in results.json
and the processes the worker had started (its driver program, in a session of its own,
and what that program started) run on with no one to end them. On the controller,
`pytest_handlecrashitem` hands the report here: the cause is read from the worker's exit
status (killed by which signal, or its exit code), the worker's registry
(harness/hygiene/ownership.py) is swept, which ends the driver programs it recorded and removes
its temp dirs, and the report becomes the case's call report with an ERROR result, graded
against the baseline like any other.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.hygiene import ownership
from harness.results.baseline import apply_baseline
from harness.results.bounds import bound_result
from harness.results.evidence import evidence_text
from harness.results.records import CaseResult, Evidence, Verdict
from harness.results.schema import encode_result
from harness.run.state import PROPERTY, run_state_of

EXIT_WAIT_S = 2.0  # the worker's exit status is read this long at most (it has hung up)


def split_item_name(nodeid: str) -> tuple[str, str, str] | None:
    """(module path, case id, frontend) of a case item's node id, else None."""
    path, _, name = nodeid.partition("::")
    case_id, bracket, rest = name.partition("[")
    if not bracket or not rest.endswith("]") or not case_id:
        return None
    return path, case_id, rest[:-1]


def exit_cause(node: Any) -> tuple[str, int | None]:
    """How the worker process ended ("killed by SIGKILL", "exited with code 3") and its
    pid, read from execnet's popen of it; bounded by EXIT_WAIT_S."""
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    if not isinstance(popen, subprocess.Popen):
        return "exit status unknown", None
    try:
        code = popen.wait(timeout=EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        return f"still running {EXIT_WAIT_S:.0f} s after it hung up", popen.pid
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}", popen.pid
        return f"killed by signal {-code}", popen.pid
    return f"exited with code {code}", popen.pid


def _spec_fields(config: pytest.Config, path: str, case_id: str) -> tuple[str, str, str]:
    """(level, source, requirement) of the case, from its module (the controller of an
    xdist run collects nothing itself); placeholders when the module cannot be read."""
    from harness.cases.index import case_specs

    root = Path(str(config.rootpath))
    with contextlib.suppress(Exception):
        found = case_specs(root, files=[root / path]).get(case_id)
        if found is not None:
            spec = found[0]
            return spec.level.value, spec.source, spec.requirement
    return "MUST", "", "(the case's module could not be read on the controller)"


def _is_case(config: pytest.Config, path: str) -> bool:
    """Whether the item's module is one of the conformance suites (its items are cases)."""
    from harness.run.selection import COMPONENTS_DIR

    suites = COMPONENTS_DIR.parent.resolve()
    module = (Path(str(config.rootpath)) / path).resolve()
    return suites in module.parents


def crashed_case(crashitem: str, report: pytest.TestReport) -> None:
    """Turn xdist's report of a crashed worker's item into the case's ERROR call report,
    after ending what the worker left running (for any item: a test of corewire itself
    keeps xdist's report, with what was ended added to it)."""
    node = getattr(report, "node", None)
    config: pytest.Config | None = getattr(node, "config", None)
    if config is None:
        return
    worker = getattr(getattr(node, "gateway", None), "id", "?")
    cause, pid = exit_cause(node)
    # Only the crashed worker's registry: the others belong to live workers. Without its
    # pid, every dead owner's (a sweep never touches a live one's).
    swept = ownership.sweep(owner=pid) if pid is not None else ownership.sweep()
    parts = split_item_name(crashitem)
    if parts is None or not _is_case(config, parts[0]):
        if swept.describe():
            report.longrepr = f"{report.longrepr} ({cause}); the controller {swept.describe()}"
        return  # not a case: xdist's report stands (an error outside any case)
    path, case_id, frontend = parts
    notes = [f"worker {worker!r} ({cause}) while running this case"]
    if swept.describe():
        notes.append(f"teardown by the controller: {swept.describe()}")
    level, source, requirement = _spec_fields(config, path, case_id)
    result = bound_result(CaseResult(
        case_id, frontend, level, source, requirement, Verdict.ERROR,
        f"harness fault: the xdist worker running the case crashed ({cause}); the case "
        f"has no verdict of its own", 0.0, evidence=Evidence(notes=notes)))
    run = run_state_of(config)
    outcome = apply_baseline(result, run.baseline)
    setattr(report, PROPERTY, encode_result(result))
    report.when = "call"
    report.sections = [("Captured stdout call",
                        evidence_text(result, config.getoption("report_dir")))]
    if outcome.fail:
        report.outcome = "failed"
        report.longrepr = outcome.message
    elif outcome.skip:
        report.outcome = "skipped"
        report.longrepr = (path, 0, outcome.message)
    else:
        report.outcome = "passed"
        report.longrepr = None
