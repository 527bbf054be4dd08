"""docs/history.md rendering: the matrix, the changed-in column and its PR links."""

from __future__ import annotations

from typing import Any

from harness.report.history import changes, render_history


def run(release: str, verdicts: dict[str, str]) -> dict[str, Any]:
    return {"meta": {}, "results": [
        {"id": case_id, "frontend": f"vllm-rs@{release}", "level": "MUST", "verdict": v}
        for case_id, v in verdicts.items()]}


def test_changes_skip_releases_without_a_verdict() -> None:
    assert changes(["FAIL", None, "PASS", "PASS"], ["a", "b", "c", "d"]) == [("c", "**F**→P")]
    assert changes([None, "PASS"], ["a", "b"]) == []


def test_matrix_orders_releases_numerically_and_links_known_prs() -> None:
    doc = render_history({
        "0.23.0": run("0.23.0", {"dp.is_sleeping.disagree": "PASS", "abort.drop.single": "PASS"}),
        "0.22.1": run("0.22.1", {"dp.is_sleeping.disagree": "FAIL", "abort.drop.single": "PASS"}),
        "0.9.0": run("0.9.0", {"dp.is_sleeping.disagree": "FAIL"}),
    })
    header = next(line for line in doc.splitlines() if line.startswith("| case |"))
    assert header.index("0.9.0") < header.index("0.22.1") < header.index("0.23.0")
    row = next(line for line in doc.splitlines() if line.startswith("| dp.is_sleeping.disagree"))
    assert "0.23.0 **F**→P [#43429](https://github.com/vllm-project/vllm/pull/43429)" in row
    same = next(line for line in doc.splitlines() if line.startswith("| abort.drop.single"))
    assert same.endswith("|  |")  # no change, no note
    known = next(line for line in doc.splitlines() if "#43429" in line and "| 0.23.0 |" in line)
    assert "dp.is_sleeping.disagree" in known
