"""A verdict's transcript excerpt keeps the records that explain it (heartbeats folded)."""

from __future__ import annotations

from typing import Any

from harness.results.excerpt import EXCERPT_RECORDS, fold_heartbeats, transcript_excerpt


def _record(t: float, channel: str, direction: str = "in", **extra: Any) -> dict[str, Any]:
    return {"t": t, "rank": 0, "direction": direction, "channel": channel, **extra}


def test_requests_survive_a_long_run_of_coordinator_publications() -> None:
    """Before: the last 40 records were 39 publications and the ABORT; the ADD was gone."""
    records = [_record(0.0, "input", decoded={"type": "ADD"}),
               *(_record(0.1 * i, "coordinator", "out") for i in range(1, 60)),
               _record(6.0, "input", decoded={"type": "ABORT"})]
    excerpt = transcript_excerpt(records)
    assert [r.get("decoded", {}).get("type") for r in excerpt if r["channel"] == "input"] \
        == ["ADD", "ABORT"]
    folded = [r for r in excerpt if r.get("folded")]
    assert [r["folded"] for r in folded] == [59]
    assert "59 DP stats publications" in folded[0]["note"]


def test_single_publications_and_injected_ones_are_kept_as_they_are() -> None:
    lone = _record(0.1, "coordinator", "out")
    injected = _record(0.2, "coordinator", "out", note="injected")
    records = [_record(0.0, "input"), lone, _record(0.15, "output", "out"), injected,
               _record(0.3, "coordinator", "in", note="subscription")]
    assert fold_heartbeats(records) == records


def test_the_excerpt_is_bounded() -> None:
    records = [_record(float(i), "input") for i in range(3 * EXCERPT_RECORDS)]
    excerpt = transcript_excerpt(records)
    assert len(excerpt) == EXCERPT_RECORDS and excerpt[-1] == records[-1]
