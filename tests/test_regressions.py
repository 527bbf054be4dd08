"""Promoted stateful failures: every fixtures/regressions/*.json replays clean.

A replay file (reports/stateful/*.json, written when a stateful run fails) becomes a
regression case with ``python -m harness.stateful promote FILE [--name NAME]``; from then
on the reference core must pass its steps. With no promoted file, the loader and the
promotion round trip are still checked, so this module never reports "no tests".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conformance.abort.mutants import DuplicateAbort
from harness.stateful import (
    REGRESSIONS_DIR,
    REPLAY_FORMAT,
    InvariantViolation,
    load_replay,
    promote,
    regression_files,
    replay,
    replays,
)

REGRESSIONS = regression_files()


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_regression_replays_clean(path: Path) -> None:
    replay(path)


def _replay_file(path: Path) -> Path:
    """A minimal replay of a drop on a live request: one ABORT owed, exactly once."""
    data: dict[str, Any] = {
        "format": REPLAY_FORMAT, "transport": "sansio", "core": "test", "seed": None,
        "invariant": "abort_exactly_once", "message": "hand-written", "failed_step": 3,
        "steps": [
            {"rule": "init", "args": {"ranks": 2, "report_finished": False}},
            {"rule": "generate", "args": {"requests": [
                {"kind": "hold", "tokens": 1, "reason": "length", "interval_ms": 0,
                 "dp_rank": 1, "chunk": 1, "stop_at": None}]}},
            {"rule": "drop", "args": {"picks": [0]}},
            {"rule": "drain", "args": {}},
        ],
    }
    path.write_text(json.dumps(data))
    return path


def test_loader_and_promotion_round_trip(tmp_path: Path) -> None:
    """promote() -> regression_files() -> replay(): clean on the reference, and the same
    steps still catch the bug they were written for."""
    source = _replay_file(tmp_path / "found.json")
    target_dir = tmp_path / "regressions"
    assert regression_files(target_dir) == []  # an absent directory holds no cases
    promoted = promote(source, name="drop abort once", directory=target_dir)
    assert promoted.name == "drop-abort-once.json"
    assert regression_files(target_dir) == [promoted]
    assert load_replay(promoted)["promoted_from"] == str(source)
    replay(promoted)
    with pytest.raises(InvariantViolation) as info:
        replay(promoted, core_factory=DuplicateAbort)
    assert info.value.invariant == "abort_exactly_once"


def test_promotion_refuses_bad_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a replay file, or steps the reference fails: neither becomes a regression case."""
    source = _replay_file(tmp_path / "found.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**load_replay(source), "format": "something-else"}))
    with pytest.raises(ValueError, match="not a corewire-stateful-replay"):
        promote(bad, directory=tmp_path / "regressions")

    def failing(*_args: object, **_kwargs: object) -> None:
        raise InvariantViolation("abort_exactly_once", "still broken")

    monkeypatch.setattr(replays, "replay_steps", failing)
    with pytest.raises(ValueError, match="fails against the reference core"):
        promote(source, directory=tmp_path / "regressions")
    assert regression_files(tmp_path / "regressions") == []


def test_committed_regressions_are_replay_files() -> None:
    """Whatever sits in fixtures/regressions/ loads as a replay file (or nothing is there)."""
    for path in regression_files():
        load_replay(path)
    assert all(p.parent == REGRESSIONS_DIR for p in REGRESSIONS)
