"""A single static, self-contained HTML report: the case x frontend matrix and details.

No external assets and no JavaScript framework: a small inline script toggles details and
hex views, so the file opens from a CI artifact store as-is.
"""

from __future__ import annotations

import html
import json
from typing import Any

from harness.results.records import CaseResult
from harness.results.schema import ResultsDocument

COLORS = {"PASS": "#2e7d32", "NON-STRICT": "#f9a825", "INFO": "#1565c0",
          "UNSUPPORTED": "#9e9e9e", "FAIL": "#c62828", "ERROR": "#6a1b9a",
          "TIMEOUT": "#ef6c00", "NOT-RUN": "#bdbdbd"}

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}
th{background:#f3f3f3}.v{color:#fff;font-weight:600;text-align:center;cursor:pointer}
.detail{display:none;border:1px solid #bbb;margin:8px 0;padding:8px;background:#fafafa}
.detail.open{display:block}pre{white-space:pre-wrap;font-size:12px;margin:4px 0}
.hex{display:none;color:#555}.showhex .hex{display:block}
"""

SCRIPT = """
function show(id){var d=document.getElementById(id);d.classList.toggle('open');
 if(d.classList.contains('open')){d.scrollIntoView();}}
function hex(id){document.getElementById(id).classList.toggle('showhex');}
window.addEventListener('DOMContentLoaded',function(){var h=location.hash.slice(1);
 if(h){var d=document.getElementById(h);if(d){d.classList.add('open');d.scrollIntoView();}}});
"""


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _detail_id(case_id: str, frontend: str) -> str:
    return "d-" + "".join(c if c.isalnum() else "-" for c in f"{case_id}-{frontend}")


def render_html(doc: ResultsDocument) -> str:
    results = doc.results
    meta = doc.meta
    frontends = doc.frontends()
    cases = doc.by_case()
    counts: dict[str, int] = {}
    for r in results:
        counts[r.verdict.value] = counts.get(r.verdict.value, 0) + 1
    out = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
           "<title>corewire conformance report</title>",
           f"<style>{STYLE}</style><script>{SCRIPT}</script></head><body>",
           "<h1>corewire conformance report</h1>",
           f"<p>{_esc(meta.profile_label())}, generated {_esc(meta.label('generated'))}</p>",
           *([f"<p id='partial'><b>PARTIAL</b>: {_esc(meta.partial_reason or '')}; only "
              f"the {len(results)} cases that finished are shown</p>"]
             if meta.partial else []),
           "<p id='summary'>" + " ".join(
               f"<span class='v' style='background:{COLORS[v]};padding:2px 6px'>"
               f"{_esc(v)} {n}</span>" for v, n in sorted(counts.items())) + "</p>",
           "<table id='matrix'><tr><th>case</th><th>level</th>"
           + "".join(f"<th>{_esc(f)}</th>" for f in frontends) + "</tr>"]
    for case_id in sorted(cases):
        row = cases[case_id]
        level = next(iter(row.values())).level
        out.append(f"<tr><td>{_esc(case_id)}</td><td>{_esc(level)}</td>")
        for fe in frontends:
            if fe not in row:
                out.append("<td></td>")
                continue
            r = row[fe]
            did = _detail_id(case_id, fe)
            mark = "*" if r.baseline else ""
            verdict = r.verdict.value
            out.append(f"<td class='v' data-verdict='{_esc(verdict)}' "
                       f"style='background:{COLORS.get(verdict, '#000')}' "
                       f"onclick=\"show('{did}')\">{_esc(verdict)}{mark}</td>")
        out.append("</tr>")
    out.append("</table><p>* tolerated by the baseline. Click a verdict for details.</p>")
    for r in results:
        out.append(_detail(r))
    out.append("</body></html>")
    return "\n".join(out)


def _detail(r: CaseResult) -> str:
    did = _detail_id(r.case_id, r.frontend)
    ev = r.evidence
    parts = [f"<div class='detail' id='{did}'>",
             f"<h3>{_esc(r.case_id)} [{_esc(r.frontend)}]: {_esc(r.verdict.value)}</h3>",
             f"<p><b>Requirement ({_esc(r.level)}):</b> {_esc(r.requirement)}<br>",
             f"<b>Source:</b> {_esc(r.source)}<br><b>Outcome:</b> {_esc(r.message)}</p>"]
    if r.baseline:
        parts.append(f"<p><b>Baselined:</b> {_esc(r.baseline)}</p>")
    if ev.expected or ev.observed:
        parts.append(f"<p><b>Expected:</b> {_esc(ev.expected)}<br>"
                     f"<b>Observed:</b> {_esc(ev.observed)}</p>")
    for note in ev.notes:
        parts.append(f"<pre>{_esc(note)}</pre>")
    records = ev.transcript
    if records:
        tid = did + "-t"
        parts.append(f"<p><b>Transcript</b> ({len(records)} records) "
                     f"<button onclick=\"hex('{tid}')\">hex</button></p><div class='transcript' "
                     f"id='{tid}'>")
        for rec in records:
            who = ("driver program" if rec.get("channel") == "driver"
                   else f"engine {rec.get('rank')}")
            head = (f"t={rec.get('t')} {who} {rec.get('direction')} "
                    f"{rec.get('channel')} {rec.get('note', '')}")
            body = rec.get("decoded", rec.get("error", rec.get("line", "")))
            parts.append(f"<pre>{_esc(head)}\n{_esc(json.dumps(body)[:2000])}</pre>"
                         f"<pre class='hex'>{_esc(' | '.join(rec.get('frames_hex', [])))}</pre>")
        parts.append("</div>")
    parts.append("</div>")
    return "".join(parts)
