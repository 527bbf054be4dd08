"""Finding and ending every process a program left behind, including ones that left its session.

A driver program runs in its own session (`start_new_session`), so its process group and
session ids are its pid; signalling that group ends the children that stayed in it. A child
that called `setsid()` itself left both, and once its parent exits it is re-parented to init,
so neither the group nor a walk of the parent chain finds it any more. What it keeps is its
environment: the harness gives each program a unique marker variable (`TOKEN_VAR`) and finds
every process whose initial environment carries it. Together with a parent-chain walk taken
while the program is still alive, that covers children, grandchildren, daemons that double-
forked into a new session, and anything they start in turn.

A daemon that also re-execs with a scrubbed environment carries no token; the program is
therefore started as a child subreaper (`become_subreaper`, PR_SET_CHILD_SUBREAPER, in the
child before exec): its orphaned descendants are re-parented to it, not to init, so the
parent-chain walk taken while it runs still finds them. Only such a daemon whose program had
already died before teardown escapes (re-parented to init by then). The harness process
itself is never made a subreaper: it would become the parent of every orphan, whose zombies
someone must reap, and a reaper there would steal the exit status of our own children.

A leftover that answers SIGTERM by starting a fresh copy of itself (setsid, double fork,
re-exec: a new pid each time) outruns any number of terminate-and-rescan rounds; what comes
back after the first round is stopped first (SIGSTOP: a stopped process can neither fork
nor run a handler), scanned again until no new process appears, then killed
(`stop_and_kill`).

Signals go through pidfds (`os.pidfd_open`) opened after checking the process's start time, so
a recycled pid is never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterable
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


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up once in the parent: a child between fork and exec must not
    load libraries (another thread may hold the loader's lock at fork time)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def become_subreaper() -> None:
    """In a child before exec (a `preexec_fn`): make it the subreaper of its descendants,
    so a daemon it starts that leaves its session stays its descendant even with a scrubbed
    environment. The attribute survives exec and is not inherited. Where prctl is missing
    (not Linux) it is a no-op: the token and the session still find most leftovers."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


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
        return self.state() not in (None, "Z", "X")

    def state(self) -> str | None:
        """The process's state letter (R, S, T, Z, ...); None once it is gone."""
        if self.fd is None:
            return None
        now = read_stat(self.info.pid)
        if now is None or now.start_time != self.info.start_time:
            return None
        return now.state

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


async def stop_and_kill(find: Callable[[], Iterable[ProcessInfo]], bound: float) -> Ending:
    """End processes that respawn faster than they can be terminated: SIGSTOP every process
    `find()` returns, scan again until it returns none that is not stopped yet (a process
    forked before its parent stopped is found by the next scan), then SIGKILL them all and
    verify they are gone. Bounded: `bound` for the stopping, another for the verification.
    No SIGTERM: this is for what already ignored or abused one (`Ending.killed` lists all)."""
    start = time.monotonic()
    deadline = start + bound
    handles: dict[tuple[int, int], _Handle] = {}
    try:
        while True:
            fresh: list[_Handle] = []
            for info in find():
                if (info.pid, info.start_time) in handles:
                    continue
                handle = _Handle(info)
                handles[(info.pid, info.start_time)] = handle
                if handle.alive():
                    fresh.append(handle)
                    handle.signal(signal.SIGSTOP)
            if not fresh or time.monotonic() > deadline:
                break
            await _wait_stopped(fresh, min(0.5, max(0.0, deadline - time.monotonic())))
        stopped = list(handles.values())
        for handle in stopped:
            handle.signal(signal.SIGKILL)
        survivors = await _wait_gone(stopped, bound)
        return Ending([], sorted(h.info.pid for h in stopped if h not in survivors),
                      sorted(h.info.pid for h in survivors), time.monotonic() - start)
    finally:
        for handle in handles.values():
            handle.close()


async def _wait_stopped(handles: list[_Handle], timeout: float) -> None:
    """Until each process is stopped (or gone): a scan taken before would miss a child it
    was still forking."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(h.state() in (None, "T", "t", "Z", "X") for h in handles):
            return
        await asyncio.sleep(0.01)
