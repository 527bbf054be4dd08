"""A frontend keeps one stable name wherever it is started from (issue #24).

The `--frontend` string used to be the name: `subprocess:/home/me/port/driver` on a laptop
and `subprocess:/ci/build/driver` on CI were two frontends, so the baseline silently
missed. Now: `NAME=SPEC`, else a driver program's `init` name, else a path-free short form
(harness/frontends/naming.py); the name is what results, JUnit, baselines and the terminal
use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.frontends.naming import (
    NamedFrontend,
    probe_name,
    resolve,
    sanitise,
    short_form,
    split_name,
)
from harness.results.baseline import Baseline, BaselineEntry, unmatched_entries
from harness.results.records import CaseResult, Verdict
from tests.timescale import RUN_CONFIG

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = "-m harness.frontends.subprocess.program"
SLEEPY = "mutant:sleeping_first_engine"  # FAILs dp.is_sleeping.disagree


def test_split_name_takes_only_a_leading_word() -> None:
    assert split_name("myport=subprocess:./driver --x") == ("myport", "subprocess:./driver --x")
    assert split_name("subprocess:./driver --level=3") == (None, "subprocess:./driver --level=3")
    assert split_name("vllm-rs@0.23.0") == (None, "vllm-rs@0.23.0")
    assert split_name("mutant:duplicate_abort") == (None, "mutant:duplicate_abort")
    assert split_name("a.b-c_1=reference") == ("a.b-c_1", "reference")


def test_the_short_form_has_no_directories_and_is_the_same_from_any_path() -> None:
    laptop = short_form("subprocess:/home/me/src/port/target/release/my-driver --verbose")
    ci = short_form("subprocess:/builds/ci/1234/target/release/my-driver --verbose")
    assert laptop == ci == "my-driver_verbose"
    long = short_form("subprocess:/x/python -m harness.frontends.subprocess.program "
                      "--frontend mutant:duplicate_abort")
    assert "/" not in long and len(long) <= 48
    assert long != short_form("subprocess:/x/python -m harness.frontends.subprocess.program "
                              "--frontend mutant:sleeping_first_engine")  # the digest
    assert short_form("vllm-rs@0.23.0") == "vllm-rs@0.23.0"


def test_sanitise_makes_a_node_id_safe_name() -> None:
    assert sanitise("reference (subprocess)") == "reference-subprocess"
    assert sanitise("my port/v2 :: beta") == "my-port-v2-:-beta"  # no `::`
    assert sanitise("x" * 100) == "x" * 64
    assert sanitise("  ///  ") == ""


def test_resolve_names_explicit_learned_and_fallback() -> None:
    learned = {"subprocess:/a/drv": "My Port", "subprocess:/b/silent": None}
    named = resolve(["reference", "ci=subprocess:/c/drv", "subprocess:/a/drv",
                     "subprocess:/b/silent"], lambda spec: learned.get(spec))
    assert named == [NamedFrontend("reference", "reference"),
                     NamedFrontend("ci", "subprocess:/c/drv"),
                     NamedFrontend("My-Port", "subprocess:/a/drv"),
                     NamedFrontend("silent", "subprocess:/b/silent")]


def test_a_learned_name_already_taken_falls_back_then_counts() -> None:
    named = resolve(["reference-subprocess", "subprocess:/a/x", "subprocess:/b/x"],
                    lambda spec: "reference (subprocess)")
    assert [f.name for f in named] == ["reference-subprocess", "x", "x-2"]


def test_a_name_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="given twice"):
        resolve(["p=reference", "p=mutant:duplicate_abort"], lambda spec: None)


def test_the_probe_learns_the_init_name_and_leaves_nothing() -> None:
    """One start of the program, `init`, then its normal teardown (no engine started)."""
    from harness.hygiene.leaks import leaks_since, snapshot

    before = snapshot()
    assert probe_name(RUN_CONFIG.for_frontend(f"subprocess:{sys.executable} {PROGRAM}")) == \
        "reference (subprocess)"
    assert probe_name(RUN_CONFIG.for_frontend(
        f"subprocess:{sys.executable} -c 'raise SystemExit(1)'")) is None
    assert leaks_since(before) == []


def _pytest(tmp: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-n", "0",
            "-p", "no:cacheprovider", "--report-dir", str(tmp), *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_same_port_from_two_paths_is_one_frontend_and_meets_its_baseline(
        tmp_path: Path) -> None:
    """Run the same mutant port (one FAIL) from an absolute and a relative python path,
    named by its init reply: the same rows, JUnit names and baseline key; the baseline of
    the absolute-path run tolerates the relative-path run's FAIL."""
    case = "dp.is_sleeping.disagree"
    relative = os.path.relpath(sys.executable, ROOT)
    rows = {}
    for label, python in (("abs", sys.executable), ("rel", relative)):
        proc = _pytest(tmp_path / label, "-k", f"{case} and not names and not reversed",
                       "--frontend", f"subprocess:{python} {PROGRAM} --frontend {SLEEPY}")
        assert proc.returncode == 1, proc.stdout[-2000:]
        rows[label] = json.loads((tmp_path / label / "results.json").read_text())["results"]
        assert f"FAIL        {case}[{SLEEPY}-subprocess]: expected" in proc.stdout
        junit = (tmp_path / label / "junit.xml").read_text()
        assert f'name="{case}[{SLEEPY}-subprocess]"' in junit and str(ROOT) not in junit
    assert [(r["id"], r["frontend"], r["verdict"]) for r in rows["abs"]] == \
        [(r["id"], r["frontend"], r["verdict"]) for r in rows["rel"]] == \
        [(case, f"{SLEEPY}-subprocess", "FAIL")]
    baseline = tmp_path / "baseline.json"
    Baseline.from_results([CaseResult(case, f"{SLEEPY}-subprocess", "MUST", "", "",
                                      Verdict.FAIL)]).save(str(baseline))
    proc = _pytest(tmp_path / "again", "-k", f"{case} and not names and not reversed",
                   "--frontend", f"subprocess:{relative} {PROGRAM} --frontend {SLEEPY}",
                   "--baseline", str(baseline))
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "BASELINED FAIL 1: dp 1" in proc.stdout


def test_an_explicit_name_keys_every_report_and_the_old_name_is_reported(
        tmp_path: Path) -> None:
    """`--frontend myport=SPEC`: items, results and JUnit say myport; a baseline keyed by
    the old spec string is named in the summary instead of silently missing."""
    baseline = tmp_path / "baseline.json"
    old = f"subprocess:/home/someone/port/driver {PROGRAM}"
    Baseline({("dp.is_sleeping.disagree", old): BaselineEntry(
        "dp.is_sleeping.disagree", old, "FAIL", "old name", "", "2099-01-01")}).save(
        str(baseline))
    proc = _pytest(tmp_path / "r", "-k", "dp.is_sleeping.all_true",
                   "--frontend", f"myport=subprocess:{sys.executable} {PROGRAM}",
                   "--baseline", str(baseline))
    assert proc.returncode == 0, proc.stdout[-2000:]
    rows = json.loads((tmp_path / "r" / "results.json").read_text())
    assert [(r["id"], r["frontend"]) for r in rows["results"]] == [
        ("dp.is_sleeping.all_true", "myport")]
    assert rows["meta"]["selection"]["frontends"] == ["myport"]
    assert "baseline entries for frontends not in this run (this run: myport)" in proc.stdout
    assert repr(old) in proc.stdout


def test_unmatched_baseline_entries_of_a_frontend_that_ran() -> None:
    entries = [BaselineEntry("a.b.c", "p", "FAIL", "r"),
               BaselineEntry("a.b.gone", "p", "FAIL", "r"),
               BaselineEntry("a.b.c", "other", "FAIL", "r")]
    baseline = Baseline({(e.case, e.frontend): e for e in entries})
    ran = [CaseResult("a.b.c", "p", "MUST", "", "", Verdict.FAIL)]
    unmatched = unmatched_entries(baseline, ran)
    assert [(e.case, e.frontend) for e in unmatched.stale] == [("a.b.gone", "p")]
    assert unmatched.other_frontends == {"other": 1}


@pytest.mark.parametrize("value, says", [
    ("p=kv:reference", "units name themselves"),
    ("p=reference", None),
    ("bad name=reference", "unknown frontend"),
])
def test_name_usage(tmp_path: Path, value: str, says: str | None) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "conformance"),
                           "--collect-only", "-q", "-p", "no:cacheprovider", "--frontend",
                           value, "--frontend", "p=mutant:duplicate_abort", "-k",
                           "abort.drop.single"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    if says is None:  # p twice
        assert proc.returncode == 4 and "given twice" in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 4 and says in proc.stderr, proc.stderr
