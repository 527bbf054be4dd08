"""The soak's comparison: what counts as an identical run, and what the record says."""

from __future__ import annotations

import json

from harness.results.soak import SoakRun, compare, read_log, render_soak, verdicts_of

LOAD = (2.5, 2.1, 1.9)


def run(index: int, verdicts: dict[str, str], exit_code: int = 0,
        partial: bool = False) -> SoakRun:
    return SoakRun(index, exit_code, 160.0 + index, LOAD, LOAD, verdicts, partial)


BASE = {"abort.drop.single[reference]": "PASS", "handshake.ready.empty_payload[reference]": "INFO"}


def test_repeated_verdicts_are_identical() -> None:
    summary = compare([run(1, BASE), run(2, dict(BASE)), run(3, dict(BASE))])
    assert summary.changes == []
    assert summary.identical_runs == 3


def test_a_moved_verdict_is_named_with_its_run() -> None:
    moved = {**BASE, "abort.drop.single[reference]": "TIMEOUT"}
    summary = compare([run(1, BASE), run(2, moved), run(3, dict(BASE))])
    assert [(c.item, c.index, c.first, c.now) for c in summary.changes] == [
        ("abort.drop.single[reference]", 2, "PASS", "TIMEOUT")]
    assert summary.identical_runs == 2


def test_a_lost_or_new_item_is_a_change() -> None:
    lost = {"abort.drop.single[reference]": "PASS"}
    extra = {**BASE, "abort.new[reference]": "PASS"}
    summary = compare([run(1, BASE), run(2, lost), run(3, extra)])
    assert {(c.index, c.first, c.now) for c in summary.changes} == {
        (2, "INFO", "ABSENT"), (3, "ABSENT", "PASS")}
    assert summary.identical_runs == 1


def test_a_failed_or_partial_run_is_not_identical_even_with_equal_verdicts() -> None:
    summary = compare([run(1, BASE), run(2, dict(BASE), exit_code=1),
                       run(3, dict(BASE), partial=True)])
    assert summary.changes == []
    assert summary.identical_runs == 1


def test_log_round_trip_and_results_document() -> None:
    doc = {"meta": {}, "results": [{"id": "abort.drop.single", "frontend": "reference",
                                    "verdict": "PASS"}]}
    first = run(1, verdicts_of(doc))
    text = json.dumps(first.to_json()) + "\n\n"
    assert read_log(text) == [first]
    assert first.verdicts == {"abort.drop.single[reference]": "PASS"}


def test_rendered_record_states_result_changes_and_runs() -> None:
    moved = {**BASE, "abort.drop.single[reference]": "FAIL"}
    text = render_soak(compare([run(1, BASE), run(2, moved)]),
                       {"frontends": ["reference"], "workers": 2, "load_procs": 2,
                        "load_nice": 5, "cpus": 2, "command": "python scripts/soak.py",
                        "notes": ["stopped early"]})
    assert "**Result: 1/2 runs identical to run 1; 1 verdict changes" in text
    assert "| 2 | `abort.drop.single[reference]` | PASS | FAIL |" in text
    assert "2 busy-loop processes at nice 5 on a 2-CPU machine" in text
    assert "## Notes\n\n- stopped early\n" in text
    assert text.count("\n| 1 | 0 |") == 1 and text.count("\n| 2 | 0 |") == 1
