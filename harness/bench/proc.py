"""CPU time of a process or of one thread, read from /proc (Linux; no extra dependency)."""

from __future__ import annotations

import os

_TICK = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def _stat_cpu(path: str) -> float | None:
    """utime + stime (seconds) from a /proc .../stat file; None if it cannot be read."""
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError:
        return None
    # Field 2 (comm) may hold spaces and parentheses: split after its closing one.
    fields = text[text.rfind(")") + 2:].split()
    try:
        return (int(fields[11]) + int(fields[12])) / _TICK  # fields 14 and 15 of stat
    except (IndexError, ValueError):
        return None


def process_cpu(pid: int, children: bool = True) -> float | None:
    """CPU seconds of process `pid` (and its reaped children's, field 16-17, if asked)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    try:
        own = int(fields[11]) + int(fields[12])
        reaped = int(fields[13]) + int(fields[14]) if children else 0
    except (IndexError, ValueError):
        return None
    return (own + reaped) / _TICK


def tree_cpu(pid: int) -> float | None:
    """CPU seconds of `pid` plus its live descendants (a frontend that spawns workers)."""
    total = process_cpu(pid)
    if total is None:
        return None
    for child in _children(pid):
        total += tree_cpu(child) or 0.0
    return total


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(c) for c in fh.read().split()]
        except (OSError, ValueError):
            continue
    return out


def thread_cpu(native_id: int | None) -> float | None:
    """CPU seconds of one thread of this process (`threading.get_native_id()`): from
    schedstat (nanoseconds: short windows, e.g. an abort storm's few ms, stay measurable),
    else from stat (clock ticks, 10 ms)."""
    if native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as fh:
            return int(fh.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return _stat_cpu(f"/proc/self/task/{native_id}/stat")


def self_cpu() -> float:
    """CPU seconds of this whole process (every thread)."""
    times = os.times()
    return times.user + times.system


def thread_runnable(native_id: int | None) -> float | None:
    """Seconds one thread of this process was on a CPU or waiting in the run queue for one
    (schedstat fields 1 + 2): the time it wanted to run. A thread descheduled by other
    processes still counts (CPU time alone would under-report an engine on a busy machine);
    a thread blocked on a lock, the GIL included, or in poll() does not. Falls back to CPU
    time where schedstat is missing."""
    if native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as fh:
            fields = fh.read().split()
        return (int(fields[0]) + int(fields[1])) / 1e9
    except (OSError, ValueError, IndexError):
        return _stat_cpu(f"/proc/self/task/{native_id}/stat")
