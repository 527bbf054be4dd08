"""Baselines: expected non-PASS verdicts for ports under development.

A baseline entry tolerates one verdict of one case on one frontend, with a reason, an
issue link and an expiry date. Rules: a matching, unexpired entry turns a failing verdict
into a skip; an entry whose case now PASSes is stale and fails the run; an expired entry
fails the run. So a baseline can only shrink unless someone edits it on purpose.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.results.records import CaseResult, Verdict


class BaselineError(ValueError):
    """The baseline file is malformed."""


@dataclass(frozen=True)
class BaselineEntry:
    case: str
    frontend: str
    verdict: str
    reason: str
    issue: str = ""
    expires: str = ""  # ISO date; empty means no expiry

    def expired(self, today: dt.date) -> bool:
        return bool(self.expires) and dt.date.fromisoformat(self.expires) < today


@dataclass
class Baseline:
    entries: dict[tuple[str, str], BaselineEntry] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str) -> Baseline:
        try:
            with open(path) as fh:
                data = json.load(fh)
            entries = [BaselineEntry(**e) for e in data["entries"]]
            for e in entries:
                Verdict(e.verdict)
                if e.expires:
                    dt.date.fromisoformat(e.expires)
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise BaselineError(f"baseline {path}: {type(exc).__name__}: "
                                f"{str(exc)[:300]}") from None
        return cls({(e.case, e.frontend): e for e in entries})

    @classmethod
    def from_results(cls, results: list[CaseResult], reason: str = "recorded by "
                     "--update-baseline; explain and link an issue") -> Baseline:
        keep = [r for r in results
                if r.verdict not in (Verdict.PASS, Verdict.INFO, Verdict.NOT_RUN)]
        expires = (dt.date.today() + dt.timedelta(days=90)).isoformat()
        return cls({(r.case_id, r.frontend): BaselineEntry(
            r.case_id, r.frontend, r.verdict.value, r.baseline or reason, "", expires)
            for r in keep})

    def save(self, path: str) -> None:
        """Whole or not at all: a full disk must not cut the baseline file (a tracked
        source file) in half."""
        from harness.results.writer import write_atomically

        data: dict[str, Any] = {"entries": [asdict(e) for _, e in sorted(self.entries.items())]}
        write_atomically(path, json.dumps(data, indent=2) + "\n")

    def get(self, case: str, frontend: str) -> BaselineEntry | None:
        return self.entries.get((case, frontend))


@dataclass(frozen=True)
class Unmatched:
    """Baseline entries a run did not use (reported, not failing the run)."""

    stale: list[BaselineEntry]  # of a frontend that ran, naming no item it ran
    other_frontends: dict[str, int]  # frontend not in the run -> its entries


def unmatched_entries(baseline: Baseline, results: Sequence[CaseResult]) -> Unmatched:
    """The entries of `baseline` no row of an unfiltered run matched: the same port
    renamed or started from another path used to miss its baseline silently."""
    ran = {(r.case_id, r.frontend) for r in results}
    frontends = {r.frontend for r in results}
    stale = [e for key, e in sorted(baseline.entries.items())
             if e.frontend in frontends and key not in ran]
    other = Counter(e.frontend for e in baseline.entries.values() if e.frontend not in frontends)
    return Unmatched(stale, dict(other))


@dataclass(frozen=True)
class Outcome:
    """How the test runner should report a graded result."""

    fail: bool
    skip: bool
    message: str


def apply_baseline(result: CaseResult, baseline: Baseline | None,
                   today: dt.date | None = None) -> Outcome:
    """Decide pass / skip / fail for `result`, applying the baseline rules."""
    today = today or dt.date.today()
    verdict, text = result.verdict, f"{result.verdict.value}: {result.message}"
    if verdict is Verdict.NOT_RUN:  # nothing ran to compare with its entry
        return Outcome(False, True, text)
    entry = baseline.get(result.case_id, result.frontend) if baseline else None
    if entry is not None:
        if entry.expired(today):
            return Outcome(True, False, f"EXPIRED BASELINE (expired {entry.expires}, "
                                        f"{entry.reason}); now {text}")
        if verdict in (Verdict.PASS, Verdict.INFO):
            return Outcome(True, False, f"STALE BASELINE: case now {verdict.value}; remove "
                                        f"the entry ({entry.reason})")
        if entry.verdict == verdict.value:
            result.baseline = entry.reason
            return Outcome(False, True, f"BASELINED {text} [{entry.reason} {entry.issue}]")
        text += f" (baseline expected {entry.verdict})"
    if verdict.failing:
        return Outcome(True, False, text)
    if verdict in (Verdict.NON_STRICT, Verdict.UNSUPPORTED):
        return Outcome(False, True, text)
    return Outcome(False, False, text)
