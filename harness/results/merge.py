"""`corewire merge DIR...`: join the report dirs of a sharded run into one report set.

Each input is the `--report-dir` of one `--shard i/n` run (or of an unsharded run, read as
shard 1/1). Inputs are grouped by their selection (frontends, -k, -m, paths), so a CI
matrix of frontend x shard merges in one call; within a group the shards must be exactly
1..n of one n, and no item (case x frontend) may come from two inputs. The merged set is
what the unsharded run would have written: results.json, report.html, junit.xml and the
transcripts, and the exit code of docs/cli.md (6 when a shard stopped a frontend that
could not start: harness/run/failfast.py).
"""

from __future__ import annotations

import json
import os
import shutil
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

import msgspec

from harness.results.baseline import Baseline, apply_baseline
from harness.results.records import CaseResult
from harness.results.reportdir import TRANSCRIPTS, clear_report_set
from harness.results.schema import (
    MergedFrom,
    ResultsDocument,
    ResultsFileError,
    RunMeta,
    read_document,
)
from harness.results.startup import EXIT_FRONTEND_STOPPED, Stop
from harness.results.writer import write_document

EXIT_PASS, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_NO_CASE = 0, 1, 2, 5


class MergeError(Exception):
    """Inputs that do not make one run: said in one line, exit 4."""


@dataclass
class ShardRun:
    """One input dir: its results document and where it came from."""

    directory: str
    doc: ResultsDocument

    @property
    def meta(self) -> RunMeta:
        return self.doc.meta

    @property
    def shard(self) -> tuple[int, int]:
        value = self.meta.shard or [1, 1]
        return int(value[0]), int(value[1])

    @property
    def selection(self) -> dict[str, Any]:
        sel = dict(self.meta.selection or {})
        sel.pop("selected_items", None)
        sel.pop("shard_items", None)
        return sel

    def label(self) -> str:
        i, n = self.shard
        return f"shard {i}/{n} ({self.directory})"


@dataclass
class Merged:
    doc: ResultsDocument
    exit_code: int
    failing: dict[str, str] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    outside: dict[str, int] = field(default_factory=dict)  # shard -> errors outside cases
    stops: list[Stop] = field(default_factory=list)  # frontends a shard stopped


def load_shard(directory: str) -> ShardRun:
    path = os.path.join(directory, "results.json")
    try:
        doc = read_document(path)
    except ResultsFileError as exc:
        raise MergeError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise MergeError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    run = ShardRun(directory, doc)
    try:
        i, n = run.shard
    except (TypeError, ValueError, IndexError):
        raise MergeError(f"{path}: malformed meta.shard {doc.meta.shard!r}") from None
    if not 1 <= i <= n:
        raise MergeError(f"{path}: malformed meta.shard {doc.meta.shard!r}")
    return run


def _describe(selection: dict[str, Any]) -> str:
    parts = [f"--frontend {' '.join(selection.get('frontends') or ['?'])}"]
    for key, flag in (("keyword", "-k"), ("markexpr", "-m")):
        if selection.get(key):
            parts.append(f"{flag} {selection[key]!r}")
    return " ".join(parts)


def check_partition(runs: list[ShardRun]) -> None:
    """Every group of one selection holds shards 1..n of one n, each once; no item twice."""
    groups: dict[str, list[ShardRun]] = {}
    for run in runs:
        groups.setdefault(json.dumps(run.selection, sort_keys=True), []).append(run)
    for members in groups.values():
        what = _describe(members[0].selection)
        counts = sorted({run.shard[1] for run in members})
        if len(counts) > 1:
            raise MergeError(f"mixed shard counts {counts} for the selection {what}: "
                             + ", ".join(r.label() for r in members))
        count = counts[0]
        seen: dict[int, ShardRun] = {}
        for run in members:
            index = run.shard[0]
            if index in seen:
                raise MergeError(f"shard {index}/{count} given twice: {seen[index].directory}"
                                 f" and {run.directory}")
            seen[index] = run
        missing = [i for i in range(1, count + 1) if i not in seen]
        if missing:
            raise MergeError(f"missing shard {', '.join(f'{i}/{count}' for i in missing)} "
                             f"of the selection {what}")
        metas = [run.meta.selection or {} for run in members]
        sizes = {sel.get("selected_items") for sel in metas}
        sums = sum(sel.get("shard_items") or 0 for sel in metas)
        if len(sizes) == 1 and None not in sizes and count > 1 and sums != sizes.pop():
            raise MergeError(f"the shards of {what} disagree on the selection (their items "
                             f"do not add up): run them from one commit")
    owner: dict[tuple[str, str], str] = {}
    for run in runs:
        for row in run.doc.results:
            key = (row.case_id, row.frontend)
            if key in owner:
                raise MergeError(f"overlapping shards: {key[0]}[{key[1]}] is in both "
                                 f"{owner[key]} and {run.directory}")
            owner[key] = run.directory
    profiles = {f"{run.meta.protocol_profile or None} {run.meta.frontend_profiles or ''}"
                for run in runs}
    if len(profiles) > 1:
        raise MergeError(f"mixed protocol profiles {sorted(profiles)}: one run, one profile")


def _partial_reasons(runs: list[ShardRun]) -> list[str]:
    reasons = []
    for run in runs:
        meta = run.meta
        planned = (meta.selection or {}).get("shard_items")
        if meta.partial:
            reasons.append(f"{run.label()}: {meta.partial_reason or 'partial'}")
        elif planned is not None and len(run.doc.results) < planned:
            reasons.append(f"{run.label()}: {len(run.doc.results)} of {planned} items "
                           f"reported")
    return reasons


def _failing(runs: list[ShardRun], results: list[CaseResult],
             baseline: Baseline | None) -> dict[str, str]:
    """What fails the merged run: re-graded against `baseline` when one is given, else as
    each shard graded it (its meta.failing; a verdict that fails for older inputs)."""
    failing: dict[str, str] = {}
    if baseline is not None:
        for result in results:
            result.baseline = None
            outcome = apply_baseline(result, baseline)
            if outcome.fail:
                failing[f"{result.case_id}[{result.frontend}]"] = outcome.message
        return failing
    for run in runs:
        recorded = run.meta.failing
        if isinstance(recorded, dict):
            failing.update(recorded)
            continue
        for row in run.doc.results:
            if row.verdict.failing and not row.baseline:
                failing[f"{row.case_id}[{row.frontend}]"] = f"{row.verdict.value}: " \
                                                            f"{row.message}"
    return failing


def _copy_transcripts(run: ShardRun, out: str) -> dict[str, str]:
    """Copy the input's transcripts into `out`; returns old path -> new path by name."""
    source = os.path.join(run.directory, TRANSCRIPTS)
    moved: dict[str, str] = {}
    if not os.path.isdir(source):
        return moved
    target = os.path.join(out, TRANSCRIPTS)
    os.makedirs(target, exist_ok=True)
    for name in sorted(os.listdir(source)):
        if name.endswith(".json"):
            shutil.copyfile(os.path.join(source, name), os.path.join(target, name))
            moved[name] = os.path.join(target, name)
    return moved


def merge_junit(paths: list[str], out_path: str) -> bool:
    """One `testsuite` holding every input's test cases (sorted by name), counts summed.
    Returns False when no input has a junit.xml."""
    cases: list[ET.Element] = []
    totals = {"errors": 0, "failures": 0, "skipped": 0, "tests": 0}
    seconds = 0.0
    template: ET.Element | None = None
    root_attrib: dict[str, str] = {}
    for path in paths:
        if not os.path.exists(path):
            continue
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as exc:
            raise MergeError(f"{path}: unreadable JUnit XML ({exc})") from None
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        if root.tag == "testsuites" and not root_attrib:
            root_attrib = dict(root.attrib)
        for suite in suites:
            template = template if template is not None else suite
            for key in totals:
                totals[key] += int(suite.get(key, "0"))
            seconds += float(suite.get("time", "0"))
            cases.extend(suite.iter("testcase"))
    if template is None:
        return False
    suite = ET.Element("testsuite", dict(template.attrib))
    suite.attrib.update({k: str(v) for k, v in totals.items()})
    suite.set("time", f"{seconds:.3f}")
    for case in sorted(cases, key=lambda c: (c.get("classname", ""), c.get("name", ""))):
        suite.append(case)
    merged = ET.Element("testsuites", root_attrib)
    merged.append(suite)
    ET.ElementTree(merged).write(out_path, encoding="utf-8", xml_declaration=True)
    return True


def merge_runs(directories: list[str], out: str, baseline: Baseline | None = None) -> Merged:
    """Check the inputs make one run, then write its report set into `out`."""
    if not directories:
        raise MergeError("no report dir given")
    real_out = os.path.realpath(out)
    if any(os.path.realpath(d) == real_out for d in directories):
        raise MergeError(f"--report-dir {out} is one of the inputs: merge into a new dir")
    runs = [load_shard(d) for d in directories]
    check_partition(runs)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise MergeError(f"--report-dir {out}: {exc}") from None
    clear_report_set(out)
    results: list[CaseResult] = []
    for run in runs:
        moved = _copy_transcripts(run, out)
        for result in run.doc.results:
            old = result.evidence.transcript_file
            if old:
                result.evidence.transcript_file = moved.get(os.path.basename(old), old)
            results.append(result)
    results.sort(key=lambda r: (r.case_id, r.frontend))
    failing = _failing(runs, results, baseline)
    reasons = _partial_reasons(runs)
    outside = {r.label(): int(r.meta.failed_outside_cases or 0) for r in runs}
    outside = {label: count for label, count in outside.items() if count}
    stops = sorted({stop.frontend: stop for run in runs
                    for stop in (run.meta.stopped or [])}.values(), key=lambda s: s.frontend)
    meta = msgspec.structs.replace(
        runs[0].meta, shard=None, partial=bool(reasons),
        merged_from=[MergedFrom(r.directory, list(r.shard)) for r in runs],
        selection=_merged_selection(runs), failing=failing,
        failed_outside_cases=sum(outside.values()),
        partial_reason="; ".join(reasons) if reasons else msgspec.UNSET,
        stopped=stops or msgspec.UNSET)
    doc = ResultsDocument(meta, results)
    paths = write_document(doc, out)
    junit = os.path.join(out, "junit.xml")
    if merge_junit([os.path.join(r.directory, "junit.xml") for r in runs], junit):
        paths["junit"] = junit
    if reasons:
        code = EXIT_INTERRUPTED
    elif stops:
        code = EXIT_FRONTEND_STOPPED
    elif failing or outside:
        code = EXIT_FAILURE
    elif not results:
        code = EXIT_NO_CASE
    else:
        code = EXIT_PASS
    return Merged(doc, code, failing, paths, outside, stops)


def _merged_selection(runs: list[ShardRun]) -> dict[str, Any]:
    """One selection when every shard had it; else the union of frontends, the rest listed."""
    selections = {json.dumps(r.selection, sort_keys=True): r.selection for r in runs}
    if len(selections) == 1:
        return next(iter(selections.values()))
    frontends = sorted({f for s in selections.values() for f in s.get("frontends") or []})
    return {"frontends": frontends, "groups": list(selections.values())}


def summary_lines(merged: Merged, verbose: bool = False) -> list[str]:
    """The terminal summary of `corewire run` (harness/results/summary.py), for the merged
    run."""
    from harness.results.summary import SummaryInput
    from harness.results.summary import summary_lines as verdict_lines

    meta = merged.doc.meta
    lines = []
    if meta.partial:
        reason = None if meta.partial_reason is msgspec.UNSET else meta.partial_reason
        lines.append(f"PARTIAL: {reason}; {len(merged.doc.results)} finished cases "
                     f"reported")
    lines += verdict_lines(SummaryInput(merged.doc.results, merged.failing, merged.stops,
                                        verbose))
    for label, count in merged.outside.items():
        lines.append(f"ERROR       {label}: {count} error(s) outside any case (e.g. a leak "
                     f"found at session end); see that shard's junit.xml")
    lines.append("reports: " + ", ".join(merged.paths.values()))
    return lines
