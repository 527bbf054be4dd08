"""One run owns its --report-dir (harness/results/dirlock.py): a second run with the same
report dir while one is running is a usage error (exit 4, one line naming the holder: pid,
start time, command), and the running one's report set is its own alone. A holder that
died (SIGKILL) blocks no one.

Before: both runs exited 0 and the files held a mix of the two runs' rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.results.dirlock import LOCK_NAME, ReportDirBusy, lock_report_dir
from tests.timescale import scaled

ROOT = Path(__file__).resolve().parent.parent
CASE = "streaming.finish.length"


def _python() -> str:
    return os.path.relpath(sys.executable, ROOT)  # a relative command, with a slash


def test_a_second_run_on_a_busy_report_dir_is_a_usage_error(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    gate = tmp_path / "gate"
    gated = f"subprocess:{_python()} tests/gated_driver.py {gate}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(
        [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-n", "0", "-p",
         "no:cacheprovider", "-k", CASE, "--frontend", gated, "--report-dir", str(reports),
         "--timescale", "3"],  # the case's bound outlasts the gate (two runs start meanwhile)
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + scaled(60)
        while not Path(f"{gate}.waiting").exists():  # the first run is mid-case
            assert first.poll() is None and time.monotonic() < deadline, "no case started"
            time.sleep(0.05)
        for how in ("corewire run", "pytest"):
            argv = ([sys.executable, "-m", "harness.run.cli", "run"] if how == "corewire run" else
                    [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-p",
                     "no:cacheprovider"])
            second = subprocess.run([*argv, "-k", CASE, "--report-dir", str(reports)],
                                    cwd=ROOT, env=env, capture_output=True, text=True,
                                    timeout=120)
            said = second.stdout + second.stderr
            assert second.returncode == 4, (how, said[-2000:])
            assert "Traceback" not in said, said
            line = next((x for x in second.stderr.splitlines() if "in use by" in x), "")
            assert f"--report-dir {reports} is in use by another run (pid {first.pid}, " \
                   f"started " in line, (how, said[-2000:])
            assert "command: " in line and "gated_driver.py" in line, line
            assert not (reports / "results.json").exists()  # the second one cleared nothing
        gate.touch()
        output, _ = first.communicate(timeout=120)
    finally:
        gate.touch()
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, output[-3000:]
    rows = json.loads((reports / "results.json").read_text())["results"]
    assert [r["id"] for r in rows] == [CASE]  # one row: the first run's alone
    # Released: the next run takes the dir.
    later = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "-k", CASE, "-n", "0",
                            "--report-dir", str(reports)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert later.returncode == 0, later.stdout[-2000:] + later.stderr[-2000:]
    rows = json.loads((reports / "results.json").read_text())["results"]
    assert [(r["id"], r["frontend"]) for r in rows] == [(CASE, "reference")]


def test_a_holder_that_died_blocks_no_one(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         f"sys.path.insert(0, {str(ROOT)!r})\n"
         "from harness.results.dirlock import lock_report_dir\n"
         "lock = lock_report_dir(sys.argv[1])\n"
         "print('held', flush=True)\n"
         "time.sleep(60)\n", str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        try:
            lock_report_dir(str(tmp_path))
            raise AssertionError("the dir was taken twice")
        except ReportDirBusy as exc:
            assert f"pid {holder.pid}, started " in str(exc)
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    lock = lock_report_dir(str(tmp_path))  # SIGKILL dropped the flock
    try:
        held = json.loads((tmp_path / LOCK_NAME).read_text())
        assert held["pid"] == os.getpid()
    finally:
        lock.release()
    assert (tmp_path / LOCK_NAME).read_text() == ""  # no stale holder left to read


def test_collect_only_leaves_a_busy_report_dir_alone(tmp_path: Path) -> None:
    """`--collect-only` runs no case: it neither waits for nor takes the dir, and neither
    clears nor writes its report set (before: it needed the lock, so it failed with exit 4
    beside a running suite, and it deleted the results.json it found)."""
    reports = tmp_path / "reports"
    lock = lock_report_dir(str(reports))  # another run holds the dir
    try:
        (reports / "results.json").write_text("theirs")
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "--collect-only", "-q",
             "-p", "no:cacheprovider", "--report-dir", str(reports), "-k", CASE],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert f"{CASE}[reference]" in proc.stdout
        assert (reports / "results.json").read_text() == "theirs"
        sharded = subprocess.run(  # a shard writes its (empty) report set even when
            [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "--collect-only",
             "-q", "-p", "no:cacheprovider", "--report-dir", str(reports), "--shard", "1/2"],
            cwd=ROOT, capture_output=True, text=True, timeout=120)  # it draws nothing
        assert sharded.returncode == 0, sharded.stdout[-2000:] + sharded.stderr[-2000:]
        assert sorted(p.name for p in reports.iterdir()) == [".corewire.lock",
                                                             "results.json"]
        assert (reports / "results.json").read_text() == "theirs"
    finally:
        lock.release()
