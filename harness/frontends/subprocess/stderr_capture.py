"""A driver program's stderr, kept bounded: the head and the tail, never the whole stream.

A driver may log a line per token or loop on an error message; 100 MB of it must cost the
harness neither memory nor disk. The first HEAD_BYTES (start-up messages often name the cause)
and the last TAIL_BYTES are kept, with the count of bytes elided between them.
"""

from __future__ import annotations

import asyncio
from collections import deque

HEAD_BYTES = 64 * 1024
TAIL_BYTES = 64 * 1024
HEAD_LINES = 10  # lines of the head shown when something was elided
TAIL_LINES = 40  # lines of the tail shown with every non-PASS verdict
CHUNK = 64 * 1024


class StderrCapture:
    """Reads a stream to its end, keeping at most HEAD_BYTES + TAIL_BYTES of it."""

    def __init__(self, head_bytes: int = HEAD_BYTES, tail_bytes: int = TAIL_BYTES) -> None:
        self.head_limit = head_bytes
        self.tail_limit = tail_bytes
        self.head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self.total = 0  # every byte read, kept or not

    @property
    def elided(self) -> int:
        return self.total - len(self.head) - self._tail_size

    @property
    def kept(self) -> int:
        return len(self.head) + self._tail_size

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        data = data[-self.tail_limit:]
        self._tail.append(data)
        self._tail_size += len(data)
        while self._tail_size - len(self._tail[0]) >= self.tail_limit:
            self._tail_size -= len(self._tail.popleft())
        if self._tail_size > self.tail_limit:  # trim the oldest chunk to the limit
            extra = self._tail_size - self.tail_limit
            self._tail[0] = self._tail[0][extra:]
            self._tail_size -= extra

    async def read_from(self, stream: asyncio.StreamReader) -> None:
        while True:
            data = await stream.read(CHUNK)
            if not data:
                return
            self.feed(data)

    def text(self) -> str:
        """The log for a verdict: its last TAIL_LINES lines, preceded, when the middle was
        elided, by the first HEAD_LINES and a line saying how many bytes are missing."""
        tail = b"".join(self._tail)
        if not self.elided:
            lines = (bytes(self.head) + tail).decode(errors="replace").splitlines()
            if len(lines) <= HEAD_LINES + TAIL_LINES:
                return "\n".join(lines)
            return "\n".join(lines[:HEAD_LINES] + [
                f"[... {len(lines) - HEAD_LINES - TAIL_LINES} lines not shown ...]"]
                + lines[-TAIL_LINES:])
        head_lines = bytes(self.head).decode(errors="replace").splitlines()[:HEAD_LINES]
        tail_lines = tail.decode(errors="replace").splitlines()[-TAIL_LINES:]
        return "\n".join(head_lines + [f"[... {self.elided} bytes elided (stderr was "
                                       f"{self.total} bytes; the first and last "
                                       f"{self.head_limit // 1024} KiB are kept) ...]"]
                         + tail_lines)
