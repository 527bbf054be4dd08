"""What a frontend that could not start leaves in the results: one case's start attempt,
the stop of a frontend that failed to start too often (results.json's `meta.stopped`),
and the exit status that says so. The counting itself is run glue (harness/run/failfast.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

EXIT_FRONTEND_STOPPED = 7  # pytest uses 0-5; corewire bench's 3 is its own command's
STDERR_TAIL_LINES = 3
STDERR_TAIL_CHARS = 400


@dataclass
class StartAttempt:
    """What one case learned about starting its frontend (run_case fills it)."""

    attempted: bool = False  # the case called driver.start()
    failure: str | None = None  # the verdict message, when the frontend never came up
    stderr_tail: str = ""  # the last lines the driver program wrote to stderr


class Stop(msgspec.Struct, frozen=True):
    """A frontend stopped by its start failures: why, once (also results.json's
    `meta.stopped`, which `corewire merge` reads)."""

    frontend: str
    failures: int
    cause: str  # the last failing case's verdict message
    stderr_tail: str

    def line(self, not_run: int) -> str:
        stderr = f"; stderr: {self.stderr_tail}" if self.stderr_tail else ""
        return (f"STOPPED {self.frontend}: could not start {self.failures} times in a row: "
                f"{self.cause}{stderr}; its {not_run} remaining case(s) not run "
                f"(exit {EXIT_FRONTEND_STOPPED})")

    def reason(self) -> str:
        """The NOT-RUN message of each case left out."""
        return (f"not run: frontend {self.frontend} stopped after {self.failures} failed "
                f"starts in a row ({self.cause})")


def cause_key(message: str) -> str:
    """What 'the same cause' compares: the message with its numbers blanked."""
    return re.sub(r"\d+(?:\.\d+)?", "#", message)


def stderr_tail(diagnostics: str) -> str:
    """The last few non-empty lines of a driver program's stderr, on one line."""
    lines = [ln.strip() for ln in diagnostics.splitlines() if ln.strip()]
    text = " | ".join(lines[-STDERR_TAIL_LINES:])
    return text if len(text) <= STDERR_TAIL_CHARS else "..." + text[-STDERR_TAIL_CHARS:]
