"""Every row of the exit-code table in docs/cli.md, through the `corewire run` CLI (the
interrupted row, 2, is tests/test_interrupts.py)."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results.baseline import Baseline, BaselineEntry

ROOT = Path(__file__).resolve().parent.parent
SLEEPY = "mutant:sleeping_first_engine"  # fails exactly the is_sleeping disagreement cases
FAILING = ["dp.is_sleeping.disagree", "dp.is_sleeping.disagree_names_values",
           "dp.is_sleeping.disagree_reversed"]


def _baseline(tmp: Path, passing_entry: bool = False, expires: str = "2099-01-01") -> Path:
    entries = [BaselineEntry(c, SLEEPY, "FAIL", "port under development", "https://x/1",
                             expires) for c in FAILING]
    if passing_entry:
        entries.append(BaselineEntry("dp.is_sleeping.all_true", SLEEPY, "FAIL", "stale",
                                     "https://x/3", "2099-01-01"))
    path = tmp / "baseline.json"
    Baseline({(e.case, e.frontend): e for e in entries}).save(str(path))
    return path


ROWS: dict[str, tuple[int, str]] = {
    # row -> (exit code, what the output must say)
    "pass": (0, "PASS="),
    "failure": (1, "FAIL        dp.is_sleeping.disagree["),
    "stale-baseline": (1, "STALE BASELINE"),
    "expired-baseline": (1, "EXPIRED BASELINE"),
    "usage": (4, "unknown frontend 'nosuch'"),
    "bad-baseline": (4, "baseline"),
    "no-case": (5, "no case ran"),
    "disk-full": (6, "REPORTS NOT WRITTEN (exit 6)"),  # its 2-3 KB reports past 1 KiB
    "frontend-stopped": (7, "STOPPED broken: could not start 3 times in a row"),
}
DISK_FULL_LIMIT = 1 << 10  # bytes: RLIMIT_FSIZE (tests/test_disk_full.py says why)


def _args(row: str, tmp: Path) -> list[str]:
    sleepy = ["-k", "dp.is_sleeping", "--frontend", SLEEPY]
    if row == "pass":
        return ["-k", "abort.drop.single"]
    if row == "failure":
        return sleepy
    if row == "stale-baseline":
        return [*sleepy, "--baseline", str(_baseline(tmp, passing_entry=True))]
    if row == "expired-baseline":
        return [*sleepy, "--baseline", str(_baseline(tmp, expires="2020-01-01"))]
    if row == "usage":
        return ["-k", "abort.drop.single", "--frontend", "nosuch"]
    if row == "bad-baseline":
        bad = tmp / "bad.json"
        bad.write_text('{"entries": [{"case": 1}]}')
        return ["-k", "abort.drop.single", "--baseline", str(bad)]
    if row == "disk-full":
        return ["-k", "abort.drop.single"]
    if row == "frontend-stopped":  # a driver program that exits before `init`'s reply
        return ["-k", "abort.drop", "--frontend",
                f"broken=subprocess:{sys.executable} -c 'raise SystemExit(1)'"]
    assert row == "no-case"
    return ["-k", "no_such_case_anywhere"]


def _limit_file_size() -> None:
    """The disk-full row: writes past DISK_FULL_LIMIT fail with EFBIG (SIGXFSZ ignored)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (DISK_FULL_LIMIT, DISK_FULL_LIMIT))


@pytest.mark.parametrize("row", sorted(ROWS))
def test_exit_code_row(tmp_path: Path, row: str) -> None:
    code, says = ROWS[row]
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "-n", "0",
                           "--report-dir", str(tmp_path / "reports"), *_args(row, tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          preexec_fn=_limit_file_size if row == "disk-full" else None,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, f"{row}: exit {proc.returncode}\n{out[-3000:]}"
    assert says in out, out[-3000:]
    assert "Traceback" not in out


def test_the_documented_table_is_the_tested_one() -> None:
    """docs/cli.md's table names exactly the codes these tests (and test_interrupts) check."""
    # The section only: `corewire bench` has a table of its own further down.
    table = (ROOT / "docs" / "cli.md").read_text().split("## Exit codes", 1)[1]
    table = table.split("\n## ", 1)[0]
    documented = {int(m) for m in re.findall(r"^\| (\d) \|", table, re.MULTILINE)}
    assert documented == {code for code, _ in ROWS.values()} | {2}
    for row in ROWS:
        assert f"`{row}`" in table, f"row {row} is not in docs/cli.md"
