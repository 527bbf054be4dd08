"""Write results.json and report.html for one run (called on the xdist controller)."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
from collections.abc import Mapping

from harness.protocol.wire.profiles import VLLM_0_33, ProtocolProfile
from harness.results.failsafe import ReportsNotWritten, describe
from harness.results.html import render_html
from harness.results.records import CaseResult
from harness.results.schema import (
    PER_FRONTEND,
    ResultsDocument,
    RunMeta,
    document_json,
    read_results,
)


def run_metadata(profile: ProtocolProfile | None = None,
                 frontend_profiles: Mapping[str, ProtocolProfile] | None = None) -> RunMeta:
    """The run's labels. `profile`: the run's --profile; `frontend_profiles`: the profile
    each (wire) frontend's engines spoke. One profile for all: that one is the label;
    several (vllm-rs@0.23.0 beside vllm-rs): PER_FRONTEND, and each frontend's."""
    spoken = dict(sorted((frontend_profiles or {}).items()))
    distinct = {p.name: p for p in spoken.values()}
    meta = RunMeta(generated=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    if len(distinct) > 1:
        meta.protocol_profile = meta.vllm_version = PER_FRONTEND
        meta.frontend_profiles = {name: p.name for name, p in spoken.items()}
    else:
        chosen = next(iter(distinct.values())) if distinct else profile or VLLM_0_33
        meta.protocol_profile, meta.vllm_version = chosen.name, chosen.vllm_version
    meta.python, meta.host = platform.python_version(), platform.node()
    return meta


def results_document(results: list[CaseResult], profile: ProtocolProfile | None = None,
                     partial: str | None = None,
                     run_meta: RunMeta | None = None,
                     frontend_profiles: Mapping[str, ProtocolProfile] | None = None
                     ) -> ResultsDocument:
    """`partial`: why the run stopped early (e.g. "interrupted by SIGINT"); the document
    then holds only the cases that finished, and says so (meta.partial). `run_meta`:
    the shard, the selection and the items failing the run (what `corewire merge` reads);
    its labels are this run's."""
    ordered = sorted(results, key=lambda r: (r.case_id, r.frontend))
    labels = run_metadata(profile, frontend_profiles)
    facts = run_meta or RunMeta()
    meta = RunMeta(labels.generated, labels.protocol_profile, labels.vllm_version,
                   labels.python, labels.host, shard=facts.shard, selection=facts.selection,
                   failing=facts.failing, failed_outside_cases=facts.failed_outside_cases,
                   partial=partial is not None, frontend_profiles=labels.frontend_profiles)
    if partial is not None:
        meta.partial_reason = partial
    meta.stopped = facts.stopped
    return ResultsDocument(meta, ordered)


def write_reports(results: list[CaseResult], report_dir: str,
                  profile: ProtocolProfile | None = None,
                  partial: str | None = None,
                  run_meta: RunMeta | None = None,
                  frontend_profiles: Mapping[str, ProtocolProfile] | None = None
                  ) -> dict[str, str]:
    """Write JSON and HTML; returns their paths."""
    os.makedirs(report_dir, exist_ok=True)
    doc = results_document(results, profile, partial, run_meta, frontend_profiles)
    return write_document(doc, report_dir)


def write_document(doc: ResultsDocument, report_dir: str) -> dict[str, str]:
    """Write a results document as results.json and report.html; returns their paths.
    Each is tried even when the other fails; a failed write leaves no file and raises
    ReportsNotWritten naming each path with its errno (a full disk, a size limit)."""
    os.makedirs(report_dir, exist_ok=True)
    paths = {"json": os.path.join(report_dir, "results.json"),
             "html": os.path.join(report_dir, "report.html")}
    failures = []
    for kind, render in (("json", document_json), ("html", render_html)):
        try:
            write_atomically(paths[kind], render(doc))
        except OSError as exc:
            failures.append(describe(paths[kind], exc))
    if failures:
        raise ReportsNotWritten(failures)
    return paths


def write_atomically(path: str, text: str) -> None:
    """Write beside `path` and rename over it: a reader (or a disk that fills up mid-write)
    never leaves a half-written report, only the old file or the new one. The temporary
    file is removed when the write fails."""
    partial = f"{path}.partial-{os.getpid()}"
    try:
        with open(partial, "w") as fh:
            fh.write(text)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise


def load_results(path: str) -> list[CaseResult]:
    """The rows of a results.json (`corewire diff`, the kill matrix)."""
    return read_results(path)
