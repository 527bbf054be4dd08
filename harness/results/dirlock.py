"""One run owns its report dir: a second run with the same --report-dir is refused.

Two runs writing one report set interleave their files (each clears the other's at start,
the last to finish wins results.json, the JUnit of one sits beside the transcripts of the
other) and both exit 0. The controlling process of a run (pytest without xdist, or xdist's
controller; never a worker) holds an exclusive flock on `.corewire.lock` in the report dir
from configure to unconfigure, and writes who it is into it: pid, start time and command.
A run that cannot take the lock is a usage error naming that holder. The kernel drops the
lock when the holder dies, however it dies, so a crashed run never blocks the next one; the
file itself stays (removing a lock file races with a run that has just opened it).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass

LOCK_NAME = ".corewire.lock"
HOLDER_WAIT_S = 1.0  # a holder that has just taken the lock gets this long to say who it is


class ReportDirBusy(Exception):
    """Another live run holds the report dir (the message names it)."""


@dataclass
class ReportDirLock:
    """A held lock; `release()` (idempotent) lets the next run in."""

    path: str
    fd: int | None

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)  # no stale holder text for the next reader
        os.close(self.fd)  # closing drops the flock
        self.fd = None


def _command() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        argv = [sys.executable, *sys.argv]
    text = shlex.join(argv)
    return text if len(text) <= 300 else text[:297] + "..."


def holder_text(raw: bytes) -> str | None:
    """`pid 123, started 2025-11-27T13:56:01+00:00, command: python -m pytest ...`; None
    while the holder has not written it (whole) yet."""
    try:
        info = json.loads(raw)
        return (f"pid {int(info['pid'])}, started {info['started']}, "
                f"command: {info['command']}")
    except (ValueError, KeyError, TypeError):
        return None


def lock_report_dir(report_dir: str) -> ReportDirLock:
    """Take the report dir for this process, or raise ReportDirBusy naming the holder.
    OSError when the dir or its lock file cannot be made (an unwritable --report-dir)."""
    os.makedirs(report_dir, exist_ok=True)
    path = os.path.join(report_dir, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise ReportDirBusy(f"--report-dir {report_dir} is in use by another run "
                            f"({holder}): wait for it to end, or give this run another "
                            f"--report-dir") from None
    except OSError:
        os.close(fd)
        raise
    info = {"pid": os.getpid(),
            "started": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": _command()}
    with contextlib.suppress(OSError):  # who holds it is a courtesy; the lock is the rule
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    return ReportDirLock(path, fd)


def _read_holder(fd: int) -> str:
    """The holder's own words, waiting (bounded) for one that has just taken the lock."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        try:
            text = holder_text(os.pread(fd, 4096, 0))
        except OSError:
            text = None
        if text is not None:
            return text
        if time.monotonic() > deadline:
            return "a run that has not said who it is yet"
        time.sleep(0.05)
