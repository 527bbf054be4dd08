"""What a port author reads (issue #24): the terminal summary, junit.xml, a TIMEOUT's
evidence, the driver-protocol exchange in a transcript, unused baseline entries.

The summary used to be ~290 lines for a young port, UNSUPPORTED mixed with FAIL, each line
cut at 200 characters (a long `subprocess:` spec pushed the reason off), and pytest's "185
passed" disagreed with PASS=184 (INFO). JUnit had two system-outs per skipped case, an
absolute path in the skip text, and NON-STRICT and UNSUPPORTED told apart only by a
message prefix; a TIMEOUT could say "no outcome within the case bound" and nothing more.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.cases.context import CaseContext, run_case
from harness.cases.declaration import CaseSpec
from harness.frontends.subprocess.driver import SubprocessDriver
from harness.frontends.table import REFERENCE_SUBPROCESS
from harness.results.evidence import REPO_ROOT
from harness.results.junit import junit_tree
from harness.results.records import CaseResult, Evidence, Level, Verdict
from harness.results.summary import REASON_CHARS, SummaryInput, summary_lines
from tests.test_drivers import SPEC, smoke
from tests.timescale import RUN_CONFIG

pytest_plugins = ["pytester"]
LONG = "a-port-with-a-rather-long-name-" + "x" * 30


def _row(case: str, verdict: Verdict, frontend: str = "p", message: str = "why",
         baseline: str | None = None) -> CaseResult:
    return CaseResult(case, frontend, "MUST", "src", "req", verdict, message, 0.25,
                      baseline=baseline)


def _young_port() -> list[CaseResult]:
    rows = [_row(f"abort.a.c{i}", Verdict.PASS) for i in range(5)]
    rows += [_row("dp.a.info", Verdict.INFO, message="recorded")]
    rows += [_row(f"utility.a.u{i}", Verdict.UNSUPPORTED, message="lacks call_utility")
             for i in range(40)]
    rows += [_row(f"handshake.a.u{i}", Verdict.UNSUPPORTED) for i in range(10)]
    rows += [_row("dp.a.ns", Verdict.NON_STRICT)]
    rows += [_row("abort.a.f", Verdict.FAIL, LONG, "expected one ABORT; observed 2 " * 20)]
    rows += [_row("streaming.a.t", Verdict.TIMEOUT), _row("dp.a.b", Verdict.FAIL,
                                                           baseline="known")]
    return rows


def test_the_summary_groups_by_class_then_area_and_folds_the_rest() -> None:
    rows = _young_port()
    failing = {"abort.a.f[" + LONG + "]": "FAIL: expected one ABORT; observed 2 " * 20,
               "streaming.a.t[p]": "TIMEOUT: why"}
    lines = summary_lines(SummaryInput(rows, failing))
    text = "\n".join(lines)
    assert lines[0].startswith("PASS=5  NON-STRICT=1  INFO=1  UNSUPPORTED=50  FAIL=2")
    # pytest's counts explained by the verdicts they hold: INFO is a pytest pass.
    assert lines[1] == ("pytest's count: 6 passed (INFO 1 + PASS 5), 52 skipped (BASELINED 1 "
                        "+ NON-STRICT 1 + UNSUPPORTED 50), 2 failed (FAIL 1 + TIMEOUT 1)")
    assert f"{LONG}: PASS" not in text and "p: PASS 5" in text  # one line per frontend
    assert "FAIL 1: abort 1" in lines and "TIMEOUT 1: streaming 1" in lines
    fail = next(ln for ln in lines if ln.startswith("FAIL        abort.a.f"))
    reason = fail.split("]: ", 1)[1]
    assert reason.startswith("expected one ABORT") and len(reason) == REASON_CHARS
    assert "UNSUPPORTED 50: handshake 10, utility 40 (-v lists them)" in lines
    assert "NON-STRICT 1: dp 1 (-v lists them)" in lines
    assert "BASELINED FAIL 1: dp 1 (-v lists them)" in lines
    assert "INFO 1: dp 1 (-v lists them)" in lines
    assert "utility.a.u1" not in text and len(lines) < 15
    verbose = "\n".join(summary_lines(SummaryInput(rows, failing, verbose=True)))
    assert "UNSUPPORTED utility.a.u1[p]: lacks call_utility" in verbose


def test_junit_properties_one_system_out_and_no_absolute_path(tmp_path: Path) -> None:
    where = f"{REPO_ROOT}/harness/frontends/subprocess/driver.py"
    rows = [_row("dp.a.ns", Verdict.NON_STRICT, message=f"see {where}"),
            _row("utility.a.u", Verdict.UNSUPPORTED),
            _row("abort.a.f", Verdict.FAIL, message="bad \x00 byte"),
            _row("dp.a.b", Verdict.FAIL, baseline="known"),
            _row("abort.a.n", Verdict.NOT_RUN)]
    rows[0].evidence = Evidence(notes=[f"log of {tmp_path}/transcripts/x.json"])
    failing = {"abort.a.f[p]": "FAIL: bad \x00 byte"}
    tree = junit_tree(rows, str(tmp_path), failing, ["conformance (teardown): leaked"])
    path = tmp_path / "junit.xml"
    tree.write(path, encoding="utf-8", xml_declaration=True)
    text = path.read_text()
    assert REPO_ROOT not in text and str(tmp_path) not in text
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped"),
            suite.get("errors")) == ("6", "1", "4", "1")
    cases = {c.get("name"): c for c in suite.findall("testcase")}

    def prop(name: str, key: str) -> str | None:
        found = cases[name].find(f"properties/property[@name='{key}']")
        return None if found is None else found.get("value")

    assert prop("dp.a.ns[p]", "verdict") == "NON-STRICT"
    assert prop("utility.a.u[p]", "verdict") == "UNSUPPORTED"
    assert prop("dp.a.b[p]", "baseline") == "known"
    assert prop("abort.a.n[p]", "outcome") == "skipped"
    assert cases["dp.a.b[p]"].find("skipped").get("message").startswith(  # type: ignore[union-attr]
        "BASELINED FAIL: why [known]")
    assert cases["abort.a.f[p]"].find("failure").get("message") == "FAIL: bad \\x00 byte"  # type: ignore[union-attr]
    for name, case in cases.items():
        if name.startswith("conformance"):
            assert case.find("error") is not None
            continue
        assert len(case.findall("system-out")) == 1, name
    assert cases["dp.a.ns[p]"].get("classname") == "conformance.dp"


def test_the_transcript_holds_the_driver_protocol_exchange() -> None:
    """A failing subprocess case shows what corewire sent the program and what it
    answered, in time order with the engines' frames."""
    driver = SubprocessDriver(REFERENCE_SUBPROCESS, name="crasher",
                              env={"COREWIRE_DRIVER_FAULT": "crash_on:is_sleeping"})
    result = asyncio.run(run_case(SPEC, smoke, driver, config=RUN_CONFIG))
    assert result.verdict is Verdict.ERROR, result.message
    lines = [r for r in result.evidence.transcript if r.get("channel") == "driver"]
    sent = [json.loads(r["line"])["cmd"] for r in lines if r["direction"] == "in"]
    assert sent[:3] == ["init", "wait_ready", "generate"] and "is_sleeping" in sent
    answered = [r["line"] for r in lines if r["direction"] == "out"]
    assert any(a.startswith('{"id":1,"ok":true,"name":') for a in answered)  # init's reply
    assert any(r.get("channel") != "driver" for r in result.evidence.transcript)
    times = [r["t"] for r in result.evidence.transcript]
    assert times == sorted(times)


def _bound_case(case: str) -> CaseSpec:
    return CaseSpec(f"streaming.bound.{case}", Level.MUST, "ends in time", "tests",
                    timeout=0.5)


async def waits_for_ever(ctx: CaseContext) -> None:
    await ctx.start(1)
    await ctx.wait_until(lambda: ctx.engines is None, 30)


async def inner_wait_times_out(ctx: CaseContext) -> None:
    await ctx.start(1)
    await asyncio.wait_for(asyncio.Event().wait(), 0.1)


def test_a_timeout_names_what_the_case_awaited() -> None:
    from harness.frontends.reference import ReferenceDriver

    result = asyncio.run(run_case(_bound_case("forever"), waits_for_ever, ReferenceDriver(),
                                  config=RUN_CONFIG))
    assert result.verdict is Verdict.TIMEOUT
    assert result.message.startswith("no outcome within the case bound (")
    assert "awaiting `await ctx.wait_until(lambda: ctx.engines is None, 30)` at " \
           "tests/test_port_output.py:" in result.message
    assert "-> " in result.message and "(poll_until)" in result.message
    assert result.evidence.expected.startswith("an outcome within the case bound")
    assert "ctx.wait_until" in result.evidence.observed


def test_a_wait_of_the_case_that_times_out_is_named_too() -> None:
    from harness.frontends.reference import ReferenceDriver

    result = asyncio.run(run_case(_bound_case("inner"), inner_wait_times_out,
                                  ReferenceDriver(), config=RUN_CONFIG))
    assert result.verdict is Verdict.TIMEOUT
    assert result.message.startswith("a wait of the case timed out at `await "
                                     "asyncio.wait_for(asyncio.Event().wait(), 0.1)` at "
                                     "tests/test_port_output.py:")
    assert result.evidence.observed.startswith("the wait ran out: `await asyncio.wait_for(")


CASES = textwrap.dedent("""
    from harness.results.records import Level
    from harness.cases.declaration import case

    @case("abort.unmatched_probe.one", Level.MUST, "passes", source="test")
    async def one(ctx):
        pass
""")


def test_unused_baseline_entries_are_reported_not_failed(pytester: pytest.Pytester) -> None:
    """An unfiltered run names each entry of a frontend it ran whose case it did not run
    (stale: renamed or removed), and counts the entries of frontends not in the run. The run
    names the probe module as its path (no -k, no node id: unfiltered) instead of running
    the whole wire suite in-process for the same check (2 minutes once it passed 520
    cases)."""
    probe = pytester.makepyfile(test_abort_unmatched_probe=CASES)
    baseline = pytester.path / "baseline.json"
    baseline.write_text(json.dumps({"entries": [
        {"case": "abort.unmatched_probe.gone", "frontend": "reference", "verdict": "FAIL",
         "reason": "renamed since"},
        {"case": "abort.unmatched_probe.one", "frontend": "subprocess:/old/path/drv",
         "verdict": "FAIL", "reason": "old name"}]}))
    result = pytester.runpytest(str(probe), "-p", "no:cacheprovider", "--report-dir",
                                str(pytester.path / "reports"), "--baseline", str(baseline))
    assert result.ret == 0
    out = result.stdout.str()
    assert ("UNMATCHED BASELINE abort.unmatched_probe.gone[reference] (FAIL): stale, no such "
            "item in this run (not a failure)") in out
    assert "'subprocess:/old/path/drv' (1)" in out
