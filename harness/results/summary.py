"""The terminal summary of a run (the plugin's) and of a merged run (`corewire merge`).

Counts first, then only what needs reading, grouped by verdict class, then by area:

    PASS=150  NON-STRICT=20  INFO=34  UNSUPPORTED=249  FAIL=12  ERROR=2  TIMEOUT=1  NOT-RUN=0
    pytest's count: 184 passed (PASS 150 + INFO 34), 269 skipped (NON-STRICT 20 + ...
    FAIL 12: abort 5, dp 4, streaming 3
    FAIL        abort.burst.exactly_once[myport]: expected one ABORT; observed 2
    ...
    UNSUPPORTED 249: handshake 100, utility 149 (-v lists them)

A failing item is one line: `VERDICT case[frontend]: reason`, the reason's first line cut
to REASON_CHARS on its own (a frontend's name never pushes it off). NON-STRICT,
UNSUPPORTED, INFO, NOT-RUN and baselined verdicts are counts unless `-v`. The start
failures that stopped a frontend are one line (its STOPPED line), not one per case.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from harness.results.records import AREAS, CaseResult, Verdict
from harness.results.startup import Stop, cause_key

REASON_CHARS = 160
FRONTEND_LINES = 12  # a per-frontend count line each, up to this many frontends
FAILING_ORDER = ("FAIL", "ERROR", "TIMEOUT", "STALE BASELINE", "EXPIRED BASELINE")
FOLDED_ORDER = ("BASELINED FAIL", "BASELINED ERROR", "BASELINED TIMEOUT",
                "BASELINED NON-STRICT", "BASELINED UNSUPPORTED", "NON-STRICT", "UNSUPPORTED",
                "INFO", "NOT-RUN")


@dataclass
class SummaryInput:
    """What a summary is made of; `failing` is keyed `case[frontend]` -> why it fails."""

    results: Sequence[CaseResult]
    failing: Mapping[str, str] = field(default_factory=dict)
    stops: Sequence[Stop] = ()
    verbose: bool = False


def item_name(r: CaseResult) -> str:
    return f"{r.case_id}[{r.frontend}]"


def area_of(r: CaseResult) -> str:
    return r.case_id.split(".", 1)[0]


def class_of(r: CaseResult, failing: Mapping[str, str]) -> str:
    """The summary class of a row: its verdict, a baseline problem, or BASELINED <verdict>."""
    why = failing.get(item_name(r))
    if why is not None:
        for problem in ("STALE BASELINE", "EXPIRED BASELINE"):
            if why.startswith(problem):
                return problem
        return r.verdict.value
    if r.baseline:
        return f"BASELINED {r.verdict.value}"
    return r.verdict.value


def pytest_outcome(r: CaseResult, failing: Mapping[str, str]) -> str:
    """How pytest counted the item: failed, skipped or passed."""
    if item_name(r) in failing:
        return "failed"
    if r.baseline or r.verdict in (Verdict.NON_STRICT, Verdict.UNSUPPORTED, Verdict.NOT_RUN):
        return "skipped"
    return "passed"


def _cut(text: str) -> str:
    first = (text.strip().splitlines() or [""])[0]
    return first if len(first) <= REASON_CHARS else first[:REASON_CHARS - 3] + "..."


def _counts(counter: Counter[str], order: Sequence[str]) -> str:
    known = [k for k in order if counter.get(k)]
    rest = sorted(k for k in counter if k not in order)
    return ", ".join(f"{k} {counter[k]}" for k in known + rest)


def summary_lines(run: SummaryInput) -> list[str]:
    """The lines of the summary (without the section rule and the reports line)."""
    rows = list(run.results)
    totals = Counter(r.verdict.value for r in rows)
    lines = ["  ".join(f"{v.value}={totals.get(v.value, 0)}" for v in Verdict)]
    lines.append(_pytest_line(rows, run.failing))
    frontends = sorted({r.frontend for r in rows})
    if 1 < len(frontends) <= FRONTEND_LINES:
        verdict_order = [v.value for v in Verdict]
        for frontend in frontends:
            counter = Counter(r.verdict.value for r in rows if r.frontend == frontend)
            lines.append(f"{frontend}: {_counts(counter, verdict_order)}")
    classes: dict[str, list[CaseResult]] = {}
    for r in rows:
        classes.setdefault(class_of(r, run.failing), []).append(r)
    others = sorted(set(classes) - set(FAILING_ORDER) - set(FOLDED_ORDER) - {"PASS"})
    for label in [*FAILING_ORDER, *others]:
        members = classes.get(label, [])
        if members:
            lines += _listed(label, members, run)
    for label in FOLDED_ORDER:
        members = classes.get(label, [])
        if not members:
            continue
        areas = _counts(Counter(area_of(r) for r in members), AREAS)
        if label == "NOT-RUN":
            lines.append(f"{label} {len(members)}: {areas} (their frontend was stopped: "
                         f"STOPPED below)")
        elif run.verbose:
            lines += _listed(label, members, run)
        else:
            lines.append(f"{label} {len(members)}: {areas} (-v lists them)")
    for stop in run.stops:
        not_run = sum(1 for r in rows if r.frontend == stop.frontend
                      and r.verdict is Verdict.NOT_RUN)
        lines.append(stop.line(not_run))
    return lines


def _pytest_line(rows: Sequence[CaseResult], failing: Mapping[str, str]) -> str:
    """pytest's passed / skipped / failed counts, each split into the verdicts it holds
    (pytest's `passed` is PASS and INFO; its `skipped` NON-STRICT, UNSUPPORTED, NOT-RUN and
    baselined verdicts)."""
    parts: dict[str, Counter[str]] = {"passed": Counter(), "skipped": Counter(),
                                      "failed": Counter()}
    for r in rows:
        outcome = pytest_outcome(r, failing)
        label = "BASELINED" if outcome == "skipped" and r.baseline else class_of(r, failing)
        parts[outcome][label] += 1
    text = ", ".join(
        f"{sum(counter.values())} {outcome} ("
        + " + ".join(f"{label} {n}" for label, n in sorted(counter.items())) + ")"
        for outcome, counter in parts.items() if counter)
    return f"pytest's count: {text or 'no case'}"


def _listed(label: str, members: Sequence[CaseResult], run: SummaryInput) -> list[str]:
    """The header of one class, then one line per item (start failures folded)."""
    areas = _counts(Counter(area_of(r) for r in members), AREAS)
    out = [f"{label} {len(members)}: {areas}"]
    stopped = {stop.frontend: cause_key(stop.cause) for stop in run.stops}
    folded: Counter[str] = Counter()
    for r in members:
        if stopped.get(r.frontend) == cause_key(r.message) and r.verdict.failing:
            folded[r.frontend] += 1
            continue
        why = run.failing.get(item_name(r))
        if why is None or why.startswith(r.verdict.value):
            why = r.message
        flag = " (baselined)" if r.baseline else ""
        out.append(f"{r.verdict.value:<11} {item_name(r)}{flag}: {_cut(why)}")
    for frontend, count in sorted(folded.items()):
        out.append(f"{label:<11} {count} case(s) of {frontend}: its start failures "
                   f"(STOPPED below)")
    return out
