"""Write results.json and report.html for one run (called on the xdist controller)."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from typing import Any

from harness.report.html import render_html
from harness.verdicts import CaseResult
from harness.wire.profiles import VLLM_0_33, ProtocolProfile


def run_metadata(profile: ProtocolProfile | None = None) -> dict[str, Any]:
    """The run's labels; `profile` is the protocol its mock engines spoke (--profile)."""
    profile = profile or VLLM_0_33
    return {
        "generated": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "protocol_profile": profile.name,
        "vllm_version": profile.vllm_version,
        "python": platform.python_version(),
        "host": platform.node(),
    }


def results_document(results: list[CaseResult], profile: ProtocolProfile | None = None,
                     partial: str | None = None,
                     run_meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """`partial`: why the run stopped early (e.g. "interrupted by SIGINT"); the document
    then holds only the cases that finished, and says so (meta.partial). `run_meta`:
    the shard, the selection and the items failing the run (what `corewire merge` reads)."""
    ordered = sorted(results, key=lambda r: (r.case_id, r.frontend))
    meta = run_metadata(profile)
    meta.update(run_meta or {})
    meta["partial"] = partial is not None
    if partial is not None:
        meta["partial_reason"] = partial
    return {"meta": meta, "results": [r.to_json() for r in ordered]}


def write_reports(results: list[CaseResult], report_dir: str,
                  profile: ProtocolProfile | None = None,
                  partial: str | None = None,
                  run_meta: dict[str, Any] | None = None) -> dict[str, str]:
    """Write JSON and HTML; returns their paths."""
    os.makedirs(report_dir, exist_ok=True)
    doc = results_document(results, profile, partial, run_meta)
    return write_document(doc, report_dir)


def write_document(doc: dict[str, Any], report_dir: str) -> dict[str, str]:
    """Write a results document as results.json and report.html; returns their paths."""
    os.makedirs(report_dir, exist_ok=True)
    json_path = os.path.join(report_dir, "results.json")
    with open(json_path, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    html_path = os.path.join(report_dir, "report.html")
    with open(html_path, "w") as fh:
        fh.write(render_html(doc))
    return {"json": json_path, "html": html_path}


def load_results(path: str) -> list[CaseResult]:
    with open(path) as fh:
        doc = json.load(fh)
    return [CaseResult.from_json(r) for r in doc["results"]]
