"""Self-test: the conformance suites catch every mutant frontend (the kill matrix).

Runs the whole suite against every mutant in one pytest run (many xdist workers: the
cases mostly wait on sockets and timers), then writes reports/kill-matrix.{json,md}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.frontends.mutants import JUSTIFIED_IDLE_CASES, MUTANTS
from harness.report.killmatrix import KillMatrix
from harness.report.writer import load_results

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(900)  # the whole suite x every mutant, in one child run
WORKERS = os.environ.get("COREWIRE_MUTANT_WORKERS", "10")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> KillMatrix:
    report_dir = tmp_path_factory.mktemp("mutants")
    argv = [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-p",
            "no:cacheprovider", "-n", WORKERS, "--report-dir", str(report_dir),
            "-m", "not components"]  # component cases have their own mutants (test_kv_components)
    for name in MUTANTS:
        argv += ["--frontend", f"mutant:{name}"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    results = load_results(str(report_dir / "results.json"))
    assert {r.frontend for r in results} == {f"mutant:{m}" for m in MUTANTS}
    km = KillMatrix.from_results(results, list(MUTANTS))
    rules = {m: mu.rule for m, mu in MUTANTS.items()}
    out = ROOT / "reports"
    out.mkdir(exist_ok=True)
    (out / "kill-matrix.json").write_text(
        json.dumps(km.to_json(rules, JUSTIFIED_IDLE_CASES), indent=1) + "\n")
    (out / "kill-matrix.md").write_text(km.to_markdown(rules, JUSTIFIED_IDLE_CASES))
    return km


def test_every_mutant_is_caught(matrix: KillMatrix) -> None:
    assert matrix.uncaught_mutants() == [], "mutants no case catches"


def test_every_case_catches_a_mutant_or_is_justified(matrix: KillMatrix) -> None:
    unjustified = [c for c in matrix.idle_cases() if c not in JUSTIFIED_IDLE_CASES]
    assert unjustified == [], "cases that catch no mutant need a mutant or a justification"


def test_at_least_a_dozen_mutants() -> None:
    assert len(MUTANTS) >= 12
