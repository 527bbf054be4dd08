"""Verdict transitions between two runs (`corewire diff OLD.json NEW.json`)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.results.records import CaseResult, Verdict


@dataclass(frozen=True)
class Transition:
    case_id: str
    frontend: str
    old: str  # a verdict, or "absent"
    new: str

    @property
    def regression(self) -> bool:
        return self.new in {v.value for v in Verdict if v.failing} and self.old != self.new


def diff_results(old: list[CaseResult], new: list[CaseResult]) -> list[Transition]:
    """Every (case, frontend) whose verdict changed, sorted by case id."""
    before = {(r.case_id, r.frontend): r.verdict.value for r in old}
    after = {(r.case_id, r.frontend): r.verdict.value for r in new}
    out = [Transition(case, fe, before.get((case, fe), "absent"), after.get((case, fe), "absent"))
           for case, fe in sorted(set(before) | set(after))
           if before.get((case, fe)) != after.get((case, fe))]
    return out


def format_diff(transitions: list[Transition]) -> str:
    if not transitions:
        return "no verdict changed"
    width = max(len(f"{t.case_id}[{t.frontend}]") for t in transitions)
    lines = []
    for t in transitions:
        flag = "  REGRESSION" if t.regression else ""
        lines.append(f"{t.case_id + '[' + t.frontend + ']':<{width}}  {t.old} -> {t.new}{flag}")
    regressions = sum(t.regression for t in transitions)
    lines.append(f"{len(transitions)} changed, {regressions} regression(s)")
    return "\n".join(lines)
