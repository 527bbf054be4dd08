"""junit.xml of a run, written by corewire itself from the results (not by pytest's
junitxml plugin), so plain `pytest conformance --report-dir X` and `corewire run` write the
same file, and it holds what CI dashboards need:

* one `testcase` per case x frontend, named `case[frontend]` (the frontend by its stable
  name), classname `conformance.<area>`;
* its verdict, level, area and frontend (and baseline reason) as testcase `properties`:
  NON-STRICT and UNSUPPORTED, both skips, differ by the `verdict` property;
* `failure` (the run fails on it) or `skipped` with the verdict class leading the message;
* exactly one `system-out`: the evidence (harness/results/evidence.py: capped, paths
  relative to the report dir, no absolute local path in any text);
* one `error` testcase per error outside any case (a leak found at session end).

pytest's own `--junitxml` still works for another path; given the report dir's junit.xml,
it is left to this writer (the plugin turns pytest's off).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence

from harness.results.evidence import evidence_text, relative_paths
from harness.results.records import CaseResult
from harness.results.summary import item_name, pytest_outcome

JUNIT = "junit.xml"
MESSAGE_CHARS = 1000  # of a failure / skip message attribute (the element holds it whole)
# Characters XML 1.0 cannot hold (a frontend's bytes may be anything): written as \xNN.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text: str, report_dir: str) -> str:
    clean = _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return relative_paths(clean, report_dir)


def outcome_message(r: CaseResult, failing: Mapping[str, str]) -> str:
    """The failure or skip message, verdict class first (as the plugin's outcome said)."""
    why = failing.get(item_name(r))
    if why is not None:
        return why
    if r.baseline:
        return f"BASELINED {r.verdict.value}: {r.message} [{r.baseline}]"
    return f"{r.verdict.value}: {r.message}"


def junit_tree(results: Sequence[CaseResult], report_dir: str,
               failing: Mapping[str, str], outside: Sequence[str] = (),
               properties: Mapping[str, str] | None = None) -> ET.ElementTree:
    """The JUnit document of a run's rows (sorted by classname and name)."""
    suite = ET.Element("testsuite", {"name": "corewire"})
    if properties:
        props = ET.SubElement(suite, "properties")
        for key, value in properties.items():
            ET.SubElement(props, "property", {"name": key,
                                              "value": _xml_text(value, report_dir)})
    counts = {"errors": 0, "failures": 0, "skipped": 0}
    seconds = 0.0
    for r in sorted(results, key=lambda r: (r.case_id.split(".", 1)[0], item_name(r))):
        area = r.case_id.split(".", 1)[0]
        case = ET.SubElement(suite, "testcase", {"classname": f"conformance.{area}",
                                                 "name": item_name(r),
                                                 "time": f"{r.duration:.3f}"})
        seconds += r.duration
        outcome = pytest_outcome(r, failing)
        props = ET.SubElement(case, "properties")
        facts = {"verdict": r.verdict.value, "level": r.level, "area": area,
                 "frontend": r.frontend, "outcome": outcome}
        if r.baseline:
            facts["baseline"] = r.baseline
        for key, value in facts.items():
            ET.SubElement(props, "property", {"name": key,
                                              "value": _xml_text(value, report_dir)})
        if outcome != "passed":
            message = _xml_text(outcome_message(r, failing), report_dir)
            tag = "failure" if outcome == "failed" else "skipped"
            counts["failures" if outcome == "failed" else "skipped"] += 1
            element = ET.SubElement(case, tag, {"message": message[:MESSAGE_CHARS]})
            element.text = message
        ET.SubElement(case, "system-out").text = _xml_text(evidence_text(r, report_dir),
                                                           report_dir)
    for problem in outside:
        where, _, message = problem.partition(": ")
        case = ET.SubElement(suite, "testcase", {"classname": "corewire",
                                                 "name": _xml_text(where, report_dir),
                                                 "time": "0.000"})
        text = _xml_text(message or problem, report_dir)
        ET.SubElement(case, "error", {"message": text[:MESSAGE_CHARS]}).text = text
        counts["errors"] += 1
    suite.attrib.update({**{k: str(v) for k, v in counts.items()},
                         "tests": str(len(results) + len(outside)),
                         "time": f"{seconds:.3f}",
                         "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(
                             timespec="seconds"),
                         "hostname": platform.node()})
    root = ET.Element("testsuites", {"name": "corewire"})
    root.append(suite)
    ET.indent(root, space=" ")
    return ET.ElementTree(root)


def write_junit(results: Sequence[CaseResult], report_dir: str, failing: Mapping[str, str],
                outside: Sequence[str] = (),
                properties: Mapping[str, str] | None = None) -> str:
    """Write `report_dir/junit.xml`; returns its path."""
    path = os.path.join(report_dir, JUNIT)
    tree = junit_tree(results, report_dir, failing, outside, properties)
    partial = f"{path}.partial-{os.getpid()}"
    tree.write(partial, encoding="utf-8", xml_declaration=True)
    os.replace(partial, path)
    return path
