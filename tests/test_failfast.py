"""A port that cannot start is stopped after 3 start failures in a row (issue #24).

It used to be restarted for every case: 468 identical "driver exited (code 1) with no
reply to init" ERROR lines. Now one STOPPED line quotes the cause and the program's stderr
tail, the remaining cases are NOT-RUN (counted once), and the run exits 6
(harness/run/failfast.py, docs/cli.md), with xdist workers sharing the count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.results.startup import EXIT_FRONTEND_STOPPED, StartAttempt, cause_key, stderr_tail
from harness.run.failfast import START_FAILURE_LIMIT, StartFailures

ROOT = Path(__file__).resolve().parent.parent
NO_MSGSPEC = """\
import sys
sys.stderr.write("Traceback (most recent call last):\\n  File \\"driver.py\\", line 1\\n"
                 "ModuleNotFoundError: No module named 'msgspec'\\n")
sys.exit(1)
"""
FAILED = StartAttempt(True, "driver fault: driver exited (code 1) with no reply to `init` (id 1)")


def test_three_failures_with_one_cause_stop_the_frontend(tmp_path: Path) -> None:
    record = StartFailures(str(tmp_path))
    assert START_FAILURE_LIMIT == 3
    assert record.record("p", FAILED) is None
    assert record.record("p", StartAttempt(True, FAILED.failure.replace("1)", "7)"))) is None
    stop = record.record("p", FAILED)  # the same cause, numbers aside
    assert stop is not None and stop.failures == 3 and stop.frontend == "p"
    assert record.stopped("p") == stop and record.stopped("q") is None
    assert record.stops() == [stop]
    assert record.record("p", FAILED) is None  # said once


def test_a_start_or_another_cause_breaks_the_row(tmp_path: Path) -> None:
    record = StartFailures(str(tmp_path))
    for attempt in (FAILED, FAILED, StartAttempt(True), FAILED, FAILED,
                    StartAttempt(True, "driver: no reply to `init` (id 1) within 30.0 s"),
                    FAILED, FAILED, StartAttempt(False)):  # not attempted: no change
        assert record.record("p", attempt) is None
    assert record.stopped("p") is None
    assert record.record("p", FAILED) is not None


RECORD_TEN = """\
import sys
from harness.results.startup import StartAttempt
from harness.run.failfast import StartFailures
for _ in range(10):
    StartFailures(sys.argv[1], limit=1000).record("p", StartAttempt(True, "exited"))
"""


def test_workers_share_the_count(tmp_path: Path) -> None:
    """Processes recording at once (xdist workers) lose no count: the file is locked."""
    record = tmp_path / "record"
    record.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", RECORD_TEN, str(record)], cwd=ROOT)
             for _ in range(4)]
    assert [p.wait(timeout=60) for p in procs] == [0] * 4
    state = json.loads(next(record.iterdir()).read_text())
    assert state["failures"] == 40


def test_cause_and_stderr_tail() -> None:
    assert cause_key("exited (code 1), id 12, 3.5 s") == cause_key("exited (code 2), id 1, 30 s")
    tail = stderr_tail("a\n\nTraceback\n  File x\nModuleNotFoundError: msgspec\n")
    assert tail == "Traceback | File x | ModuleNotFoundError: msgspec"


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_port_that_cannot_start_stops_with_one_line(tmp_path: Path, workers: str) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(NO_MSGSPEC)
    report = tmp_path / "reports"
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-n", workers,
         "-p", "no:cacheprovider", "-m", "abort", "--report-dir", str(report),
         "--frontend", f"myport=subprocess:{sys.executable} {driver}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "TMPDIR": str(private_tmp)})
    out = proc.stdout
    assert proc.returncode == EXIT_FRONTEND_STOPPED, out[-3000:] + proc.stderr[-2000:]
    doc = json.loads((report / "results.json").read_text())
    verdicts = [r["verdict"] for r in doc["results"]]
    errors, not_run = verdicts.count("ERROR"), verdicts.count("NOT-RUN")
    # -n 2: a case the other worker had started when the third failure landed still ends.
    assert errors == 3 if workers == "0" else 3 <= errors <= 4, verdicts
    assert errors + not_run == len(verdicts) > 40
    stopped = [ln for ln in out.splitlines() if ln.startswith("STOPPED ")]
    assert len(stopped) == 1, out
    assert ("STOPPED myport: could not start 3 times in a row: driver fault: driver exited "
            "(code 1) with no reply to `init`") in stopped[0]
    assert "ModuleNotFoundError: No module named 'msgspec'" in stopped[0]
    assert f"its {not_run} remaining case(s) not run (exit 7)" in stopped[0]
    assert "ERROR       abort." not in out  # the start failures are that one line
    assert f"NOT-RUN {not_run}: abort {not_run}" in out
    assert len(out.splitlines()) < 20, out
    assert doc["meta"]["stopped"][0]["frontend"] == "myport"
    # JUnit: NOT-RUN is a skip with its verdict property; one system-out per testcase.
    suite = ET.parse(report / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert len(cases) == len(verdicts)
    for case in cases:
        assert len(case.findall("system-out")) == 1
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert len(skipped) == not_run
    assert all(c.find("properties/property[@name='verdict']").get("value") == "NOT-RUN"
               for c in skipped)  # type: ignore[union-attr]
    # The start failure's transcript holds the protocol exchange: the unanswered init.
    failed = next(r for r in doc["results"] if r["verdict"] == "ERROR")
    records = json.loads(Path(failed["evidence"]["transcript_file"]).read_text())
    assert [(r["channel"], r["direction"]) for r in records] == [("driver", "in")]
    assert '"cmd":"init"' in records[0]["line"]
    left = [p.name for p in private_tmp.iterdir() if not p.name.startswith("pytest-of-")]
    assert left == []  # the shared record (and every ipc dir) is gone with the run
    # `corewire merge` of the run (an unsharded run is shard 1/1) keeps the stop and its exit.
    merged = subprocess.run([sys.executable, "-m", "harness.run.cli", "merge", str(report),
                             "--report-dir", str(tmp_path / "merged")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert merged.returncode == EXIT_FRONTEND_STOPPED, merged.stdout + merged.stderr
    assert "STOPPED myport: could not start 3 times in a row" in merged.stdout
    assert json.loads((tmp_path / "merged" / "results.json").read_text()
                      )["meta"]["stopped"] == doc["meta"]["stopped"]
