"""Replay files: a failed run's steps as JSON, re-run deterministically, kept as regressions.

On failure the shrunk step sequence is written (`write_replay`, into ``reports/stateful/``
or ``$COREWIRE_STATEFUL_DIR``); `replay()` re-runs it and `promote()` copies it into
``fixtures/regressions/`` (replayed by tests/test_regressions.py). A replay file is a
hypothesis-independent record: its steps are the machine's own recorded rules.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import hypothesis

from harness.frontends.reference.core import ReferenceFrontendCore
from harness.frontends.reference.frontend import CoreFactory
from harness.locations import fixture
from harness.stateful.invariants import INVARIANTS, InvariantViolation
from harness.stateful.machine import RULES, FrontendMachine
from harness.stateful.worlds import TRANSPORTS
from mock_engines.transcript import Record

REPLAY_FORMAT = "corewire-stateful-replay/1"
STATEFUL_DIR_ENV = "COREWIRE_STATEFUL_DIR"
DEFAULT_REPLAY_DIR = Path("reports") / "stateful"
REGRESSIONS_DIR = fixture("regressions")


def replay_dir(directory: str | os.PathLike[str] | None = None) -> Path:
    return Path(directory or os.environ.get(STATEFUL_DIR_ENV) or DEFAULT_REPLAY_DIR)


def core_name(core_factory: Callable[..., Any]) -> str:
    """The "module:Qualname" a replay file records for the core it ran against."""
    module = getattr(core_factory, "__module__", None)
    qualname = getattr(core_factory, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname else repr(core_factory)


def write_replay(machine: FrontendMachine, *, seed: int | None,
                 settings: hypothesis.settings | None = None,
                 directory: str | os.PathLike[str] | None = None) -> Path:
    """Write one failed machine's steps, failure and transcript excerpt as a replay file."""
    target = replay_dir(directory)
    target.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc)
    failure = machine.failure
    data: dict[str, Any] = {
        "format": REPLAY_FORMAT,
        "created": stamp.isoformat(timespec="seconds"),
        "transport": machine.transport,
        "core": core_name(machine.core_factory),
        "seed": seed,
        "hypothesis": {"version": hypothesis.__version__,
                       "max_examples": settings.max_examples if settings else None,
                       "stateful_step_count":
                           settings.stateful_step_count if settings else None},
        "invariant": failure.invariant if failure else None,
        "invariant_rule": INVARIANTS.get(failure.invariant) if failure else None,
        "message": failure.detail if failure else None,
        "failed_step": machine.failed_step,
        "steps": machine.steps,
        "requests": [rec.summary() for rec in machine.model.order] if machine.model else [],
        "transcript": _excerpt(machine.excerpt_records),
    }
    path = target / f"{stamp.strftime('%Y%m%dT%H%M%S.%fZ')}-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


def _excerpt(records: Sequence[Record]) -> list[dict[str, Any]]:
    t0 = records[0].t if records else 0.0
    return [r.to_json(t0, hex_limit=64) for r in records]


def load_replay(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a replay file (format, step names)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or data.get("format") != REPLAY_FORMAT:
        raise ValueError(f"{path}: not a {REPLAY_FORMAT} file")
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps or steps[0].get("rule") != "init":
        raise ValueError(f"{path}: steps must be a list starting with init")
    for step in steps:
        if step.get("rule") not in RULES or not isinstance(step.get("args"), dict):
            raise ValueError(f"{path}: bad step {step!r}")
    if data.get("transport", "sansio") not in TRANSPORTS:
        raise ValueError(f"{path}: unknown transport {data.get('transport')!r}")
    return data


def replay_steps(steps: Sequence[dict[str, Any]], core_factory: CoreFactory | None = None,
                 *, transport: str = "sansio") -> None:
    """Run recorded steps once; raises InvariantViolation (an AssertionError) on failure."""
    machine = FrontendMachine(core_factory or ReferenceFrontendCore, transport)
    try:
        for step in steps:
            machine.execute(step["rule"], dict(step["args"]))
    finally:
        machine.teardown()


def replay(path: str | os.PathLike[str], core_factory: CoreFactory | None = None, *,
           transport: str | None = None) -> None:
    """Re-run a replay file's steps (against the reference core unless told otherwise).

    Returns None when every invariant holds; raises `InvariantViolation` (an AssertionError
    whose `invariant` names the broken rule) otherwise. Sans-IO replays are deterministic.
    """
    data = load_replay(path)
    replay_steps(data["steps"], core_factory, transport=transport or data.get("transport",
                                                                              "sansio"))


def regression_files(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """The promoted regression cases, sorted (an absent directory holds none)."""
    root = Path(directory) if directory is not None else REGRESSIONS_DIR
    return sorted(root.glob("*.json")) if root.is_dir() else []


def promote(path: str | os.PathLike[str], *, name: str | None = None,
            directory: str | os.PathLike[str] | None = None, check: bool = True) -> Path:
    """Copy a replay file into the regression fixtures (tests/test_regressions.py).

    With `check`, refuse one that fails against the reference core: a regression case
    records a bug the reference does not have, so it must replay clean there.
    """
    data = load_replay(path)
    if check:
        try:
            replay_steps(data["steps"], transport=data.get("transport", "sansio"))
        except InvariantViolation as exc:
            raise ValueError(f"{path} fails against the reference core ({exc}); fix the "
                             "reference first or promote with check=False") from exc
    root = Path(directory) if directory is not None else REGRESSIONS_DIR
    root.mkdir(parents=True, exist_ok=True)
    stem = name or f"{data.get('invariant') or 'replay'}-{Path(path).stem}"
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-") or "replay"
    data["promoted_from"] = str(path)
    target = root / f"{stem}.json"
    target.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return target
