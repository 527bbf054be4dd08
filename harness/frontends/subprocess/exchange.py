"""The driver-protocol lines of one case, both ways, for the case's transcript.

A port author debugging an ERROR needs to see what corewire sent and what the program
answered (an `init` that never got its reply, a reply with the wrong id). Kept bounded:
the first HEAD lines and the last TAIL lines, each clipped to LINE_CHARS, with the count
of lines left out between them.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

HEAD = 40
TAIL = 160
LINE_CHARS = 1000
TO_DRIVER = "in"  # corewire -> driver program (stdin), as an engine's "in" is what it reads
FROM_DRIVER = "out"  # driver program -> corewire (stdout)


@dataclass(frozen=True)
class ExchangeLine:
    t: float  # time.monotonic(), the clock of the engines' transcripts
    direction: str  # TO_DRIVER or FROM_DRIVER
    text: str


class ExchangeLog:
    """Every protocol line of a driver program's life, bounded (head and tail)."""

    def __init__(self, head: int = HEAD, tail: int = TAIL) -> None:
        self.head_limit = head
        self.head: list[ExchangeLine] = []
        self.tail: deque[ExchangeLine] = deque(maxlen=tail)
        self.total = 0

    def record(self, direction: str, line: bytes | str) -> None:
        raw = line if isinstance(line, str) else line[:LINE_CHARS * 4].decode(
            errors="replace")
        text = raw.rstrip("\n")
        if len(text) > LINE_CHARS:
            unit = "bytes" if isinstance(line, bytes) else "characters"
            text = f"{text[:LINE_CHARS]}... ({len(line)} {unit})"
        entry = ExchangeLine(time.monotonic(), direction, text)
        self.total += 1
        if len(self.head) < self.head_limit:
            self.head.append(entry)
        else:
            self.tail.append(entry)

    @property
    def left_out(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def lines(self) -> list[ExchangeLine]:
        return [*self.head, *self.tail]

    def records(self, t0: float) -> list[dict[str, Any]]:
        """Transcript records (channel `driver`), `t` relative to `t0` like the engines'."""
        out: list[dict[str, Any]] = []
        for i, entry in enumerate(self.lines()):
            if i == len(self.head) and self.left_out:
                out.append({"t": round(entry.t - t0, 6), "rank": None, "direction": "",
                            "channel": "driver",
                            "note": f"{self.left_out} driver-protocol lines left out"})
            out.append({"t": round(entry.t - t0, 6), "rank": None,
                        "direction": entry.direction, "channel": "driver",
                        "line": entry.text})
        return out
