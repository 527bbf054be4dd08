"""Finding and ending every process a program left behind, including ones that left its session.

A driver program runs in its own session (`start_new_session`), so its process group and
session ids are its pid; signalling that group ends the children that stayed in it. A child
that called `setsid()` itself left both, and once its parent exits it is re-parented to init,
so neither the group nor a walk of the parent chain finds it any more. What it keeps is its
environment: the harness gives each program a unique marker variable (`TOKEN_VAR`) and finds
every process whose initial environment carries it. Together with a parent-chain walk taken
while the program is still alive, that covers children, grandchildren, daemons that double-
forked into a new session, and anything they start in turn. Only a process that both re-execs
with a scrubbed environment and is orphaned before teardown escapes; PR_SET_CHILD_SUBREAPER
would catch that too, but it makes the whole harness process (pytest, the vLLM frontends run
in it) the parent of every orphan, whose zombies someone must then reap: a global side effect
we do not take for this case.

Signals go through pidfds (`os.pidfd_open`) opened after checking the process's start time, so
a recycled pid is never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

TOKEN_VAR = "COREWIRE_PROCESS_TOKEN"  # marks a driver program and everything it starts
OWNER_VAR = "COREWIRE_OWNER"  # marks every process a harness process starts (leak checks)


@dataclass(frozen=True)
class ProcessInfo:
    """The fields of /proc/PID/stat that identify a process and place it in the tree."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start_time: int  # clock ticks since boot: with the pid, identifies the process


def read_stat(pid: int) -> ProcessInfo | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return ProcessInfo(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0],
                       int(fields[19]))


def process_table() -> dict[int, ProcessInfo]:
    """Every live process (zombies excluded: they are already dead, only unreaped)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = read_stat(int(name))
            if info is not None and info.state not in ("Z", "X"):
                table[info.pid] = info
    return table


def environ_has(pid: int, assignment: bytes) -> bool:
    """Whether `NAME=value` is in the process's initial environment (our own uid only)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return assignment in fh.read().split(b"\0")
    except OSError:
        return False


def marked(var: str, value: str, table: dict[int, ProcessInfo]) -> set[int]:
    needle = f"{var}={value}".encode()
    return {pid for pid in table if pid != os.getpid() and environ_has(pid, needle)}


def descendants(roots: Iterable[int], table: dict[int, ProcessInfo]) -> set[int]:
    """Every process whose parent chain reaches one of `roots` (roots excluded)."""
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def family(root: int, token: str | None) -> dict[int, ProcessInfo]:
    """The program `root` (started with start_new_session) and everything it started: its
    session and group, the processes carrying its token, and their descendants."""
    table = process_table()
    members = {pid for pid, info in table.items() if root in (info.sid, info.pgid)}
    members.add(root)
    if token is not None:
        members |= marked(TOKEN_VAR, token, table)
    members |= descendants(members, table)
    members.discard(os.getpid())
    return {pid: table[pid] for pid in members if pid in table}


def new_token() -> str:
    return uuid.uuid4().hex


def owner_token() -> str:
    """This process's marker, inherited by every process it starts from now on.

    A process started by another harness process (an xdist worker) inherits its parent's
    marker; it takes its own, so each process accounts only for what it started itself."""
    mine = f"{os.getpid()}-"
    current = os.environ.get(OWNER_VAR, "")
    if not current.startswith(mine):
        current = mine + uuid.uuid4().hex[:12]
        os.environ[OWNER_VAR] = current
    return current


class _Handle:
    """A pidfd for one process, opened only if the pid still names the process we saw."""

    def __init__(self, info: ProcessInfo) -> None:
        self.info = info
        self.fd: int | None = None
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(info.pid)
            now = read_stat(info.pid)
            if now is not None and now.start_time == info.start_time:
                self.fd = fd
            else:
                os.close(fd)

    def signal(self, sig: signal.Signals) -> None:
        if self.fd is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(self.fd, sig)

    def alive(self) -> bool:
        if self.fd is None:
            return False
        now = read_stat(self.info.pid)
        return (now is not None and now.start_time == self.info.start_time
                and now.state not in ("Z", "X"))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass
class Ending:
    """What `end_all` had to do: who exited on SIGTERM, who needed SIGKILL, who survived."""

    terminated: list[int]
    killed: list[int]
    survivors: list[int]
    seconds: float


async def end_all(processes: Iterable[ProcessInfo], grace: float) -> Ending:
    """SIGTERM every process, SIGKILL those still alive after `grace` seconds, and verify
    within another `grace` that none is left (bounded: at most 2 x grace)."""
    start = time.monotonic()
    handles = [_Handle(info) for info in processes]
    try:
        live = [h for h in handles if h.alive()]
        for handle in live:
            handle.signal(signal.SIGTERM)
        stubborn = await _wait_gone(live, grace)
        for handle in stubborn:
            handle.signal(signal.SIGKILL)
        survivors = await _wait_gone(stubborn, grace)
        return Ending(sorted(h.info.pid for h in live if h not in stubborn),
                      sorted(h.info.pid for h in stubborn if h not in survivors),
                      sorted(h.info.pid for h in survivors), time.monotonic() - start)
    finally:
        for handle in handles:
            handle.close()


async def _wait_gone(handles: list[_Handle], timeout: float) -> list[_Handle]:
    deadline = time.monotonic() + timeout
    live = [h for h in handles if h.alive()]
    while live and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        live = [h for h in live if h.alive()]
    return live
