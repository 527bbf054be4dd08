"""A report dir that fills up mid-run (harness/results/failsafe.py): every report file is
whole or absent, never empty or cut; the terminal still gets the verdicts and one line per
file not written with its path and errno; the run exits 6 (docs/cli.md); no traceback.

How the disk fills: a size limit on the run's files (RLIMIT_FSIZE, SIGXFSZ ignored), so a
write past it fails with EFBIG, a real OS-level write failure at the same write() and
close() calls a full disk (ENOSPC) or a quota (EDQUOT) fails. A size-limited filesystem
needs mount (or a FUSE helper) that CI's unprivileged runner lacks; the limit needs
neither, and puts the failure at an exact size: the run's report files are 10-45 KB
(junit.xml ~10 KB, transcript ~35 KB, results.json and report.html ~40 KB), while what the
run must still write (the report dir's lock, the temp-dir registries) is under 1 KB.

Before: pytest's JUnit writer left a cut junit.xml (8192 bytes here; 0 bytes on a full
disk), raised, skipped results.json and the teardown after it, printed a traceback and no
verdict summary, and the run exited 1."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAILING = "mutant:duplicate_abort"  # FAILs the case: a transcript is written too
CASE = "abort.burst.exactly_once"
TRANSCRIPT = f"transcripts/{CASE}[{FAILING}].json"


def run_limited(reports: Path, limit: int) -> subprocess.CompletedProcess[str]:
    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a core dump
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "harness.run.cli", "run", "-n", "0", "-k", CASE, "--frontend",
         FAILING, "--frontend", "reference", "--report-dir", str(reports),
         "--", "-v"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"})


@pytest.mark.parametrize("limit, lost", [
    (8 << 10, ["junit.xml", TRANSCRIPT, "results.json", "report.html"]),
    (20 << 10, [TRANSCRIPT, "results.json", "report.html"]),  # junit.xml fits
])
def test_a_full_report_dir_is_said_not_a_traceback(tmp_path: Path, limit: int,
                                                    lost: list[str]) -> None:
    reports = tmp_path / "reports"
    proc = run_limited(reports, limit)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 6, said[-3000:]
    assert "Traceback" not in said and "INTERNALERROR" not in said, said[-3000:]
    assert "PASS=1  NON-STRICT=0  INFO=0  UNSUPPORTED=0  FAIL=1" in proc.stdout, said[-3000:]
    assert f"FAIL        {CASE}[{FAILING}]" in proc.stdout
    assert f"REPORTS NOT WRITTEN (exit 6): {len(lost)} file(s)" in proc.stdout, said[-3000:]
    for name in lost:
        assert f"  {reports / name}: File too large (EFBIG, errno 27)" in proc.stdout, name
        assert not (reports / name).exists(), name
    # Nothing half-written: no partial file, and what was written is whole.
    files = sorted(str(p.relative_to(reports)) for p in reports.rglob("*") if p.is_file())
    assert not [f for f in files if ".partial-" in f], files
    if "junit.xml" not in lost:  # corewire's own junit.xml (harness/results/junit.py)
        suite = ET.parse(reports / "junit.xml").getroot()
        assert suite.find("testsuite") is not None or suite.tag == "testsuite"
