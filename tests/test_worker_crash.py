"""An xdist worker killed mid-case (SIGKILL, here by the case's own driver program,
tests/worker_killer.py): the case gets its ERROR row naming the cause, the run goes on on a
replacement worker, and the driver program the dead worker had started (which ignores the
end of its stdin) and that program's daemon are ended by the controller.

Before: the case was only an "ERROR outside any case" line, had no row in results.json,
and the driver program and its daemon ran on after the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from harness.hygiene import process_tree
from harness.results.records import Verdict

ROOT = Path(__file__).resolve().parent.parent
MARK = "COREWIRE_WORKER_CRASH_TEST"
CASE = "streaming.finish.length"
KILLER = f"subprocess:{os.path.relpath(sys.executable, ROOT)} tests/worker_killer.py"
NAME = "killer"  # its stable name (--frontend NAME=SPEC): rows, JUnit and summary use it


def test_a_worker_killed_mid_case_is_that_cases_error(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    reports = tmp_path / "reports"
    mark = uuid.uuid4().hex
    env = {**os.environ, "TMPDIR": str(tmp), MARK: mark, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-n", "1",
            "-p", "no:cacheprovider", "-k", CASE, "--frontend", f"{NAME}={KILLER}",
            "--frontend", "reference", "--report-dir", str(reports)]
    started = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300, start_new_session=True)
        elapsed = time.monotonic() - started
        output = proc.stdout[-4000:] + proc.stderr[-2000:]
        assert proc.returncode == 1, output
        assert "outside any case" not in proc.stdout, output
        rows = {r["frontend"]: r for r in
                json.loads((reports / "results.json").read_text())["results"]}
        assert sorted(rows) == sorted([NAME, "reference"]), output
        assert rows["reference"]["verdict"] == Verdict.PASS.value, output
        crashed = rows[NAME]
        assert crashed["verdict"] == Verdict.ERROR.value, crashed
        assert "worker running the case crashed (killed by SIGKILL)" in crashed["message"]
        notes = "\n".join(crashed["evidence"]["notes"])
        assert "teardown by the controller: ended 2 process(es)" in notes, notes
        assert f"ERROR       {CASE}[{NAME}]" in proc.stdout, output
        assert elapsed < 120, f"{elapsed:.1f} s"
        # Nothing of the run survives it: not the program, not its daemon, no temp dir.
        left = process_tree.marked(MARK, mark, process_tree.process_table())
        assert left == set(), f"still running: {sorted(left)}"
        assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("cw-")) == []
    finally:
        for pid in process_tree.marked(MARK, mark, process_tree.process_table()):
            os.kill(pid, signal.SIGKILL)


def test_case_items_are_told_from_other_tests() -> None:
    from harness.run.worker_crash import split_item_name

    item = "conformance/abort/test_drop.py::abort.drop.single[subprocess:./d a[b]]"
    assert split_item_name(item) \
        == ("conformance/abort/test_drop.py", "abort.drop.single", "subprocess:./d a[b]")
    assert split_item_name("tests/test_x.py::test_plain") is None
    assert split_item_name("tests/test_x.py::[odd]") is None
