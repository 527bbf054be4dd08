"""pytest plugin: collects conformance cases, runs them per frontend, grades, reports.

* Each `@case` function becomes one pytest item per `--frontend`, named
  `<case id>[<frontend>]`, with a marker per area and level (`pytest -k abort`, `-m dp`).
* The verdict class leads the outcome message: FAIL / ERROR / TIMEOUT fail the item,
  NON-STRICT / UNSUPPORTED / baselined verdicts skip it, PASS / INFO pass. Evidence goes to
  the captured output, hence to JUnit system-out.
* Results travel as an attribute of the call report, which xdist ships to the controller,
  so the controller assembles reports/results.json and the HTML report in a fixed order.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Generator
from typing import Any

import pytest

from harness.baseline import Baseline, BaselineError, apply_baseline
from harness.frontends.registry import check_spec, make_driver
from harness.verdicts import AREAS, CaseResult, CaseSpec, Verdict
from harness.wire.profiles import ProtocolProfile, get_profile

PROPERTY = "corewire_result"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("corewire", "corewire conformance")
    group.addoption("--frontend", action="append", default=[],
                    help="frontend under test (repeatable): reference, reference-subprocess, "
                         "vllm-rs, vllm-rs@X (release X), vllm-py, subprocess:'CMD', "
                         "mutant:NAME")
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


def pytest_configure(config: pytest.Config) -> None:
    for area in AREAS:
        config.addinivalue_line("markers", f"{area}: conformance cases of area {area}")
    for level in ("must", "should", "info"):
        config.addinivalue_line("markers", f"{level}: conformance cases of level {level}")
    _check_usage(config)
    if config.getoption("timescale"):
        os.environ["COREWIRE_TIMESCALE"] = str(config.getoption("timescale"))
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
    config._corewire_baseline = baseline  # type: ignore[attr-defined]


def _check_usage(config: pytest.Config) -> None:
    """Bad options are one clear usage error (exit 4) before any case runs."""
    for spec in config.getoption("frontend"):
        try:
            check_spec(spec)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    name = config.getoption("profile")
    if name is not None:
        from harness.wire.profiles import UnknownProfileError, get_profile

        try:
            get_profile(name)
        except UnknownProfileError as exc:
            raise pytest.UsageError(f"--profile: {exc}") from None
    timescale = config.getoption("timescale")
    if timescale is not None and not timescale > 0:
        raise pytest.UsageError(f"--timescale must be a positive factor, got {timescale}")
    path = config.getoption("baseline")
    if path and not os.path.exists(path) and not config.getoption("update_baseline"):
        raise pytest.UsageError(f"--baseline {path}: no such file")


def _filtered(config: pytest.Config) -> bool:
    return bool(config.getoption("keyword") or config.getoption("markexpr")
                or any("::" in arg for arg in config.args)
                or config.getoption("lf", False) or config.getoption("deselect", None))


def _profile(config: pytest.Config) -> ProtocolProfile | None:
    """The --profile of this run (None: each driver's own, else vllm-0.33)."""
    name = config.getoption("profile")
    return None if name is None else get_profile(name)


def _frontends(config: pytest.Config) -> list[str]:
    return list(config.getoption("frontend")) or ["reference"]


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str,
                              obj: Any) -> list[pytest.Item] | None:
    spec: CaseSpec | None = getattr(obj, "__corewire_case__", None)
    if spec is None or not isinstance(collector, pytest.Module):
        return None
    items: list[pytest.Item] = []
    frontends = _frontends(collector.config)
    if spec.area == "components":  # they test a component, not a frontend: run once
        from harness.components import component_label

        frontends = [component_label(spec.case_id)]
    for frontend in frontends:
        item = pytest.Function.from_parent(collector, name=f"{spec.case_id}[{frontend}]",
                                           callobj=obj,
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
    from harness.case_context import run_case

    config = pyfuncitem.config
    frontend: str = pyfuncitem.corewire_frontend  # type: ignore[attr-defined]
    report_dir = config.getoption("report_dir")
    try:
        driver = make_driver(frontend)
        result = asyncio.run(run_case(spec, pyfuncitem.obj, driver,
                                      os.path.join(report_dir, "transcripts"),
                                      _profile(config)))
    except Exception as exc:  # a harness fault is this case's ERROR, never a lost row
        result = CaseResult(spec.case_id, frontend, spec.level.value, spec.source,
                            spec.requirement, Verdict.ERROR,
                            f"harness fault: {type(exc).__name__}: {exc}", 0.0)
    baseline: Baseline | None = config._corewire_baseline  # type: ignore[attr-defined]
    outcome = apply_baseline(result, baseline)
    pyfuncitem.corewire_result = json.dumps(result.to_json())  # type: ignore[attr-defined]
    _print_evidence(result)
    if outcome.fail:
        pyfuncitem.corewire_failure = outcome.message  # type: ignore[attr-defined]
        pytest.fail(outcome.message, pytrace=False)
    if outcome.skip:
        pytest.skip(outcome.message)
    return True


def _print_evidence(result: CaseResult) -> None:
    """Goes to captured stdout, i.e. JUnit system-out and pytest's failure section."""
    print(f"case: {result.case_id}  frontend: {result.frontend}  level: {result.level}")
    print(f"requirement: {result.requirement}")
    print(f"source: {result.source}")
    print(f"verdict: {result.verdict.value}: {result.message}")
    ev = result.evidence
    if ev.expected or ev.observed:
        print(f"expected: {ev.expected}\nobserved: {ev.observed}")
    for note in ev.notes:
        print(f"note: {note}")
    if ev.transcript:
        print(f"transcript ({len(ev.transcript)} records shown; full: {ev.transcript_file}):")
        for rec in ev.transcript:
            print("  " + json.dumps(rec, separators=(",", ":"))[:600])


_RESULTS: list[CaseResult] = []  # this process's session; reset at sessionstart


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _RESULTS.clear()
    session.config._corewire_results = _RESULTS  # type: ignore[attr-defined]


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


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Runs on the xdist controller too: collect every case result exactly once."""
    value = getattr(report, PROPERTY, None)
    if report.when == "call" and value is not None:
        _RESULTS.append(CaseResult.from_json(json.loads(value)))


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _is_worker(config):
        return
    results: list[CaseResult] = config._corewire_results  # type: ignore[attr-defined]
    if not results:
        return
    from harness.report.writer import write_reports

    results.sort(key=lambda r: (r.case_id, r.frontend))
    report_dir = config.getoption("report_dir")
    write_reports(results, report_dir, _profile(config))
    if config.getoption("update_baseline"):
        Baseline.from_results(results).save(config.getoption("baseline"))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config
                            ) -> None:
    results: list[CaseResult] = getattr(config, "_corewire_results", [])
    if _is_worker(config) or not results:
        return
    counts: dict[str, int] = {}
    for r in results:
        counts[r.verdict.value] = counts.get(r.verdict.value, 0) + 1
    tr = terminalreporter
    tr.section("corewire verdicts")
    tr.write_line("  ".join(f"{v.value}={counts.get(v.value, 0)}" for v in Verdict))
    for r in results:
        if r.verdict is not Verdict.PASS:
            flag = " (baselined)" if r.baseline else ""
            tr.write_line(f"{r.verdict.value:<11} {r.case_id}[{r.frontend}]{flag}: "
                          f"{r.message[:110]}")
    from harness.frontends.subprocess_driver import stuck_driver_warning

    warning = stuck_driver_warning({f"{r.case_id}[{r.frontend}]": r.evidence.notes
                                    for r in results})
    if warning:
        tr.write_line(warning, yellow=True, bold=True)
    tr.write_line(f"reports: {os.path.join(config.getoption('report_dir'), 'results.json')}, "
                  f"{os.path.join(config.getoption('report_dir'), 'report.html')}")
