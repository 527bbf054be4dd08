"""The evidence text of one verdict, as captured output (hence JUnit system-out).

Capped at SYSTEM_OUT_CAP characters (head and tail kept, the cut said), so a CI page of
failures stays readable; the full transcript is in the report dir. Paths are written
relative to the report dir, and the repository root and home directory never appear, so
a JUnit file carries no absolute local path.
"""

from __future__ import annotations

import json
import os

from harness.locations import IMPORT_ROOT
from harness.results.records import CaseResult

SYSTEM_OUT_CAP = 8 * 1024  # characters of evidence per case
RECORD_CHARS = 300  # per transcript record shown
REPO_ROOT = str(IMPORT_ROOT)  # the checkout root, or site-packages when installed


def evidence_text(result: CaseResult, report_dir: str) -> str:
    lines = [f"case: {result.case_id}  frontend: {result.frontend}  level: {result.level}",
             f"requirement: {result.requirement}",
             f"source: {result.source}",
             f"verdict: {result.verdict.value}: {result.message}"]
    ev = result.evidence
    if ev.expected or ev.observed:
        lines += [f"expected: {ev.expected}", f"observed: {ev.observed}"]
    lines += [f"note: {note}" for note in ev.notes]
    if ev.transcript:
        where = (os.path.relpath(ev.transcript_file, report_dir) if ev.transcript_file
                 else "not written")
        lines.append(f"transcript ({len(ev.transcript)} records shown; full: {where}):")
        lines += ["  " + json.dumps(rec, separators=(",", ":"))[:RECORD_CHARS]
                  for rec in ev.transcript]
    return cap(relative_paths("\n".join(lines), report_dir))


def relative_paths(text: str, report_dir: str) -> str:
    """The report dir becomes `.`, the repository root and home dir disappear."""
    replacements = [(os.path.abspath(report_dir) + os.sep, ""),
                    (os.path.abspath(report_dir), "."),
                    (REPO_ROOT + os.sep, ""), (REPO_ROOT, "."),
                    (os.path.expanduser("~"), "~")]
    for absolute, relative in replacements:
        if len(absolute) > 1:
            text = text.replace(absolute, relative)
    return text


def cap(text: str, limit: int = SYSTEM_OUT_CAP) -> str:
    if len(text) <= limit:
        return text
    marker = (f"\n[... {len(text) - limit} characters cut; the full evidence is in "
              f"results.json and transcripts/ ...]\n")
    head = (limit - len(marker)) * 2 // 3
    tail = limit - len(marker) - head
    return text[:head] + marker + text[len(text) - tail:]
