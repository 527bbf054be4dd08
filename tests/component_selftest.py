"""What the component self-tests share: run a component suite against a named component
(reference, a mutant, vLLM's own) and judge the catch matrix.

Why one module: the KV-worker and EC-scheduler suites prove themselves the same way (the
reference passes, every mutant is caught by its designated case, every case catches a
mutant); only the suite module, the selecting variable and the mutants differ.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType

from harness.cases.context import run_case
from harness.cases.declaration import CaseFn, CaseSpec, module_cases
from harness.frontends.no_frontend import NoFrontend
from harness.results.records import CaseResult, Verdict
from tests.timescale import RUN_CONFIG

CAUGHT = (Verdict.FAIL, Verdict.TIMEOUT)
Matrix = dict[str, dict[str, CaseResult]]  # component name -> case id -> result


def short(case_id: str) -> str:
    return case_id.rsplit(".", 1)[1]


def problems(results: Mapping[str, CaseResult]) -> str:
    return "\n".join(f"{r.verdict.value} {r.case_id}: {r.message} {r.evidence.notes[-3:]}"
                     for r in results.values() if r.verdict is not Verdict.PASS)


@dataclass(frozen=True)
class ComponentSuite:
    """One component suite: its cases, the env variable that selects the component, and
    the case designed to catch each mutant."""

    module: ModuleType
    kind: str  # the component kind: "kv", "ec"
    designed_for: Mapping[str, str]  # mutant name -> short case name

    @property
    def cases(self) -> list[tuple[CaseSpec, CaseFn]]:
        return sorted(((d.spec, d.run) for d in module_cases(vars(self.module))),
                      key=lambda item: item[0].case_id)

    def run(self, component: str, cases: Sequence[tuple[CaseSpec, CaseFn]] | None = None
            ) -> dict[str, CaseResult]:
        """{case id: result} of running `cases` (all by default) against `component`."""
        config = dataclasses.replace(RUN_CONFIG, component_units={self.kind: component})
        return {spec.case_id: asyncio.run(run_case(spec, fn, NoFrontend("none"), config=config))
                for spec, fn in (self.cases if cases is None else cases)}

    def only(self, case_id: str) -> list[tuple[CaseSpec, CaseFn]]:
        return [(s, f) for s, f in self.cases if s.case_id == case_id]

    def matrix(self, mutants: Iterable[str]) -> Matrix:
        """Every case against the reference and every mutant."""
        return {name: self.run(name if name == "reference" else f"mutant:{name}")
                for name in ["reference", *mutants]}

    def check_mutant_caught(self, mutant: str, matrix: Matrix) -> None:
        results = matrix[mutant]
        errors = [r for r in results.values() if r.verdict is Verdict.ERROR]
        assert not errors, f"harness errors, not verdicts:\n{problems(results)}"
        caught = {short(cid) for cid, r in results.items() if r.verdict in CAUGHT}
        assert caught, f"mutant {mutant} passes every case"
        designed = self.designed_for[mutant]
        assert designed in caught, f"{mutant} not caught by {designed}; caught by " \
                                   f"{sorted(caught)}"

    def catch_matrix(self, title: str, matrix: Matrix) -> tuple[str, list[str]]:
        """The printed matrix (x: FAIL, T: TIMEOUT, .: PASS) and the cases no mutant fails."""
        mark = {Verdict.FAIL: "x", Verdict.TIMEOUT: "T", Verdict.PASS: "."}
        names = list(matrix)
        width = max(len(short(spec.case_id)) for spec, _ in self.cases)
        lines = ["", f"{title} (columns: " +
                 ", ".join(f"{i}={n}" for i, n in enumerate(names)) + ")",
                 " " * width + "  " + " ".join(str(i) for i in range(len(names)))]
        for spec, _ in self.cases:
            cells = [mark.get(matrix[n][spec.case_id].verdict, "?") for n in names]
            lines.append(f"{short(spec.case_id):<{width}}  " + " ".join(cells))
        idle = [spec.case_id for spec, _ in self.cases
                if not any(matrix[n][spec.case_id].verdict in CAUGHT
                           for n in names if n != "reference")]
        return "\n".join(lines), idle
