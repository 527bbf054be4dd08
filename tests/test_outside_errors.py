"""An error outside any case (a leak found at session end) is named in the terminal summary.

pytest's own short summary cuts such an error to the terminal width ("- Ass..."), and under
xdist gives no reason at all; the run fails on it (exit 1), so the summary must say why.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("workers", ["0", "2"])
def test_session_end_leak_is_named_in_the_summary(tmp_path: Path, workers: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-p",
         "no:cacheprovider", "-n", workers, "-p", "tests.leaking_plugin",
         "-k", "streaming.finish.length", "--frontend", "reference",
         "--report-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT),
             "LEAKING_PLUGIN_PIDS": str(tmp_path / "pids")})
    for pid in (tmp_path / "pids").read_text().split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    assert run.returncode == 1, run.stdout[-2000:]
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("ERROR outside any case:")]
    assert lines, run.stdout[-2000:]
    assert all("session leaked: child processes still running" in ln for ln in lines), lines
