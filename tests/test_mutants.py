"""Self-test: the conformance suites catch every mutant frontend (the kill matrix).

The full matrix (every case x every mutant) runs in `make mutants`, which records the kill
pairs in fixtures/kill-matrix.json. Here we re-verify only what the proof needs: the record
covers exactly today's mutants and cases, and a few recorded pairs (for every mutant one
killer, for every case one mutant it kills) still kill, in PROOF_SHARDS child pytest runs
(separate test items, so xdist runs them side by side).
Measured on 2 CPUs (2026-11-28): the proof (558 pairs) took 139-145 s as one child run
with 4 workers under two busy loops; as 4 shards of 2 workers each they run beside the
rest of make test.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from harness.mutation.killmatrix import (
    HARMLESS,
    RERUN_HINT,
    Kill,
    KillMatrix,
    discover_cases,
    node_id,
    run_against_mutants,
)
from harness.mutation.registry import JUSTIFIED_IDLE_CASES, mutants
from harness.results.records import CaseResult

MUTANTS = mutants()

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "fixtures" / "kill-matrix.json"
WORKERS = int(os.environ.get("COREWIRE_MUTANT_WORKERS", "2"))  # per proof shard
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def record() -> KillMatrix:
    return KillMatrix.load(RECORD)


@pytest.fixture(scope="module")
def case_files() -> dict[str, str]:
    return discover_cases(ROOT)


PROOF_SHARDS = 4  # separate items, so xdist spreads the ~150 s proof over its workers


@pytest.fixture(scope="module")
def proof_pairs(record: KillMatrix, case_files: dict[str, str]) -> list[tuple[str, str]]:
    """The recorded pairs the proof re-runs: for every mutant a killer, for every case a
    mutant it kills."""
    pairs = [(m, c) for m, c in record.select_proof(JUSTIFIED_IDLE_CASES)
             if m in MUTANTS and c in case_files]
    if not pairs:
        pytest.fail(f"the kill-matrix record proves nothing; {RERUN_HINT}")
    return pairs


def _shard(pairs: list[tuple[str, str]], index: int) -> list[tuple[str, str]]:
    return pairs[index::PROOF_SHARDS]


def _grade(pairs: list[tuple[str, str]], case_files: dict[str, str], tmp: Path
           ) -> dict[tuple[str, str], CaseResult]:
    """What each pair grades now, from one child pytest run."""
    results = run_against_mutants(
        ROOT, sorted({m for m, _ in pairs}), tmp,
        node_ids=[node_id(case_files[c], c, m) for m, c in pairs], workers=WORKERS,
        timeout=540)
    return {(r.frontend.removeprefix("mutant:"), r.case_id): r for r in results}


def test_record_covers_every_mutant_and_case(record: KillMatrix,
                                             case_files: dict[str, str]) -> None:
    problems = record.record_problems(list(MUTANTS), sorted(case_files), JUSTIFIED_IDLE_CASES)
    assert problems == [], "\n".join(problems)


def _missed(pairs: list[tuple[str, str]], graded: dict[tuple[str, str], CaseResult]
            ) -> dict[tuple[str, str], str]:
    """The pairs that did not kill this time, each with what it graded."""
    missed = {}
    for pair in pairs:
        result = graded.get(pair)
        if result is None:
            missed[pair] = "not run"
        elif result.verdict in HARMLESS:
            missed[pair] = f"now {result.verdict.value} ({result.message})"
    return missed


@pytest.mark.parametrize("shard", range(PROOF_SHARDS))
def test_recorded_pairs_still_kill(shard: int, proof_pairs: list[tuple[str, str]],
                                   case_files: dict[str, str], tmp_path: Path) -> None:
    """A pair that misses is run once more on its own: a case that lost its power misses
    twice; one that still kills was beaten by the machine's timing once (named in a
    warning, so the record can be re-stabilised: 1 miss in 13 runs of the shards was seen
    on 2 CPUs, its pair not caught)."""
    pairs = _shard(proof_pairs, shard)
    if not pairs:  # an empty node-id list would make the child run every test it finds
        pytest.skip(f"the proof has fewer than {PROOF_SHARDS} pairs")
    first = _missed(pairs, _grade(pairs, case_files, tmp_path / "run"))
    again = _missed(list(first), _grade(list(first), case_files, tmp_path / "again")) \
        if first else {}
    for (mutant, case), why in first.items():
        if (mutant, case) not in again:
            warnings.warn(f"kill pair {case} x mutant:{mutant} missed once ({why}), killed "
                          "on the re-run: timing-dependent", stacklevel=1)
    lost = [f"{case} x mutant:{mutant}: {why}" for (mutant, case), why in again.items()]
    assert lost == [], ("recorded kill pairs that no longer kill (a case or mutant lost "
                        f"its power; if intended, {RERUN_HINT}):\n" + "\n".join(lost))


def test_proof_covers_every_mutant_and_case(case_files: dict[str, str],
                                            proof_pairs: list[tuple[str, str]]) -> None:
    pairs = proof_pairs
    assert sorted(MUTANTS) == sorted({m for m, _ in pairs}), "mutants without a proof pair"
    needing = {c for c in case_files if c not in JUSTIFIED_IDLE_CASES}
    assert needing <= {c for _, c in pairs}, "cases without a proof pair"


def test_at_least_a_dozen_mutants() -> None:
    assert len(MUTANTS) >= 12


def _synthetic() -> KillMatrix:
    return KillMatrix({"a": {"c1": Kill("FAIL", 0.5), "c2": Kill("FAIL", 0.1)},
                       "b": {"c2": Kill("TIMEOUT", 3.0), "c3": Kill("FAIL", 0.2)},
                       "lonely": {}},
                      ["c1", "c2", "c3", "idle"])


def test_proof_selection_covers_mutants_and_cases_with_few_pairs() -> None:
    pairs = _synthetic().select_proof({"idle": "INFO case"})
    assert {m for m, _ in pairs} == {"a", "b"}
    assert {c for _, c in pairs} == {"c1", "c2", "c3"}
    assert ("b", "c2") not in pairs  # a TIMEOUT pair only when nothing else proves it
    assert len(pairs) == 3


def test_record_problems_name_what_to_do() -> None:
    problems = _synthetic().record_problems(["a", "b", "lonely", "new"],
                                            ["c1", "c2", "c3", "idle", "c4"], {})
    text = "\n".join(problems)
    assert "['new']" in text and "['c4']" in text and "make mutants" in text
    assert "mutants no case catches: ['lonely']" in text
    assert "JUSTIFIED_IDLE_CASES: ['idle']" in text
