"""mutmut runs several pytest sessions at once, each with the pyproject's one --report-dir
([tool.mutmut] pytest_add_cli_args). One run owns a report dir, so before
harness.mutation.children gave each run its own, every concurrent child was refused (exit 4)
and mutmut counted it as a kill: a full run scored 99.2 % where mutants it "killed" (an ipc
endpoint's arbitrary name) pass every covering case alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
CASE = "streaming.finish.length"


def _mutmut_args() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    args: list[str] = config["pytest_add_cli_args"]
    return args


def test_concurrent_mutation_children_each_get_a_report_dir(tmp_path: Path) -> None:
    args = [a if a != "mutation-reports" else str(tmp_path / "shared") for a in _mutmut_args()]
    assert str(tmp_path / "shared") in args, "the pyproject's mutmut runs share a report dir"
    argv = [sys.executable, "-m", "pytest", "-q", "conformance", "-k", CASE, *args]
    runs = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) for _ in range(3)]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], [o[-800:] for o in outputs]
    assert not any((tmp_path / "shared").glob("run-*")), "a child's report dir was left"

