"""The mutant kill matrix: which conformance cases catch which broken frontend.

A mutant is caught when any case grades it worse than PASS/INFO. A case that catches no
mutant must be justified (INFO cases, for instance, judge nothing by design).

The full matrix (every case x every mutant) is too dear for `make test`, so `make mutants`
runs it and records the kill pairs in fixtures/kill-matrix.json; `make test` then re-runs
only a proof: for every mutant one recorded killer, for every case one mutant it kills
(`select_proof`), and checks that the record still matches the registered mutants and
cases (`record_problems`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cases.index import wire_specs
from harness.results.records import CaseResult, Verdict
from harness.results.writer import load_results

PREFIX = "mutant:"
# NOT-RUN: its frontend was stopped (harness/run/failfast.py); the case proved nothing.
HARMLESS = (Verdict.PASS, Verdict.INFO, Verdict.UNSUPPORTED, Verdict.NOT_RUN)
RECORD_FORMAT = 1
# Deterministic verdicts first: a TIMEOUT costs its whole window, an ERROR may be a fault.
_VERDICT_RANK = {Verdict.FAIL.value: 0, Verdict.NON_STRICT.value: 1,
                 Verdict.ERROR.value: 2, Verdict.TIMEOUT.value: 3}
RERUN_HINT = ("run `make mutants` to re-record fixtures/kill-matrix.json (`make mutants "
              "KILL_MATRIX_ARGS=--incremental` for new mutants or cases only)")


class KillRecordError(Exception):
    """fixtures/kill-matrix.json is missing, unreadable or of another format."""


@dataclass(frozen=True)
class Kill:
    verdict: str
    seconds: float


@dataclass
class KillMatrix:
    kills: dict[str, dict[str, Kill]] = field(default_factory=dict)  # mutant -> case -> kill
    cases: list[str] = field(default_factory=list)

    @classmethod
    def from_results(cls, results: list[CaseResult], mutants: list[str]) -> KillMatrix:
        matrix = cls({name: {} for name in mutants}, sorted({r.case_id for r in results}))
        for r in results:
            name = r.frontend.removeprefix(PREFIX)
            if r.frontend.startswith(PREFIX) and r.verdict not in HARMLESS:
                matrix.kills.setdefault(name, {})[r.case_id] = Kill(r.verdict.value,
                                                                    round(r.duration, 3))
        return matrix

    def uncaught_mutants(self) -> list[str]:
        return sorted(m for m, killed in self.kills.items() if not killed)

    def idle_cases(self) -> list[str]:
        """Cases that caught no mutant at all."""
        busy = {case for killed in self.kills.values() for case in killed}
        return [c for c in self.cases if c not in busy]

    # ------------------------------------------------------------ the record

    def to_json(self, rules: dict[str, str], justified: dict[str, str]) -> dict[str, Any]:
        """The checked-in record (fixtures/kill-matrix.json); `from_json` reads it back."""
        return {
            "format": RECORD_FORMAT,
            "generated_by": "make mutants (scripts/kill_matrix.py); do not edit by hand",
            "cases": self.cases,
            "mutants": {m: {"rule": rules.get(m, ""),
                            "caught_by": {c: {"verdict": k.verdict, "seconds": k.seconds}
                                          for c, k in sorted(killed.items())}}
                        for m, killed in sorted(self.kills.items())},
            "idle_cases": {c: justified.get(c, "UNJUSTIFIED") for c in self.idle_cases()},
            "uncaught_mutants": self.uncaught_mutants(),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> KillMatrix:
        if doc.get("format") != RECORD_FORMAT:
            raise KillRecordError(f"kill-matrix record has format {doc.get('format')!r}, "
                                  f"expected {RECORD_FORMAT}; {RERUN_HINT}")
        kills = {m: {c: Kill(str(k["verdict"]), float(k["seconds"]))
                     for c, k in entry["caught_by"].items()}
                 for m, entry in doc["mutants"].items()}
        return cls(kills, list(doc["cases"]))

    @classmethod
    def load(cls, path: Path) -> KillMatrix:
        try:
            return cls.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            raise KillRecordError(f"no kill-matrix record at {path}; {RERUN_HINT}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise KillRecordError(f"unreadable kill-matrix record {path}: {exc!r}; "
                                  f"{RERUN_HINT}") from None

    def to_markdown(self, rules: dict[str, str], justified: dict[str, str]) -> str:
        lines = ["# Mutant kill matrix", "",
                 f"{len(self.kills)} mutants x {len(self.cases)} cases; "
                 f"{len(self.uncaught_mutants())} mutant(s) uncaught.", "",
                 "| mutant | rule it breaks | caught by |", "|---|---|---|"]
        for m, killed in sorted(self.kills.items()):
            caught = ", ".join(f"{c} ({k.verdict})" for c, k in sorted(killed.items()))
            lines.append(f"| {m} | {rules.get(m, '')} | {caught or '**none**'} |")
        lines += ["", "## Cases that catch no mutant", ""]
        for case in self.idle_cases():
            lines.append(f"- {case}: {justified.get(case, '**unjustified**')}")
        if not self.idle_cases():
            lines.append("- none")
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------ the proof

    def select_proof(self, justified: dict[str, str], killers_per_mutant: int = 1
                     ) -> list[tuple[str, str]]:
        """Few recorded (mutant, case) pairs that still prove the whole matrix: every
        mutant with `killers_per_mutant` of its killers, every non-idle case with one
        mutant it kills. Greedy and deterministic; cheap, deterministic verdicts first."""
        pairs: dict[tuple[str, str], None] = {}
        covered: set[str] = set()

        def cost(mutant: str, case: str) -> tuple[int, float, str]:
            kill = self.kills[mutant][case]
            return _VERDICT_RANK.get(kill.verdict, 4), kill.seconds, case

        # Mutants with the fewest killers first: they leave the least choice.
        for mutant in sorted(self.kills, key=lambda m: (len(self.kills[m]), m)):
            ranked = sorted(self.kills[mutant],
                            key=lambda c: (c in covered, *cost(mutant, c)))
            for case in ranked[:killers_per_mutant]:
                pairs[(mutant, case)] = None
                covered.add(case)
        for case in self.cases:
            if case in covered or case in justified:
                continue
            killers = [m for m, killed in self.kills.items() if case in killed]
            if killers:
                pairs[(min(killers, key=lambda m: (*cost(m, case), m)), case)] = None
                covered.add(case)
        return sorted(pairs)

    def record_problems(self, mutants: list[str], cases: list[str],
                        justified: dict[str, str]) -> list[str]:
        """What makes the record no proof of today's suite, each with what to do."""
        problems: list[str] = []
        new_mutants = sorted(set(mutants) - set(self.kills))
        gone_mutants = sorted(set(self.kills) - set(mutants))
        new_cases = sorted(set(cases) - set(self.cases))
        gone_cases = sorted(set(self.cases) - set(cases))
        if new_mutants:
            problems.append(f"mutants without a recorded killer (new?): {new_mutants}; "
                            f"{RERUN_HINT}")
        if gone_mutants:
            problems.append(f"recorded mutants no longer registered: {gone_mutants}; "
                            f"{RERUN_HINT}")
        if new_cases:
            problems.append(f"cases without a recorded mutant (new?): {new_cases}; "
                            f"{RERUN_HINT}")
        if gone_cases:
            problems.append(f"recorded cases that no longer exist: {gone_cases}; {RERUN_HINT}")
        uncaught = [m for m in self.uncaught_mutants() if m in mutants]
        if uncaught:
            problems.append(f"mutants no case catches: {uncaught}; add a case that catches "
                            f"each, then {RERUN_HINT}")
        unjustified = [c for c in self.idle_cases() if c in cases and c not in justified]
        if unjustified:
            problems.append(f"cases that catch no mutant need a mutant or an entry in "
                            f"JUSTIFIED_IDLE_CASES: {unjustified}")
        return problems


def discover_cases(root: Path, package: str = "conformance") -> dict[str, str]:
    """Every frontend case (components excluded) -> the file that defines it, relative
    to `root`, by importing the suite modules (root must be importable)."""
    return {case_id: where for case_id, (_, where) in wire_specs(root).items()
            if where.startswith(f"{package}/")}


def node_id(case_file: str, case: str, mutant: str) -> str:
    """The pytest node id of one case against one mutant (see harness.run.plugin)."""
    return f"{case_file}::{case}[{PREFIX}{mutant}]"


def run_against_mutants(root: Path, mutants: list[str], report_dir: Path, *,
                        node_ids: list[str] | None = None, workers: int = 2,
                        timeout: float = 900.0) -> list[CaseResult]:
    """One child pytest run of the conformance suite (or just `node_ids`) against the
    given mutants; returns every case result it graded."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-n", str(workers), "--report-dir", str(report_dir)]
    argv += node_ids if node_ids is not None else [str(root / "conformance"),
                                                   "-m", "not components"]
    for name in mutants:
        argv += ["--frontend", f"{PREFIX}{name}"]
    proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=timeout)
    if proc.returncode not in (0, 1):  # 1: some case failed, i.e. caught a mutant
        raise RuntimeError(f"pytest exited {proc.returncode} running the mutants:\n"
                           f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return load_results(str(report_dir / "results.json"))
