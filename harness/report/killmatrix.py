"""The mutant kill matrix: which conformance cases catch which broken frontend.

A mutant is caught when any case grades it worse than PASS/INFO. A case that catches no
mutant must be justified (INFO cases, for instance, judge nothing by design).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.verdicts import CaseResult, Verdict

PREFIX = "mutant:"
HARMLESS = (Verdict.PASS, Verdict.INFO, Verdict.UNSUPPORTED)


@dataclass
class KillMatrix:
    kills: dict[str, dict[str, str]] = field(default_factory=dict)  # mutant -> case -> verdict
    cases: list[str] = field(default_factory=list)

    @classmethod
    def from_results(cls, results: list[CaseResult], mutants: list[str]) -> KillMatrix:
        matrix = cls({name: {} for name in mutants}, sorted({r.case_id for r in results}))
        for r in results:
            name = r.frontend.removeprefix(PREFIX)
            if r.frontend.startswith(PREFIX) and r.verdict not in HARMLESS:
                matrix.kills.setdefault(name, {})[r.case_id] = r.verdict.value
        return matrix

    def uncaught_mutants(self) -> list[str]:
        return sorted(m for m, killed in self.kills.items() if not killed)

    def idle_cases(self) -> list[str]:
        """Cases that caught no mutant at all."""
        busy = {case for killed in self.kills.values() for case in killed}
        return [c for c in self.cases if c not in busy]

    def to_json(self, rules: dict[str, str], justified: dict[str, str]) -> dict[str, Any]:
        return {
            "mutants": {m: {"rule": rules.get(m, ""), "caught_by": killed}
                        for m, killed in sorted(self.kills.items())},
            "idle_cases": {c: justified.get(c, "UNJUSTIFIED") for c in self.idle_cases()},
            "uncaught_mutants": self.uncaught_mutants(),
        }

    def to_markdown(self, rules: dict[str, str], justified: dict[str, str]) -> str:
        lines = ["# Mutant kill matrix", "",
                 f"{len(self.kills)} mutants x {len(self.cases)} cases; "
                 f"{len(self.uncaught_mutants())} mutant(s) uncaught.", "",
                 "| mutant | rule it breaks | caught by |", "|---|---|---|"]
        for m, killed in sorted(self.kills.items()):
            caught = ", ".join(f"{c} ({v})" for c, v in sorted(killed.items())) or "**none**"
            lines.append(f"| {m} | {rules.get(m, '')} | {caught} |")
        lines += ["", "## Cases that catch no mutant", ""]
        for case in self.idle_cases():
            lines.append(f"- {case}: {justified.get(case, '**unjustified**')}")
        if not self.idle_cases():
            lines.append("- none")
        return "\n".join(lines) + "\n"
