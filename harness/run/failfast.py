"""Fail fast: a frontend that cannot start is stopped, not run 468 times into one ERROR.

A *start failure* is a case whose frontend never came up: `driver.start()` raised, the case
was graded ERROR or TIMEOUT, and the driver had not launched (a driver program that exited,
broke the protocol or stayed silent before answering `init`; for an in-process driver, a
harness fault such as a missing binary). A startup the frontend refused (StartupError,
graded by the case's level) or a driver that lacks a mode (UNSUPPORTED) is no start
failure: those are behaviour the cases grade.

After START_FAILURE_LIMIT start failures of one frontend in a row with the same cause
(numbers aside: ids, exit codes and bounds may differ), its remaining cases are not run:
each is a NOT-RUN row, the summary names the cause once with the program's stderr tail,
and the run exits EXIT_FRONTEND_STOPPED (docs/cli.md). A case that started resets the
count; a case that never tried to start (UNSUPPORTED before start) leaves it alone.

The count lives in one small JSON file per frontend in a directory the run's controller
makes and hands to its xdist workers (`workerinput`), read and updated under an flock: so
"in a row" is the order in which the cases finished, whichever worker ran them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from harness.results.startup import (
    StartAttempt,
    Stop,
    cause_key,
)

START_FAILURE_LIMIT = 3
WORKER_KEY = "corewire_failfast_dir"  # the directory, in an xdist worker's workerinput


class StartFailures:
    """The run's shared record of consecutive start failures, one file per frontend."""

    def __init__(self, directory: str, limit: int = START_FAILURE_LIMIT) -> None:
        self.directory = directory
        self.limit = limit

    @classmethod
    def create(cls) -> StartFailures:
        """The controller's (or a single process's) record, in a fresh private dir."""
        return cls(tempfile.mkdtemp(prefix="corewire-failfast-"))

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def _path(self, frontend: str) -> str:
        digest = hashlib.sha256(frontend.encode()).hexdigest()[:16]
        return os.path.join(self.directory, f"{digest}.json")

    @contextlib.contextmanager
    def _locked(self, frontend: str) -> Iterator[tuple[IO[str], dict[str, Any]]]:
        with open(self._path(frontend), "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            text = fh.read()
            try:
                state: dict[str, Any] = json.loads(text) if text else {}
            except ValueError:
                state = {}
            yield fh, state

    def stopped(self, frontend: str) -> Stop | None:
        """The stop of `frontend`, if its start failures have stopped it."""
        if not os.path.exists(self._path(frontend)):
            return None
        with self._locked(frontend) as (_, state):
            return _stop_of(state)

    def record(self, frontend: str, attempt: StartAttempt) -> Stop | None:
        """Count one finished case; returns the stop when this case completes the row."""
        if not attempt.attempted:
            return None
        with self._locked(frontend) as (fh, state):
            stop = _stop_of(state)
            if stop is not None:
                return None  # stopped by another worker meanwhile: already said
            if attempt.failure is None:
                state = {}
            else:
                key = cause_key(attempt.failure)
                count = int(state.get("failures", 0)) + 1 if state.get("key") == key else 1
                state = {"frontend": frontend, "key": key, "failures": count,
                         "cause": attempt.failure, "stderr_tail": attempt.stderr_tail,
                         "stopped": count >= self.limit}
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps(state))
            fh.flush()
            return _stop_of(state)

    def stops(self) -> list[Stop]:
        """Every stopped frontend of the run (the controller's summary and exit code)."""
        found: list[Stop] = []
        with contextlib.suppress(OSError):
            for entry in sorted(os.listdir(self.directory)):
                with open(os.path.join(self.directory, entry)) as fh:
                    fcntl.flock(fh, fcntl.LOCK_SH)
                    try:
                        stop = _stop_of(json.loads(fh.read() or "{}"))
                    except ValueError:
                        stop = None
                if stop is not None:
                    found.append(stop)
        return sorted(found, key=lambda s: s.frontend)


def _stop_of(state: dict[str, Any]) -> Stop | None:
    if not state.get("stopped"):
        return None
    return Stop(str(state["frontend"]), int(state["failures"]), str(state["cause"]),
                str(state.get("stderr_tail", "")))

