"""The driver program's stdin: command lines read by a thread, taken in order by the loop.

A thread (blocking reads) rather than an asyncio pipe reader, because one moment needs to
wait without the event loop: a driver's `start` asks for the engines (EngineSide.start_*)
synchronously, and the program holds it there until the harness's `wait_ready` arrives
(docs: remote_engines). `look_ahead` finds that command among the lines not yet taken,
without taking it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Collection
from typing import Any

READ_SIZE = 1 << 16


class CommandFeed:
    """Lines of stdin: `next_line` for the event loop, `look_ahead` for a blocked caller."""

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        self._fd = fd
        self._loop = loop
        self._lines: deque[bytes] = deque()
        self._closed = False  # stdin reached its end
        self._changed = threading.Condition()
        self._arrived = asyncio.Event()  # set (on the loop) after each line and at the end
        self._thread = threading.Thread(target=self._read, name="driver-stdin", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _read(self) -> None:
        """Raw reads of the fd, split into lines here: a buffered reader's lock, held by this
        (daemon) thread in a read, would abort the interpreter's exit."""
        pending = b""
        while chunk := os.read(self._fd, READ_SIZE):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._push(line + b"\n")
        if pending:
            self._push(pending)
        self._push(None)

    def _push(self, line: bytes | None) -> None:
        with self._changed:
            if line is None:
                self._closed = True
            else:
                self._lines.append(line)
            self._changed.notify_all()
        with contextlib.suppress(RuntimeError):  # a closed loop: the program is exiting
            self._loop.call_soon_threadsafe(self._arrived.set)

    async def next_line(self) -> bytes | None:
        """The next line in order; None at the end of stdin."""
        while True:
            self._arrived.clear()
            with self._changed:
                if self._lines:
                    return self._lines.popleft()
                if self._closed:
                    return None
            await self._arrived.wait()

    def look_ahead(self, commands: Collection[str], timeout: float) -> dict[str, Any] | None:
        """Block (the whole thread, loop included) until a line not yet taken is one of
        `commands`, and return it (it stays in the feed). None at the end of stdin or after
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self._lines:
                    message = _parsed(line)
                    if message is not None and message.get("cmd") in commands:
                        return message
                remaining = deadline - time.monotonic()
                if self._closed or remaining <= 0:
                    return None
                self._changed.wait(remaining)


def _parsed(line: bytes) -> dict[str, Any] | None:
    try:
        message = json.loads(line)
    except ValueError:  # not JSON: the loop reports it when it takes the line
        return None
    return message if isinstance(message, dict) else None
