"""A case may not grow its process's memory past a stated bound.

The engines, the driver and the reports of a case all live in the pytest worker, so what a
frontend asks for (a huge request, an endless stream) is paid for in that process: unbounded,
it would take the worker down (the OOM killer) and every verdict of the run with it. Scripts
and evidence are bounded where they are made (mock_engines/script.py `default_steps`,
harness/results/bounds.py); this is the backstop for anything missed: while a case runs, the
worker's resident memory is sampled, and a case that grows it by more than CASE_MEMORY_LIMIT
is stopped and graded ERROR with the figures, before the machine is exhausted.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable
from typing import TypeVar

CASE_MEMORY_LIMIT = 1 << 30  # bytes of resident-memory growth a case may cause (1 GiB)
SAMPLE_INTERVAL = 0.05  # seconds between samples of /proc/self/statm
_PAGE = os.sysconf("SC_PAGE_SIZE")

T = TypeVar("T")


class CaseMemoryExceeded(Exception):
    """The case grew its process's resident memory past CASE_MEMORY_LIMIT."""


def resident_bytes() -> int:
    """This process's resident set size (0 where /proc is not there to tell)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


async def _over_limit(baseline: int, limit: int) -> str:
    """Returns (with the figures) once resident memory exceeds baseline + limit."""
    while True:
        await asyncio.sleep(SAMPLE_INTERVAL)
        now = resident_bytes()
        if now - baseline > limit:
            return (f"the case grew the harness process's memory by {(now - baseline) >> 20} "
                    f"MiB (from {baseline >> 20} to {now >> 20} MiB), past its bound of "
                    f"{limit >> 20} MiB (harness/hygiene/memory_guard.py); stopped")


async def guarded(case: Awaitable[T], limit: int | None = None) -> T:
    """`case`'s result, or CaseMemoryExceeded once the process has grown past the bound
    since the call (`case` is then cancelled). Cancelling this cancels both."""
    bound = CASE_MEMORY_LIMIT if limit is None else limit
    case_task = asyncio.ensure_future(case)
    guard_task = asyncio.ensure_future(_over_limit(resident_bytes(), bound))
    try:
        await asyncio.wait({case_task, guard_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not case_task.done() and not guard_task.done():  # cancelled from outside
            case_task.cancel()
        guard_task.cancel()
    if case_task.done():
        return case_task.result()
    case_task.cancel()
    await asyncio.wait({case_task})  # its own end (not raised): the bound is the outcome
    raise CaseMemoryExceeded(guard_task.result())
