"""Reports people and dashboards use: JUnit, JSON, baselines, diff, exit codes, -k.

Each test runs the real conformance suite in a child pytest (the way CI runs it), against
the reference frontend or a mutant that is known to fail specific cases.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest
from junitparser import Error, Failure, JUnitXml, Skipped

from harness.results.baseline import Baseline, BaselineEntry, apply_baseline
from harness.results.diff import diff_results, format_diff
from harness.results.records import CaseResult, Verdict
from harness.results.schema import as_builtins

ROOT = Path(__file__).resolve().parent.parent
SLEEPY = "mutant:sleeping_first_engine"  # fails exactly the is_sleeping disagreement cases
SLEEPY_FAILS = ["dp.is_sleeping.disagree", "dp.is_sleeping.disagree_names_values",
                "dp.is_sleeping.disagree_reversed"]
LAST_BLOCK_SIZE = "mutant:block_size_last_wins"  # NON-STRICT on block_size_dp_disagree only


def run_suite(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-p",
            "no:cacheprovider", "--report-dir", str(tmp), f"--junitxml={tmp / 'junit.xml'}",
            "-o", "junit_family=xunit2", "-o", "junit_logging=system-out", *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)


def results_of(tmp: Path) -> list[dict[str, object]]:
    return json.loads((tmp / "results.json").read_text())["results"]  # type: ignore[no-any-return]


def test_junit_of_a_failing_frontend(tmp_path: Path) -> None:
    # One SHOULD case the second mutant misses, so a NON-STRICT is in the report too.
    proc = run_suite(tmp_path, "-k", "dp.is_sleeping or handshake.ready.block_size_dp_disagree",
                     "--frontend", SLEEPY, "--frontend", LAST_BLOCK_SIZE)
    assert proc.returncode == 1, proc.stdout[-2000:]
    verdicts = {(r["id"], r["frontend"]): r["verdict"] for r in results_of(tmp_path)}
    fails = sorted(k for k, v in verdicts.items() if v == "FAIL")
    assert fails == [(c, SLEEPY) for c in SLEEPY_FAILS]
    xml = JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    cases = [case for suite in xml for case in suite]
    assert len(cases) == len(verdicts)
    failed = {c.name: c.result[0] for c in cases if c.result and isinstance(c.result[0], Failure)}
    assert sorted(failed) == sorted(f"{k}[{f}]" for k, f in fails)
    for result in failed.values():
        assert result.message.startswith("FAIL: ")
    skipped = {c.name: c.result[0].message.split(":")[0] for c in cases
               if c.result and isinstance(c.result[0], Skipped)}
    assert skipped == {f"handshake.ready.block_size_dp_disagree[{LAST_BLOCK_SIZE}]":
                       "NON-STRICT"}
    assert not any(c.result and isinstance(c.result[0], Error) for c in cases)
    failing = next(c for c in cases if c.name == f"dp.is_sleeping.disagree[{SLEEPY}]")
    assert "requirement:" in failing.system_out and "transcript" in failing.system_out


def test_json_results_are_complete_and_ordered(tmp_path: Path) -> None:
    proc = run_suite(tmp_path, "-m", "abort", "-n", "2")
    assert proc.returncode == 0, proc.stdout[-2000:]
    records = results_of(tmp_path)
    assert records, "no results"
    keys = [(r["id"], r["frontend"]) for r in records]
    assert keys == sorted(keys)  # type: ignore[type-var]
    assert all(str(r["id"]).startswith("abort.") for r in records)
    assert {"id", "level", "source", "verdict", "duration", "evidence"} <= set(records[0])


def _collected(*selection: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "conformance"),
                           "--collect-only", "-q", "-p", "no:cacheprovider", *selection],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    return [line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line]


def test_m_abort_runs_only_the_abort_area() -> None:
    items = _collected("-m", "abort")
    assert items and all(item.startswith("abort.") for item in items)


def test_k_abort_runs_every_case_named_abort() -> None:
    """`-k abort` matches names: the whole abort area plus cases about engine-side aborts
    (e.g. streaming.finish_kinds.abort_mid_2_engines), never anything else."""
    items = _collected("-k", "abort")
    assert set(_collected("-m", "abort")) <= set(items)
    assert all("abort" in item.split("[", 1)[0] for item in items)


def test_zero_cases_is_a_nonzero_exit(tmp_path: Path) -> None:
    assert run_suite(tmp_path, "-k", "no_such_case_anywhere").returncode == 5


def _baseline(path: Path, *entries: BaselineEntry) -> Path:
    Baseline({(e.case, e.frontend): e for e in entries}).save(str(path))
    return path


def _entry(case: str, verdict: str = "FAIL", expires: str = "2099-01-01") -> BaselineEntry:
    return BaselineEntry(case, SLEEPY, verdict, "port under development", "https://x/1",
                         expires)


def test_baseline_tolerates_known_failures(tmp_path: Path) -> None:
    base = _baseline(tmp_path / "b.json", _entry("dp.is_sleeping.disagree"),
                     _entry("dp.is_sleeping.disagree_reversed"),
                     _entry("dp.is_sleeping.disagree_names_values"))
    proc = run_suite(tmp_path, "-k", "dp.is_sleeping", "--frontend", SLEEPY,
                     "--baseline", str(base))
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "BASELINED FAIL" in proc.stdout or "(baselined)" in proc.stdout


def test_stale_baseline_entry_fails_the_run(tmp_path: Path) -> None:
    base = _baseline(tmp_path / "b.json", _entry("dp.is_sleeping.disagree"),
                     _entry("dp.is_sleeping.disagree_reversed"),
                     _entry("dp.is_sleeping.all_true"))  # passes: stale
    proc = run_suite(tmp_path, "-k", "dp.is_sleeping", "--frontend", SLEEPY,
                     "--baseline", str(base))
    assert proc.returncode == 1
    assert "STALE BASELINE" in proc.stdout


def test_expired_baseline_entry_fails_the_run(tmp_path: Path) -> None:
    base = _baseline(tmp_path / "b.json", _entry("dp.is_sleeping.disagree", expires="2020-01-01"),
                     _entry("dp.is_sleeping.disagree_reversed"))
    proc = run_suite(tmp_path, "-k", "dp.is_sleeping", "--frontend", SLEEPY,
                     "--baseline", str(base))
    assert proc.returncode == 1
    assert "EXPIRED BASELINE" in proc.stdout


def test_update_baseline_refuses_a_filtered_run(tmp_path: Path) -> None:
    proc = run_suite(tmp_path, "-k", "abort", "--baseline", str(tmp_path / "b.json"),
                     "--update-baseline")
    assert proc.returncode == 4
    assert "refuses a filtered run" in proc.stderr + proc.stdout


def _result(case: str, verdict: Verdict) -> CaseResult:
    return CaseResult(case, "fe", "MUST", "src", "req", verdict, "m", 0.0)


@pytest.mark.parametrize(("entry_verdict", "verdict", "expires", "fail", "skip", "prefix"), [
    ("FAIL", Verdict.FAIL, "2099-01-01", False, True, "BASELINED"),
    ("FAIL", Verdict.PASS, "2099-01-01", True, False, "STALE BASELINE"),
    ("FAIL", Verdict.FAIL, "2020-01-01", True, False, "EXPIRED BASELINE"),
    ("FAIL", Verdict.TIMEOUT, "2099-01-01", True, False, "TIMEOUT"),
])
def test_baseline_rules(entry_verdict: str, verdict: Verdict, expires: str, fail: bool,
                        skip: bool, prefix: str) -> None:
    base = Baseline({("c.a.b", "fe"): BaselineEntry("c.a.b", "fe", entry_verdict, "r", "",
                                                     expires)})
    outcome = apply_baseline(_result("c.a.b", verdict), base, dt.date(2026, 11, 22))
    assert (outcome.fail, outcome.skip) == (fail, skip)
    assert outcome.message.startswith(prefix)


def test_unbaselined_verdicts_map_to_outcomes() -> None:
    for verdict, fail, skip in [(Verdict.PASS, False, False), (Verdict.INFO, False, False),
                                (Verdict.NON_STRICT, False, True),
                                (Verdict.UNSUPPORTED, False, True), (Verdict.FAIL, True, False),
                                (Verdict.ERROR, True, False), (Verdict.TIMEOUT, True, False)]:
        outcome = apply_baseline(_result("c.a.b", verdict), None)
        assert (outcome.fail, outcome.skip) == (fail, skip), verdict
        assert outcome.message.startswith(verdict.value)


def test_diff_reports_transitions(tmp_path: Path) -> None:
    old = [_result("a.b.c", Verdict.PASS), _result("a.b.d", Verdict.FAIL)]
    new = [_result("a.b.c", Verdict.FAIL), _result("a.b.d", Verdict.PASS),
           _result("a.b.e", Verdict.PASS)]
    transitions = diff_results(old, new)
    assert [(t.case_id, t.old, t.new, t.regression) for t in transitions] == [
        ("a.b.c", "PASS", "FAIL", True), ("a.b.d", "FAIL", "PASS", False),
        ("a.b.e", "absent", "PASS", False)]
    assert "1 regression" in format_diff(transitions)
    for name, results in (("old.json", old), ("new.json", new)):
        (tmp_path / name).write_text(json.dumps(
            {"meta": {}, "results": [as_builtins(r) for r in results]}))
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "diff",
                           str(tmp_path / "old.json"), str(tmp_path / "new.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "REGRESSION" in proc.stdout


def test_k_never_matches_the_frontend_name() -> None:
    """`--frontend mutant:duplicate_abort` used to make every item match `-k abort`."""
    frontend = "mutant:duplicate_abort"
    items = _collected("-k", "abort", "--frontend", frontend)
    assert items and all("abort" in item.split("[", 1)[0] for item in items), items[:5]
    reference = _collected("-k", "abort")
    assert len(items) == len(reference)
    assert _collected("-k", "not abort", "--frontend", frontend)  # the rest stays selectable
    single = _collected("-k", "abort.drop.single[mutant:duplicate_abort]", "--frontend", frontend)
    assert single == [f"abort.drop.single[{frontend}]"]


def test_component_cases_only_when_asked_for() -> None:
    def labels(*selection: str) -> set[str]:
        return {item.split("[", 1)[1] for item in _collected(*selection)}

    for selection in ((), ("--frontend", "vllm-rs"), ("-m", "dp")):
        assert not any(lab.startswith(("kv:", "ec:")) for lab in labels(*selection)), selection
    assert labels("-m", "components") == {"kv:reference]", "ec:reference]"}
    kv_only = _collected("--frontend", "kv:reference")
    assert kv_only and all(item.startswith("components.kv_failure.") for item in kv_only)
    # a path into conformance/components asks for them (beside the whole suite here)
    assert {"kv:reference]", "ec:reference]"} <= labels(str(ROOT / "conformance" /
                                                           "components"))


def test_a_filtered_run_leaves_only_its_own_reports(tmp_path: Path) -> None:
    """A second run with `-k` (no --junitxml) used to leave the first run's junit.xml and
    transcripts beside its own results.json; now it writes its own junit.xml."""
    assert run_suite(tmp_path, "-k", "dp.is_sleeping", "--frontend", SLEEPY).returncode == 1
    assert (tmp_path / "junit.xml").exists() and list((tmp_path / "transcripts").iterdir())
    (tmp_path / "mine.txt").write_text("not ours")
    proc = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q",
                           "-p", "no:cacheprovider", "--report-dir", str(tmp_path),
                           "-k", "abort.drop.single"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert {r["id"] for r in results_of(tmp_path)} == {"abort.drop.single"}
    # junit.xml is the plugin's, beside results.json: this run's one case only.
    xml = JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    assert [case.name for suite in xml for case in suite] == ["abort.drop.single[reference]"]
    assert not list((tmp_path / "transcripts").iterdir())
    assert (tmp_path / "mine.txt").exists()  # only our own files are cleared
    assert "dp.is_sleeping" not in (tmp_path / "report.html").read_text()


def test_terminal_and_junit_output_of_a_failing_mutant(tmp_path: Path) -> None:
    """One line per non-PASS verdict and a pointer to the reports (it used to be pages of
    hex); JUnit system-out capped, with paths relative to the report dir."""
    from harness.results.evidence import SYSTEM_OUT_CAP

    proc = run_suite(tmp_path, "-k", "dp.is_sleeping", "--frontend", SLEEPY)
    assert proc.returncode == 1
    non_pass = [(r["id"], r["frontend"]) for r in results_of(tmp_path)
                if r["verdict"] != "PASS"]
    assert len(non_pass) == 3
    for case, frontend in non_pass:
        lines = [ln for ln in proc.stdout.splitlines() if f"{case}[{frontend}]" in ln]
        assert len(lines) == 1, lines
    assert "reports: " in proc.stdout and "results.json" in proc.stdout
    assert "transcript (" not in proc.stdout and '"hex"' not in proc.stdout
    assert len(proc.stdout) < 3000, proc.stdout
    xml = JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    outs = [case.system_out or "" for suite in xml for case in suite]
    assert any("full: transcripts/dp.is_sleeping.disagree[" in out for out in outs)
    for out in outs:
        assert len(out) <= SYSTEM_OUT_CAP + 200
        assert str(tmp_path) not in out and str(ROOT) not in out


def test_evidence_cap_keeps_head_and_tail() -> None:
    from harness.results.evidence import cap

    text = "HEAD" + "x" * 50_000 + "TAIL"
    capped = cap(text, 8192)
    assert len(capped) == 8192
    assert capped.startswith("HEAD") and capped.endswith("TAIL") and "characters cut" in capped
    assert cap("short", 8192) == "short"
