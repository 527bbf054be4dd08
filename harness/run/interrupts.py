"""SIGINT / SIGTERM during a conformance run: stop promptly, tear the running case down,
keep the verdicts of the cases that finished.

The first signal cancels the case in progress (its engines, driver and ipc dir are torn
down by `run_case`, bounded by the driver's shutdown bound) and then ends the pytest
session as an interrupt (exit 2), whose session-finish hook writes the partial reports.
Later signals while the run stops are the same interrupt (a terminal's Ctrl-C reaches both
`corewire run` and its pytest child, which also receives the forwarded copy) and are
ignored; SIGKILL ends a run at once. An xdist controller forwards the first signal to its
workers, so they stop their cases now rather than when execnet gives up on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Coroutine
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _State:
    installed: dict[int, Any] = {}  # signal -> the handler we replaced
    interrupted_by: str | None = None
    case: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None
    worker_pids: set[int] = set()
    owner_pid: int = 0  # the process that installed the handlers (not a forked child)


def interrupted_by() -> str | None:
    """The name of the signal that interrupted this process's run, if one did."""
    return _State.interrupted_by


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if os.getpid() != _State.owner_pid:
        # A forked child inherited the handler (vLLM forks its DP coordinator): the signal
        # is its own, so it gets the default action. Kept, a child would ignore SIGTERM and
        # its parent wait out a shutdown bound (5 s for vLLM's coordinator).
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _State.interrupted_by is not None:  # the same interrupt again: already stopping
        return
    _State.interrupted_by = signal.Signals(signum).name
    print(f"\ncorewire: {_State.interrupted_by}: stopping the run (finished cases are kept)",
          file=sys.stderr, flush=True)
    for pid in sorted(_State.worker_pids):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGINT)
    if _State.case is not None:
        loop, task = _State.case
        if not task.done():  # cancel the case; run_case tears it down, then we raise
            loop.call_soon_threadsafe(task.cancel)
            return
    raise KeyboardInterrupt


def install() -> None:
    """Take over SIGINT and SIGTERM for this process (main thread only; idempotent)."""
    if _State.installed or threading.current_thread() is not threading.main_thread():
        return
    _State.interrupted_by = None
    _State.owner_pid = os.getpid()
    for sig in SIGNALS:
        _State.installed[sig] = signal.signal(sig, _on_signal)


def restore() -> None:
    """Give the signals back (pytest may run again in this process, e.g. under mutmut)."""
    for sig, previous in _State.installed.items():
        signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
    _State.installed.clear()
    _State.worker_pids.clear()
    _State.case = None


def add_worker(pid: int) -> None:
    """An xdist worker that receives the first interrupt as soon as the controller does."""
    _State.worker_pids.add(pid)


def run_interruptible(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`, except that an interrupt cancels `coro` (which cleans up) and
    then raises KeyboardInterrupt here."""

    async def main() -> T:
        task = asyncio.current_task()
        assert task is not None
        _State.case = (asyncio.get_running_loop(), task)
        try:
            return await coro
        finally:
            _State.case = None

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if _State.interrupted_by is not None:
            raise KeyboardInterrupt from None
        raise
