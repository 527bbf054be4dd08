"""Stateful fuzzing of the frontend role (harness/stateful/): proof that the suite bites.

* (a) The reference core survives random sessions: 200 examples by default (sans-IO);
  ``COREWIRE_STATEFUL_EXAMPLES=N`` overrides, and the "nightly" profile runs 5000 examples
  of 100 steps: ``HYPOTHESIS_PROFILE=nightly make test`` or
  ``pytest --hypothesis-profile=nightly tests/test_stateful.py`` (the latter needs the
  harness.run.replay_plugin plugin loaded, which registers the profile).
* (b) Planted bugs are found and shrunk, their replay files written, and each replay
  re-raises the same invariant against the buggy core and passes against the reference.
* (c) The same machine over real ZMQ sockets (EngineGroup + ReferenceFrontend).

A failure in (a) or (c) leaves a replay file in reports/stateful/ ($COREWIRE_STATEFUL_DIR);
``pytest --replay FILE`` re-runs it, ``python -m harness.stateful promote FILE`` keeps it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import hypothesis
import pytest

from conformance.streaming.mutants import AbortFinishedIds
from harness.frontends.reference.core import ReferenceFrontendCore, ToEngine
from harness.frontends.reference.frontend import CoreFactory
from harness.stateful import (
    EXAMPLES_ENV,
    NIGHTLY,
    STATEFUL_DIR_ENV,
    InvariantViolation,
    core_name,
    load_replay,
    replay,
    replay_steps,
    run_stateful,
    stateful_settings,
)

EXAMPLES = stateful_settings().max_examples
SOCKET_EXAMPLES = int(os.environ.get("COREWIRE_STATEFUL_SOCKET_EXAMPLES", "10"))
PLANTED_SEED = 20240607  # fixed, so the planted-bug search is the same run every time


class AbortBatchToLowestRank(ReferenceFrontendCore):
    """Planted bug: an abort pass covering several engines sends every id to the lowest rank.

    Only reachable with two or more engines, live requests on two of them, and one abort
    (or drain) pass covering both: a single-engine or single-request case never shows it.
    """

    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[ToEngine]:
        if len(per_engine) > 1:
            merged = [rid for _, ids in sorted(per_engine.items()) for rid in ids]
            per_engine = {min(per_engine): merged}
        return super().abort_frames(per_engine)


@pytest.fixture
def replay_dir(request: pytest.FixtureRequest) -> Path:
    """Where a failure of the reference leaves its replay: the env's choice or reports/."""
    return Path(os.environ.get(STATEFUL_DIR_ENV)
                or request.config.rootpath / "reports" / "stateful")


# ------------------------------------------------------------------ (a) the reference


def test_settings_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 by default, the nightly profile's 5000 when selected, the env's count over both."""
    monkeypatch.delenv(EXAMPLES_ENV, raising=False)
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    if hypothesis.settings.get_current_profile_name() != NIGHTLY:
        assert stateful_settings().max_examples == 200
    monkeypatch.setenv("HYPOTHESIS_PROFILE", NIGHTLY)
    nightly = stateful_settings()
    assert (nightly.max_examples, nightly.stateful_step_count) == (5000, 100)
    assert hypothesis.Phase.explain not in nightly.phases and nightly.deadline is None
    monkeypatch.setenv(EXAMPLES_ENV, "7")
    assert stateful_settings().max_examples == 7
    assert stateful_settings(max_examples=3).max_examples == 3



def test_importing_the_package_registers_no_profile() -> None:
    """The "nightly" profile exists once asked for (register_profiles, the replay plugin's
    configure hook, stateful_settings), never as a side effect of an import."""
    code = ("import hypothesis, harness.stateful, harness.run.replay_plugin\n"
            "try:\n    hypothesis.settings.get_profile('nightly')\n"
            "except hypothesis.errors.InvalidArgument:\n    print('absent')\n"
            "harness.stateful.register_profiles()\n"
            "print(hypothesis.settings.get_profile('nightly').max_examples)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.split() == ["absent", "5000"]


@pytest.mark.timeout(max(120, int(EXAMPLES * 0.25)))  # a nightly run gets its time
def test_reference_survives_random_sessions(replay_dir: Path) -> None:
    run_stateful(ReferenceFrontendCore, settings=stateful_settings(),
                 replay_directory=replay_dir)


# ------------------------------------------------------------------ (b) planted bugs


@pytest.mark.parametrize(("core", "invariants"), [
    (AbortBatchToLowestRank, {"abort_at_owner"}),
    # Aborts ids again once they ended (finished or aborted) when their stream is dropped.
    (AbortFinishedIds, {"no_abort_after_finish", "abort_exactly_once"}),
], ids=["planted-abort-batch-lowest-rank", "mutant-abort-finished-ids"])
def test_planted_bug_is_found_shrunk_and_replayable(
        core: CoreFactory, invariants: set[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STATEFUL_DIR_ENV, str(tmp_path))  # the env route to the directory
    settings = stateful_settings(max_examples=1000, step_count=10, database=None)
    with pytest.raises(Exception) as found:  # noqa: PT011 - an ExceptionGroup is possible
        run_stateful(core, settings=settings, seed=PLANTED_SEED)

    files = sorted(tmp_path.glob("*.json"))
    assert files, f"no replay file written for {found.value!r}"
    assert [Path(p) for p in getattr(found.value, "replay_files", [])] == files
    data = load_replay(files[-1])
    assert data["invariant"] in invariants, data["message"]
    assert data["core"] == core_name(core) and data["seed"] == PLANTED_SEED
    assert data["steps"][0]["rule"] == "init" and len(data["steps"]) <= 10  # shrunk
    assert data["transcript"], "the replay carries a wire transcript excerpt"

    with pytest.raises(InvariantViolation) as again:
        replay(files[-1], core_factory=core)
    assert again.value.invariant == data["invariant"]
    replay(files[-1])  # the same steps against the correct reference core: clean


def test_replay_is_deterministic(tmp_path: Path) -> None:
    """Two replays of one file fail identically (sans-IO has no clock and no sockets)."""
    steps = _batch_abort_steps()
    failures: list[tuple[str, str]] = []
    for _ in range(2):
        with pytest.raises(InvariantViolation) as info:
            replay_steps(steps, AbortBatchToLowestRank)
        failures.append((info.value.invariant, info.value.detail.split(" at engine")[1]))
    assert failures[0] == failures[1] and failures[0][0] == "abort_at_owner"


def _batch_abort_steps(kind: str = "hold") -> list[dict[str, Any]]:
    request = {"kind": kind, "tokens": 1, "reason": "length", "interval_ms": 0,
               "dp_rank": None, "chunk": 1, "stop_at": None}
    return [
        {"rule": "init", "args": {"ranks": 2, "report_finished": False}},
        {"rule": "generate", "args": {"requests": [request, request]}},
        {"rule": "abort", "args": {"picks": [0, 1], "unknown": False}},
    ]


# ------------------------------------------------------------------ (c) real sockets


@pytest.mark.timeout(max(120, SOCKET_EXAMPLES * 10))
def test_reference_survives_random_sessions_over_sockets(replay_dir: Path) -> None:
    run_stateful(ReferenceFrontendCore, transport="sockets",
                 settings=stateful_settings(max_examples=SOCKET_EXAMPLES, step_count=25,
                                            database=None),
                 replay_directory=replay_dir)


def test_socket_transport_bites() -> None:
    """The planted bug's steps fail over real sockets too, and pass with the reference."""
    with pytest.raises(InvariantViolation) as info:
        replay_steps(_batch_abort_steps(), AbortBatchToLowestRank, transport="sockets")
    assert info.value.invariant == "abort_at_owner"
    replay_steps(_batch_abort_steps(), transport="sockets")


# ------------------------------------------------------------------ fixed bugs, pinned
# Each replays a sequence the state machine once found failing (see the commit that fixed it).


def _stop_request(tokens: int) -> dict[str, Any]:
    return {"kind": "finish", "tokens": tokens, "reason": "length", "interval_ms": 0,
            "dp_rank": None, "chunk": 1, "stop_at": 0}


def test_stop_string_in_final_output_is_not_aborted() -> None:
    replay_steps([{"rule": "init", "args": {"ranks": 1, "report_finished": False}},
                  {"rule": "generate", "args": {"requests": [_stop_request(1)]}}])


def test_no_tokens_after_a_stop_string_ended_the_stream() -> None:
    replay_steps([{"rule": "init", "args": {"ranks": 1, "report_finished": False}},
                  {"rule": "generate", "args": {"requests": [_stop_request(2)]}},
                  {"rule": "deliver", "args": {"to": "engine", "rank": 0, "count": 1}},
                  {"rule": "tick", "args": {"ms": 0}},
                  {"rule": "tick", "args": {"ms": 0}},
                  {"rule": "deliver", "args": {"to": "frontend", "rank": 0, "count": 2}}])


def test_mock_engine_log_stats_quiesces_with_a_held_request() -> None:
    hold = {"kind": "hold", "tokens": 0, "reason": "length", "interval_ms": 0,
            "dp_rank": None, "chunk": 1, "stop_at": None}
    # ADD(a), ABORT(a), ADD(b) reach the engine in one batch: a's abort leaves it idle
    # (flag set), b's first output carries the stats, the flag is never cleared.
    replay_steps([{"rule": "init", "args": {"ranks": 1, "report_finished": False,
                                            "log_stats": True}},
                  {"rule": "generate", "args": {"requests": [hold]}},
                  {"rule": "abort", "args": {"picks": [0], "unknown": False}},
                  {"rule": "generate", "args": {"requests": [hold]}},
                  {"rule": "settle", "args": {}}])
