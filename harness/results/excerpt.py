"""The transcript excerpt a verdict carries: the records that explain it, not the noise.

A failing case's last records are often forty DP-stats publications of the mock coordinator
(one every 100 ms), which push the requests, aborts and utility calls out of the excerpt.
Runs of coordinator publications are folded into one line saying how many, then the last
`limit` entries are kept. The full transcript is always written beside the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

EXCERPT_RECORDS = 40


def _is_heartbeat(record: dict[str, Any]) -> bool:
    """A regular publication of the mock DP coordinator (load stats, no request in it)."""
    return (record.get("channel") == "coordinator" and record.get("direction") == "out"
            and not record.get("note"))


def fold_heartbeats(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run of 2+ coordinator publications becomes one entry counting them."""
    folded: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []

    def flush() -> None:
        if len(run) == 1:
            folded.append(run[0])
        elif run:
            folded.append({"t": run[0].get("t"), "rank": run[0].get("rank"),
                           "direction": "out", "channel": "coordinator",
                           "folded": len(run),
                           "note": f"{len(run)} DP stats publications "
                                   f"(t {run[0].get('t')} .. {run[-1].get('t')}) folded"})
        run.clear()

    for record in records:
        if _is_heartbeat(record):
            run.append(record)
            continue
        flush()
        folded.append(record)
    flush()
    return folded


def transcript_excerpt(records: Sequence[dict[str, Any]],
                       limit: int = EXCERPT_RECORDS) -> list[dict[str, Any]]:
    """The last `limit` entries once heartbeats are folded."""
    return fold_heartbeats(records)[-limit:]
