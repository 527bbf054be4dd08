"""`Mailbox`: how other threads hand work to the one thread that owns a set of sockets.

Why: a pyzmq socket belongs to one thread, so the engine runner and the recording proxy each
run one socket thread, and faults, commands and stop requests from the harness reach it as
callables in a queue. The read end of a pipe sits in the owner's poller next to its sockets,
so a queued command ends the owner's sleep at once instead of after its poll timeout.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable


class Mailbox:
    """A command queue and the wake pipe of one socket-owning thread."""

    def __init__(self) -> None:
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.fd, self._wake_w = os.pipe()  # `fd`: the read end, for the owner's poller
        os.set_blocking(self.fd, False)  # drained opportunistically, never waited on
        self._closed = False

    def put(self, command: Callable[[], None]) -> None:
        """Queue `command` for the owner thread and wake it (any thread)."""
        self._commands.put(command)
        self.wake()

    def wake(self) -> None:
        """End the owner's current sleep (a stop flag set, a command queued)."""
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def pending(self) -> bool:
        """Whether commands wait (cheaper than a poll: the owner's hot path asks this)."""
        return not self._commands.empty()

    def run_pending(self) -> None:
        """Owner thread: clear the wake bytes, then run every queued command in order."""
        # BlockingIOError: the command was queued before its wake byte was written.
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 4096)
        while not self._commands.empty():
            self._commands.get_nowait()()

    def stop_owner(self, thread: threading.Thread, timeout: float, what: str) -> None:
        """Wake `thread` (whose stop flag the caller set), wait for it for at most `timeout`,
        then close the pipe; TimeoutError (pipe left open) if the thread does not end."""
        self.wake()
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"{what} did not stop within {timeout}s")
        self.close()

    def close(self) -> None:
        """Close the pipe, once (a second close could hit a number reused since)."""
        if self._closed:
            return
        self._closed = True
        for fd in (self.fd, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


__all__ = ["Mailbox"]
