"""What a harness process owns outside itself, recorded where a later process finds it if
this one dies without cleaning up (SIGKILL, OOM, an xdist worker that crashed mid-case).

A process that makes a private temp dir (`cw-*`: ipc dirs, a driver program's workdir) or
starts a driver program records it in its *registry*: one file per process in the temp dir,
`cw-owner-<pid>-<random>`, on which it holds an exclusive flock for as long as it lives. The
kernel drops the lock when the process (and every process that inherited the open file)
is gone, whatever killed it; a sweeper that can take the lock has proof that the owner is
dead, with no trust in pids (recycled) or pid namespaces. Records are appended, and undone
by a `-` record when the thing is cleaned up normally; the file is removed when nothing is
left in it, so a clean run leaves no registry behind.

`sweep()` (at the start and end of a run, and on the xdist controller when a worker
crashed) takes every registry whose owner is dead: it ends the driver programs recorded
there and everything carrying their token (process_tree.family: their session, the
processes with the token in their environment, their descendants), removes the dirs (only
`cw-*` dirs, by absolute path) and then the registry. Dirs made by other programs, or by a
live run, are never touched: only what a dead owner itself recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass, field

from harness.hygiene import process_tree

PREFIX = "cw-owner-"
OWN_DIR_PREFIX = "cw-"  # only dirs named so are ever removed by a sweep
DIR, PROGRAM = "dir", "program"


class _Registry:
    """This process's registry file (opened on the first record, removed when empty)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.fd: int | None = None
        self.path: str | None = None
        self.live: set[tuple[str, ...]] = set()

    def add(self, record: tuple[str, ...]) -> None:
        with self.lock:
            if self.fd is None:
                self._open()
            if self.fd is None:
                return  # temp dir not writable: nothing to record in (best effort)
            self.live.add(record)
            self._append("\t".join(record))

    def discard(self, record: tuple[str, ...]) -> None:
        with self.lock:
            if record not in self.live:
                return
            self.live.discard(record)
            self._append("-" + "\t".join(record))
            if not self.live:
                self._close()

    def _append(self, line: str) -> None:
        assert self.fd is not None
        with contextlib.suppress(OSError):  # a full disk must not fail the case
            os.write(self.fd, (line + "\n").encode())

    def _open(self) -> None:
        """Create, lock, and check the file is still the one at its path (a sweeper may
        have taken the lock of a newborn empty file and removed it)."""
        root = tempfile.gettempdir()
        for _ in range(5):
            path = os.path.join(root, f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                             | os.O_CLOEXEC, 0o600)
            except OSError:
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_ino == os.stat(path).st_ino:
                    self.fd, self.path = fd, path
                    return
            except OSError:
                pass
            os.close(fd)

    def _close(self) -> None:
        if self.fd is None:
            return
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.remove(self.path)  # removed while still locked: no sweeper reads it
        os.close(self.fd)
        self.fd = self.path = None


_REGISTRY = _Registry()
# The private ipc dirs of this process not yet removed (harness.protocol.transport.
# endpoints.PrivateIpcDir adds and removes them): what the session-end leak check reads.
LIVE_IPC_DIRS: set[str] = set()


def _registry() -> _Registry:
    """This process's registry; a forked child starts its own (the parent's file and lock
    stay the parent's: closing the inherited descriptor would not release it anyway)."""
    global _REGISTRY
    if _REGISTRY.pid != os.getpid():
        _REGISTRY = _Registry()
    return _REGISTRY


def record_dir(path: str) -> None:
    _registry().add((DIR, os.path.abspath(path)))


def forget_dir(path: str) -> None:
    _registry().discard((DIR, os.path.abspath(path)))


def record_program(pid: int, token: str) -> None:
    """A driver program (started in a session of its own, `token` in its environment)."""
    info = process_tree.read_stat(pid)
    _registry().add((PROGRAM, str(pid), str(info.start_time if info else 0), token))


def forget_program(pid: int, token: str) -> None:
    registry = _registry()
    with registry.lock:
        records = [r for r in registry.live if r[0] == PROGRAM and r[3] == token]
    for record in records:
        registry.discard(record)


@dataclass
class Swept:
    """What a sweep found of dead owners: programs ended, dirs removed, registries read."""

    owners: list[int] = field(default_factory=list)  # pids of the dead owners
    ended: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """One clause for a note or a terminal line ("" when nothing was left)."""
        parts = []
        if self.ended:
            parts.append(f"ended {len(self.ended)} process(es) it had left running "
                         f"(driver programs and what they started: pids {self.ended})")
        if self.survivors:
            parts.append(f"STILL RUNNING: {self.survivors}")
        if self.dirs:
            parts.append(f"removed {len(self.dirs)} temp dir(s) it had left "
                         f"({', '.join(os.path.basename(d) for d in self.dirs)})")
        return "; ".join(parts)


def sweep(root: str | None = None, owner: int | None = None, grace: float = 1.0) -> Swept:
    """Clean up after every dead owner whose registry is in `root` (default: the temp dir),
    or only after `owner` (a pid) when given. Bounded: each program family gets `grace` for
    SIGTERM and as much for SIGKILL; never raises for what it cannot remove."""
    root = root or tempfile.gettempdir()
    swept = Swept()
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith(PREFIX))
    except OSError:
        return swept
    for name in names:
        if owner is not None and not name.startswith(f"{PREFIX}{owner}-"):
            continue
        _sweep_one(os.path.join(root, name), swept, grace)
    return swept


def _sweep_one(path: str, swept: Swept, grace: float) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # its owner is alive
        with os.fdopen(os.dup(fd), "rb") as fh:
            text = fh.read(1 << 20).decode(errors="replace")
        live: dict[tuple[str, ...], None] = {}
        for line in text.splitlines():
            undo = line.startswith("-")
            record = tuple(line.lstrip("-").split("\t"))
            if undo:
                live.pop(record, None)
            else:
                live[record] = None
        with contextlib.suppress(ValueError):
            swept.owners.append(int(os.path.basename(path)[len(PREFIX):].split("-")[0]))
        for record in live:
            if record[0] == PROGRAM and len(record) == 4:
                _end_program(record, swept, grace)
        for record in live:
            if record[0] == DIR and len(record) == 2:
                _remove_dir(record[1], swept)
        with contextlib.suppress(OSError):
            os.remove(path)
    finally:
        os.close(fd)


def _end_program(record: tuple[str, ...], swept: Swept, grace: float) -> None:
    _, pid_text, start_text, token = record
    try:
        pid, start = int(pid_text), int(start_text)
    except ValueError:
        return
    if not _members(pid, start, token):
        return
    ending = asyncio.run(_end_members(pid, start, token, grace))
    swept.ended += ending.terminated + ending.killed
    swept.survivors += ending.survivors


def _members(pid: int, start: int, token: str) -> dict[int, process_tree.ProcessInfo]:
    """The program `pid` (if it is still the one recorded) and everything it left."""
    root = process_tree.read_stat(pid)
    if root is not None and root.start_time == start:
        return process_tree.family(pid, token)
    # The program is gone (its pid may name another process now): its token identifies
    # what it left, and a session or group id it led is not reused while a member lives.
    table = process_tree.process_table()
    members = {p for p, info in table.items() if pid in (info.sid, info.pgid)}
    members |= process_tree.marked(process_tree.TOKEN_VAR, token, table)
    members |= process_tree.descendants(members, table)
    members.discard(os.getpid())
    return {p: table[p] for p in members if p in table}


async def _end_members(pid: int, start: int, token: str, grace: float
                       ) -> process_tree.Ending:
    """SIGTERM, SIGKILL; then what came back (a daemon that respawns on SIGTERM) is
    stopped and killed."""
    first = await process_tree.end_all(_members(pid, start, token).values(), grace)
    ended = set(first.terminated + first.killed)
    second = await process_tree.stop_and_kill(
        lambda: [i for p, i in _members(pid, start, token).items() if p not in ended], grace)
    return process_tree.Ending(first.terminated, first.killed + second.killed,
                               second.survivors, first.seconds + second.seconds)


def _remove_dir(path: str, swept: Swept) -> None:
    if not (os.path.isabs(path) and os.path.basename(path).startswith(OWN_DIR_PREFIX)):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        return
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        swept.dirs.append(path)
