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
* The run's state (options read once, results, failing items) is one CorewireSession on
  the pytest config (harness/run/state.py); the time scale is a value handed to every case
  and driver, never written into the environment.
* Installed, the plugin is loaded into every pytest session of the virtualenv (entry point
  `corewire`), so it acts only in a session that asks for corewire (a corewire option or a
  path into the cases: `selection.corewire_requested`); any other session has no CorewireSession
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
from harness.frontends import naming
from harness.frontends.run_config import RunConfig, RunConfigError
from harness.frontends.table import make_driver, parse_frontend
from harness.hygiene import ownership, worker_exit
from harness.protocol.wire.profiles import ProtocolProfile
from harness.results.baseline import Baseline, BaselineError, apply_baseline
from harness.results.bounds import bound_result
from harness.results.dirlock import ReportDirLock
from harness.results.evidence import evidence_text
from harness.results.records import AREAS, CaseResult, Verdict
from harness.results.schema import RunMeta, encode_result
from harness.results.startup import EXIT_FRONTEND_STOPPED, StartAttempt
from harness.run import failfast, interrupts, selection, shard
from harness.run.state import SESSION, CorewireSession, session_of


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("corewire", "corewire conformance")
    group.addoption("--frontend", action="append", default=[],
                    help="frontend under test (repeatable), SPEC or NAME=SPEC: reference "
                         "(default), reference-subprocess, vllm-rs, vllm-rs@X (release X), "
                         "vllm-py, subprocess:'CMD', mutant:NAME; kv:NAME / ec:NAME run the "
                         "component cases. NAME (else a driver program's init name) keys "
                         "reports and baselines")
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


def _session(config: pytest.Config) -> CorewireSession | None:
    """This session's corewire state; None in a session that did not ask for corewire."""
    return config.stash.get(SESSION, None)


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
    run_config = _check_usage(config)
    selection.configure_components(run_config)
    if selection.conformance_only(config) and not _is_worker(config):
        _terminal_is_ours(config)
    path = config.getoption("baseline")
    if config.getoption("update_baseline"):
        if not path:
            raise pytest.UsageError("--update-baseline needs --baseline PATH")
        if _filtered(config):
            raise pytest.UsageError("--update-baseline refuses a filtered run (-k, -m, "
                                    "node ids, --lf, --deselect): run the whole suite")
    try:
        baseline = Baseline.load(path) if path and os.path.exists(path) else None
    except BaselineError as exc:
        raise pytest.UsageError(str(exc)) from None
    if not _is_worker(config) and _writes_report_set(config):
        _lock_report_dir(config)  # before anything slow (naming probes a driver program)
    session = CorewireSession(run_config, baseline, _is_worker(config))
    try:
        session.frontends = _named_frontends(config, run_config)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    session.failfast = _start_failures(config)
    session.verbose = config.getoption("verbose") > 0
    _leave_junit_to_us(config)
    config.stash[SESSION] = session
    config.pluginmanager.register(session, f"corewire-session-{id(session)}")


REPORT_DIR_LOCK = pytest.StashKey[ReportDirLock]()


def _writes_report_set(config: pytest.Config) -> bool:
    """A conformance session, or one given --report-dir: it owns a report set (a session
    of corewire's own tests, which runs conformance sessions of its own, does not)."""
    if config.getoption("collectonly"):
        return False  # lists cases, runs none: the dir's reports are left as they are
    given = any(a == "--report-dir" or a.startswith("--report-dir=")
                for a in config.invocation_params.args)
    return given or selection.conformance_only(config)


def _lock_report_dir(config: pytest.Config) -> None:
    """Held by the controlling process for the whole run (harness/results/dirlock.py); a
    run already holding the dir makes this one a usage error naming it."""
    from harness.results.dirlock import ReportDirBusy, lock_report_dir

    report_dir = config.getoption("report_dir")
    try:
        config.stash[REPORT_DIR_LOCK] = lock_report_dir(report_dir)
    except ReportDirBusy as exc:
        raise pytest.UsageError(str(exc)) from None
    except OSError as exc:
        raise pytest.UsageError(f"--report-dir {report_dir}: {exc}") from None


def _check_usage(config: pytest.Config) -> RunConfig:
    """Bad options are one clear usage error (exit 4) before any case runs; returns the
    run's settings (RunConfig: the one place --profile, --timescale and the component
    units are read and checked)."""
    specs = []
    for value in config.getoption("frontend"):
        name, spec = naming.split_name(value)
        specs.append(spec)
        try:
            if name is not None and parse_frontend(spec).is_component:
                raise ValueError(f"--frontend {value!r}: kv:/ec: units name themselves; "
                                 f"give {spec!r} without a name")
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    try:
        run_config = RunConfig.from_options(specs, config.getoption("profile"),
                                            config.getoption("timescale"), os.environ)
    except RunConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    shard.configured_shard(config)
    path = config.getoption("baseline")
    if path and not os.path.exists(path) and not config.getoption("update_baseline"):
        raise pytest.UsageError(f"--baseline {path}: no such file")
    return run_config


WORKER_FRONTENDS = "corewire_frontends"  # the named frontends, in a worker's workerinput


def _named_frontends(config: pytest.Config, run_config: RunConfig
                     ) -> list[naming.NamedFrontend]:
    """The run's frontends by name: resolved once on the controller (a plain subprocess
    spec's program is asked its `init` name), handed to each xdist worker as they are, so
    every process collects the same items."""
    given = getattr(config, "workerinput", {}).get(WORKER_FRONTENDS)
    if given is not None:
        return [naming.NamedFrontend(name, spec) for name, spec in given]
    return naming.resolve(config.getoption("frontend"),
                          lambda spec: naming.probe_name(run_config.for_frontend(spec)))


def _start_failures(config: pytest.Config) -> failfast.StartFailures:
    """The run's shared record of start failures: the controller's dir, in every worker."""
    directory = getattr(config, "workerinput", {}).get(failfast.WORKER_KEY)
    if directory is not None:
        return failfast.StartFailures(directory)
    return failfast.StartFailures.create()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: a worker gets the run's frontend names and start-failure record."""
    run = _session(node.config)
    if run is None:
        return
    node.workerinput[WORKER_FRONTENDS] = [[f.name, f.spec] for f in run.frontends]
    if run.failfast is not None:
        node.workerinput[failfast.WORKER_KEY] = run.failfast.directory


def _leave_junit_to_us(config: pytest.Config) -> None:
    """`--junitxml` naming the report dir's junit.xml: corewire writes that file (one
    system-out per case, verdict properties); pytest's plugin would write over it."""
    xmlpath = getattr(config.option, "xmlpath", None)
    ours = os.path.join(config.getoption("report_dir"), "junit.xml")
    if xmlpath and os.path.abspath(xmlpath) == os.path.abspath(ours):
        config.option.xmlpath = None


def _terminal_is_ours(config: pytest.Config) -> None:
    """A conformance-only session: one line per non-PASS verdict (our summary) instead of
    pytest's failure pages; `--tb` / `-r` given on the command line still win."""
    if config.option.tbstyle == "auto":
        config.option.tbstyle = "no"
    if config.option.reportchars == "fE":  # pytest's default: keep errors outside cases
        config.option.reportchars = "E"  # (a leak found at session end, a fixture fault)


def _filtered(config: pytest.Config) -> bool:
    return bool(config.getoption("keyword") or config.getoption("markexpr")
                or any("::" in arg for arg in config.args)
                or config.getoption("lf", False) or config.getoption("deselect", None)
                or config.getoption("shard", None))


def _frontend_profiles(run: CorewireSession) -> dict[str, ProtocolProfile]:
    """The profile each wire frontend's engines spoke (its RunConfig's engine profile, as
    every case's context used it); component units speak no wire protocol."""
    configs = [run.config.for_frontend(f.spec) for f in run.frontends]
    return {f.name: c.engine_profile for f, c in zip(run.frontends, configs, strict=True)
            if not c.parsed.is_component}


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
            from harness.components import component_label

            frontends = selection.component_labels(collector.config, spec.case_id,
                                                   component_label(spec.case_id))
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
    session = session_of(config)
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
    # The one encode between the case and the reports (decoded in CorewireSession).
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
        guard_junit(session.config, session_of(session.config).not_written)
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
            _write_report_set(session, exitstatus, run)
    finally:
        ownership.sweep()  # a worker that died outside a case left its registry
        if run.not_written:
            session.exitstatus = REPORTS_NOT_WRITTEN


def _write_report_set(session: pytest.Session, exitstatus: int, run: CorewireSession
                      ) -> None:
    """results.json and report.html on the controller; a file that cannot be written is
    recorded in `run.not_written` (with transcripts the cases could not write), never
    raised: the verdicts are still printed and the session still torn down."""
    config = session.config
    results = run.results
    partial = run.partial = _partial_reason(exitstatus)
    run.stops = run.failfast.stops() if run.failfast is not None else []
    if run.stops and partial is None:
        session.exitstatus = EXIT_FRONTEND_STOPPED
    this_shard = shard.configured_shard(config)
    if this_shard is not None and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED \
            and getattr(config, "_corewire_counts", (0, 0))[0] > 0:
        session.exitstatus = pytest.ExitCode.OK  # the selection ran, just not here
    if not results and partial is None and this_shard is None:
        return
    from harness.results.junit import write_junit
    from harness.results.writer import write_reports

    results.sort(key=lambda r: (r.case_id, r.frontend))
    report_dir = config.getoption("report_dir")
    run_meta = RunMeta(
        shard=None if this_shard is None else [this_shard.index, this_shard.count],
        selection=shard.selection_meta(config),
        failing={f"{case}[{frontend}]": why
                 for (case, frontend), why in sorted(run.failing.items())},
        # Errors outside any case (a leak found at session end) fail the run too.
        failed_outside_cases=max(0, session.testsfailed - len(run.failing)))
    from harness.results.failsafe import TRANSCRIPT_NOT_WRITTEN, ReportsNotWritten, describe

    if run.stops:
        run_meta.stopped = list(run.stops)
    run.not_written += [note[len(TRANSCRIPT_NOT_WRITTEN):] for r in results
                        for note in r.evidence.notes if note.startswith(TRANSCRIPT_NOT_WRITTEN)]
    try:
        write_reports(results, report_dir, run.config.profile, partial, run_meta,
                      _frontend_profiles(run))
    except ReportsNotWritten as exc:
        run.not_written += exc.failures
    junit_path = os.path.join(report_dir, "junit.xml")
    try:
        write_junit(results, report_dir, run.failing_by_name(), run.outside,
                    {"frontends": " ".join(sorted({r.frontend for r in results}))})
    except OSError as exc:  # whole or absent: the partial file goes
        with contextlib.suppress(OSError):
            os.remove(f"{junit_path}.partial-{os.getpid()}")
        run.not_written.append(describe(junit_path, exc))
    if config.getoption("update_baseline") and partial is None and not run.stops:
        # (a stopped frontend's NOT-RUN cases would leave its baseline without them)
        path = config.getoption("baseline")
        try:
            Baseline.from_results(results).save(path)
        except OSError as exc:
            run.not_written.append(describe(path, exc))


def _partial_reason(exitstatus: int) -> str | None:
    signal_name = interrupts.interrupted_by()
    if signal_name is not None:
        return f"interrupted by {signal_name}"
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        return "interrupted"
    return None


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
            _not_written_lines(terminalreporter, run.not_written)
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
    for line in _unmatched_baseline_lines(config, run):
        tr.write_line(line, yellow=True)
    if config.getoption("update_baseline") and run.stops:
        tr.write_line("--update-baseline: not written, a frontend was stopped (STOPPED "
                      "above)", yellow=True)
    from harness.frontends.subprocess.driver import stuck_driver_warning

    warning = stuck_driver_warning({f"{r.case_id}[{r.frontend}]": r.evidence.notes
                                    for r in results})
    if warning:
        tr.write_line(warning, yellow=True, bold=True)
    report_dir = config.getoption("report_dir")
    if run.not_written:
        _not_written_lines(tr, run.not_written)
        return
    tr.write_line(f"reports: {os.path.join(report_dir, 'results.json')}, "
                  f"{os.path.join(report_dir, 'junit.xml')}, "
                  f"{os.path.join(report_dir, 'report.html')} (evidence and transcripts)")


def _not_written_lines(tr: Any, failures: list[str]) -> None:
    from harness.results.failsafe import REPORTS_NOT_WRITTEN

    tr.write_line(f"REPORTS NOT WRITTEN (exit {REPORTS_NOT_WRITTEN}): {len(failures)} "
                  f"file(s) of the report set could not be written; the verdicts above "
                  f"are this run's only record of them:", red=True, bold=True)
    for failure in failures[:20]:
        tr.write_line(f"  {failure}", red=True)
    if len(failures) > 20:
        tr.write_line(f"  ... and {len(failures) - 20} more", red=True)


def _unmatched_baseline_lines(config: pytest.Config, run: CorewireSession) -> list[str]:
    """Baseline entries this run could have used but did not (not a failure): in an
    unfiltered, uninterrupted run, entries of a frontend that ran naming no case it ran
    (a renamed or removed case); in any run, entries of frontends not in the run, which is
    how a frontend renamed since (an old absolute-path spec) shows."""
    from harness.results.baseline import unmatched_entries

    if run.baseline is None or run.partial is not None:
        return []
    unmatched = unmatched_entries(run.baseline, run.results)
    lines = [] if _filtered(config) else [
        f"UNMATCHED BASELINE {e.case}[{e.frontend}] ({e.verdict}): stale, no such item in "
        f"this run (not a failure); remove or rename the entry" for e in unmatched.stale]
    if unmatched.other_frontends:
        named = ", ".join(f"{name!r} ({count})"
                          for name, count in sorted(unmatched.other_frontends.items()))
        ran = ", ".join(sorted({r.frontend for r in run.results}))
        lines.append(f"baseline entries for frontends not in this run (this run: {ran}): "
                     f"{named}; a frontend renamed since keys its entries by its old name")
    return lines
