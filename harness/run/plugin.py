"""pytest plugin: collects conformance cases, runs them per frontend, grades, reports.

* Each `@case` function becomes one pytest item per `--frontend`, named
  `<case id>[<frontend name>]` (harness/frontends/naming.py: `NAME=SPEC`, a driver
  program's `init` name, or the spec), with a marker per area and level (`-k abort`, `-m dp`).
* The verdict class leads the outcome message: FAIL / ERROR / TIMEOUT fail the item,
  NON-STRICT / UNSUPPORTED / baselined verdicts skip it, PASS / INFO pass. Evidence goes to
  the captured output, hence to JUnit system-out.
* A case's result is encoded once where the case ends (harness/results/schema.py) and
  travels as an attribute of the call report, which xdist ships to the controller; it is
  decoded once where the report is assembled, so the controller writes
  reports/results.json and the HTML report in a fixed order.
* The run's state (options read once, results, failing items) is one RunState on
  the pytest config (harness/run/state.py); the time scale is a value handed to every case
  and driver, never written into the environment.
* Installed, the plugin is loaded into every pytest session of the virtualenv (entry point
  `corewire`), so it acts only in a session that asks for corewire (a corewire option or a
  path into the cases: `selection.corewire_requested`); any other session has no RunState
  and every hook below returns at once. `pytest --frontend X` with no path runs the cases.
* A frontend that cannot start is stopped after START_FAILURE_LIMIT start failures in a
  row (harness/run/failfast.py): its other cases are NOT-RUN, the run exits 7.
* junit.xml is written from the results beside results.json (harness/results/junit.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator
from typing import Any

import pytest

from harness.cases.declaration import CaseSpec, cases_of
from harness.frontends.table import FRONTENDS, make_driver
from harness.hygiene import ownership, worker_exit
from harness.results.baseline import Baseline, BaselineError, apply_baseline
from harness.results.bounds import bound_result
from harness.results.evidence import evidence_text
from harness.results.records import AREAS, CaseResult, Verdict
from harness.results.schema import encode_result
from harness.results.startup import StartAttempt
from harness.run import failfast, interrupts, selection, shard
from harness.run.options import (
    REPORT_DIR_LOCK,
    WORKER_FRONTENDS,
    check_usage,
    filtered,
    leave_junit_to_us,
    lock_report_dir,
    named_frontends,
    start_failures,
    terminal_is_ours,
    writes_report_set,
)
from harness.run.report_set import not_written_lines, unmatched_baseline_lines, write_report_set
from harness.run.state import RUN_STATE, RunState, run_state_of


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("corewire", "corewire conformance")
    group.addoption("--frontend", action="append", default=[],
                    help=f"frontend under test (repeatable), SPEC or NAME=SPEC: "
                         f"{FRONTENDS.usage} (default: reference; vllm-rs@X: vLLM release "
                         f"X's; kv:/ec: run the component cases). NAME (else a driver "
                         f"program's init name) keys reports and baselines")
    group.addoption("--timescale", type=float, default=None,
                    help="multiply every timing window (also COREWIRE_TIMESCALE)")
    group.addoption("--report-dir", default="reports",
                    help="where results.json, report.html and transcripts are written")
    group.addoption("--baseline", default=None, help="baseline file of tolerated verdicts")
    group.addoption("--profile", default=None,
                    help="protocol profile the mock engines speak (vllm-0.33 default; "
                         "`corewire profiles` lists them)")
    group.addoption("--update-baseline", action="store_true",
                    help="rewrite --baseline from this run's non-PASS verdicts (unfiltered runs)")
    group.addoption("--shard", default=None, metavar="I/N",
                    help="run only shard I of N (1-based): a stable hash of case id and "
                         "frontend picks each item's shard; `corewire merge` joins them")


# Warnings of the libraries under the cases, filtered in every corewire session (a checkout's
# pyproject.toml has them too, for corewire's own tests).
WARNING_FILTERS = ("ignore::DeprecationWarning:zmq.*", "ignore::DeprecationWarning:torch.*")


def _session(config: pytest.Config) -> RunState | None:
    """This session's corewire state; None in a session that did not ask for corewire."""
    return config.stash.get(RUN_STATE, None)


@pytest.hookimpl(tryfirst=True)  # before pytest's junitxml reads --junitxml
def pytest_configure(config: pytest.Config) -> None:
    if not selection.corewire_requested(config):
        return
    selection.point_at_cases(config)
    for line in WARNING_FILTERS:
        config.addinivalue_line("filterwarnings", line)
    for area in AREAS:
        config.addinivalue_line("markers", f"{area}: conformance cases of area {area}")
    for level in ("must", "should", "info"):
        config.addinivalue_line("markers", f"{level}: conformance cases of level {level}")
    run_config = check_usage(config)
    if selection.conformance_only(config) and not _is_worker(config):
        terminal_is_ours(config)
    path = config.getoption("baseline")
    if config.getoption("update_baseline"):
        if not path:
            raise pytest.UsageError("--update-baseline needs --baseline PATH")
        if filtered(config):
            raise pytest.UsageError("--update-baseline refuses a filtered run (-k, -m, "
                                    "node ids, --lf, --deselect): run the whole suite")
    try:
        baseline = Baseline.load(path) if path and os.path.exists(path) else None
    except BaselineError as exc:
        raise pytest.UsageError(str(exc)) from None
    if not _is_worker(config) and writes_report_set(config):
        lock_report_dir(config)  # before anything slow (naming probes a driver program)
    session = RunState(run_config, baseline, _is_worker(config))
    try:
        session.frontends = named_frontends(config, run_config)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    session.failfast = start_failures(config)
    session.verbose = config.getoption("verbose") > 0
    leave_junit_to_us(config)
    config.stash[RUN_STATE] = session
    config.pluginmanager.register(session, f"corewire-session-{id(session)}")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: a worker gets the run's frontend names and start-failure record."""
    run = _session(node.config)
    if run is None:
        return
    node.workerinput[WORKER_FRONTENDS] = [[f.name, f.spec] for f in run.frontends]
    if run.failfast is not None:
        node.workerinput[failfast.WORKER_KEY] = run.failfast.directory


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str,
                              obj: Any) -> list[pytest.Item] | None:
    declared = cases_of(obj)
    if not declared or not isinstance(collector, pytest.Module) \
            or _session(collector.config) is None:
        return None
    items: list[pytest.Item] = []
    for one in declared:
        spec = one.spec
        frontends = selection.wire_frontends(collector.config)
        if spec.area == "components":  # a component, not a frontend: only when asked for
            from harness.components import component_kind, component_slot

            kind = component_kind(spec.case_id)
            unit = run_state_of(collector.config).config.component_unit(kind)
            frontends = selection.component_labels(collector.config, spec.case_id,
                                                   component_slot(kind).label(unit))
        for frontend in frontends:
            item = pytest.Function.from_parent(collector, name=f"{spec.case_id}[{frontend}]",
                                               callobj=one.run,
                                               originalname=f"{spec.case_id}[{frontend}]")
            item.add_marker(spec.area)
            item.add_marker(spec.level.value.lower())
            item.corewire_spec = spec  # type: ignore[attr-defined]
            item.corewire_frontend = frontend  # type: ignore[attr-defined]
            items.append(item)
    return items


@pytest.fixture
def ctx() -> None:
    """Placeholder so case signatures resolve; the plugin passes the real CaseContext."""
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    spec: CaseSpec | None = getattr(pyfuncitem, "corewire_spec", None)
    if spec is None:
        return None
    from harness.cases.context import run_case

    config = pyfuncitem.config
    session = run_state_of(config)
    frontend: str = pyfuncitem.corewire_frontend  # type: ignore[attr-defined]
    report_dir = config.getoption("report_dir")
    stop = session.failfast.stopped(frontend) if session.failfast is not None else None
    if stop is not None:  # its frontend cannot start: one reason, no ERROR per case
        result = CaseResult(spec.case_id, frontend, spec.level.value, spec.source,
                            spec.requirement, Verdict.NOT_RUN, stop.reason(), 0.0)
        pyfuncitem.corewire_result = encode_result(result)  # type: ignore[attr-defined]
        pytest.skip(f"{Verdict.NOT_RUN.value}: {result.message}")
    attempt = StartAttempt()
    try:
        run_config = session.config.for_frontend(session.spec_of(frontend))
        driver = make_driver(run_config)
        driver.name = frontend  # the name every report keys on
        result = interrupts.run_interruptible(
            run_case(spec, pyfuncitem.obj, driver, os.path.join(report_dir, "transcripts"),
                     run_config, start_attempt=attempt))
    except Exception as exc:  # a harness fault is this case's ERROR, never a lost row
        result = CaseResult(spec.case_id, frontend, spec.level.value, spec.source,
                            spec.requirement, Verdict.ERROR,
                            f"harness fault: {type(exc).__name__}: {exc}", 0.0)
        if not attempt.attempted:  # a driver that cannot even be built does not start
            attempt = StartAttempt(True, result.message)
    if session.failfast is not None:
        session.failfast.record(frontend, attempt)
    outcome = apply_baseline(bound_result(result), session.baseline)
    # The one encode between the case and the reports (decoded in RunState).
    pyfuncitem.corewire_result = encode_result(result)  # type: ignore[attr-defined]
    print(evidence_text(result, report_dir))  # captured: JUnit system-out
    if outcome.fail:
        pyfuncitem.corewire_failure = outcome.message  # type: ignore[attr-defined]
        pytest.fail(outcome.message, pytrace=False)
    if outcome.skip:
        pytest.skip(outcome.message)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    run = _session(session.config)
    if run is None:
        return
    run.clear()
    interrupts.install()
    if not _is_worker(session.config):
        from harness.results.failsafe import guard_junit
        from harness.results.reportdir import clear_report_set

        ownership.sweep()  # what dead runs left: their driver programs, their temp dirs
        guard_junit(session.config, run_state_of(session.config).not_written)
        if not session.config.getoption("collectonly"):
            clear_report_set(session.config.getoption("report_dir"))


def pytest_unconfigure(config: pytest.Config) -> None:
    lock = config.stash.get(REPORT_DIR_LOCK, None)
    if lock is not None:  # also when configure failed after taking it
        lock.release()
    run = _session(config)
    if run is None:
        return
    interrupts.restore()
    if run.failfast is not None and not run.worker:
        run.failfast.remove()
    if config.pluginmanager.is_registered(run):
        config.pluginmanager.unregister(run)
    if run.worker:
        worker_exit.install()  # the last exit handler registered: the first to run


@pytest.hookimpl(optionalhook=True)
def pytest_testnodeready(node: Any) -> None:
    """An xdist worker: it gets the controller's first interrupt at once."""
    if _session(node.config) is None:
        return
    # No pid known: execnet itself interrupts the worker on teardown (after 5 s).
    with contextlib.suppress(Exception):
        interrupts.add_worker(int(node.gateway._rinfo().pid))


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched: Any) -> None:
    """xdist controller: a worker died mid-case; the case gets its ERROR row and what the
    worker left running is ended (harness/run/worker_crash.py)."""
    config = getattr(sched, "config", None)
    if config is not None and _session(config) is None:
        return
    from harness.run.worker_crash import crashed_case

    crashed_case(crashitem, report)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items: list[pytest.Item], config: pytest.Config
                                  ) -> Generator[None, None, None]:
    """`-k` by case names before pytest's own; the shard split after pytest's `-m`, so
    the selection's size in results.json's meta is the items `-m` kept (a `-m` run's
    merge counted every collected item and called the run partial)."""
    selection.deselect_by_keyword(items, config)
    yield
    shard.deselect_other_shards(items, config)
    run = _session(config)
    if run is not None:
        selection.preload_components(items, run.config)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: the selection sizes a worker counted (each worker collects all)."""
    counts = getattr(node, "workeroutput", {}).get("corewire_counts")
    if counts is not None:
        node.config._corewire_counts = tuple(counts)


def pytest_collection_finish(session: pytest.Session) -> None:
    if _session(session.config) is None:
        return
    selection.restore_keyword(session.config)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """An interrupt that arrived as a case finished: stop before the next one."""
    if interrupts.interrupted_by() is not None:
        raise KeyboardInterrupt


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the result to the call report; xdist ships report attributes to the
    controller, and JUnit does not see them (xunit2 allows no testcase properties)."""
    report = yield
    result = getattr(item, "corewire_result", None)
    if call.when == "call" and result is not None:
        report.corewire_result = result  # type: ignore[attr-defined]
        failure = getattr(item, "corewire_failure", None)
        if failure is not None:
            # A plain-text longrepr makes the verdict class lead the JUnit failure message.
            report.longrepr = failure
    return report


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    run = _session(config)
    if run is None:
        return
    _remove_leftover_ipc_dirs()
    if _is_worker(config):
        return
    from harness.results.failsafe import REPORTS_NOT_WRITTEN

    try:
        if not config.getoption("collectonly"):  # listed, not run: no report set
            write_report_set(session, exitstatus, run)
    finally:
        ownership.sweep()  # a worker that died outside a case left its registry
        if run.not_written:
            session.exitstatus = REPORTS_NOT_WRITTEN


def _remove_leftover_ipc_dirs() -> None:
    """Backstop after an interrupt: no private ipc dir of this process outlives the run."""
    from harness.protocol.transport.endpoints import PrivateIpcDir

    for path in sorted(ownership.LIVE_IPC_DIRS):
        PrivateIpcDir.remove(path)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config
                            ) -> None:
    """Counts, then the items that fail the run (one line each), the rest folded into
    counts by area unless -v (harness/results/summary.py), then where the evidence is."""
    run = _session(config)
    if run is None or run.worker:
        return
    results, partial = run.results, run.partial
    if not results and partial is None:
        this_shard = shard.configured_shard(config)
        selected = getattr(config, "_corewire_counts", (0, 0))[0]
        if this_shard is not None and selected:
            terminalreporter.write_line(f"corewire: shard {this_shard} drew none of the "
                                        f"selection's {selected} items; its empty report "
                                        f"is written for `corewire merge`")
        elif exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            terminalreporter.write_line(f"corewire: no case ran (exit 5): "
                                        f"{selection.why_no_case(config)}")
        if run.not_written:
            not_written_lines(terminalreporter, run.not_written)
        return
    from harness.results.summary import SummaryInput, summary_lines

    tr = terminalreporter
    tr.section("corewire verdicts")
    if partial is not None:
        tr.write_line(f"PARTIAL: {partial}; {len(results)} finished cases reported")
    for line in summary_lines(SummaryInput(results, run.failing_by_name(), run.stops,
                                           run.verbose)):
        tr.write_line(line, red=line.startswith("STOPPED"))
    for problem in run.outside:  # not a case's verdict, but it fails the run (exit 1)
        tr.write_line(f"ERROR outside any case: {problem}"[:2000], red=True)
    for line in unmatched_baseline_lines(config, run):
        tr.write_line(line, yellow=True)
    if config.getoption("update_baseline") and run.stops:
        tr.write_line("--update-baseline: not written, a frontend was stopped (STOPPED "
                      "above)", yellow=True)
    from harness.frontends.subprocess.program_process import stuck_driver_warning

    warning = stuck_driver_warning({f"{r.case_id}[{r.frontend}]": r.evidence.notes
                                    for r in results})
    if warning:
        tr.write_line(warning, yellow=True, bold=True)
    report_dir = config.getoption("report_dir")
    if run.not_written:
        not_written_lines(tr, run.not_written)
        return
    tr.write_line(f"reports: {os.path.join(report_dir, 'results.json')}, "
                  f"{os.path.join(report_dir, 'junit.xml')}, "
                  f"{os.path.join(report_dir, 'report.html')} (evidence and transcripts)")


