"""Session-end leak accounting: child processes, socket fds, ipc dirs, engine threads, and
unix sockets left in the temp dir.

The harness starts subprocesses, threads and sockets for every case; a leak in one case
slows or breaks the next, so the test sessions assert that none survive.

Temp-dir sockets: vLLM names ipc endpoints `ipc://{VLLM_RPC_BASE_PATH}/{uuid4()}`
(vllm/utils/network_utils.py:175-177; the base defaults to tempfile.gettempdir(),
vllm/envs.py:732-734) and nothing unlinks them when the process that bound them is
killed, so a frontend run against the default base fills /tmp with socket files. The drivers
point the base at their private ipc dirs; this check keeps it so. Other processes on the
machine (other runs, other users, all possibly root) make files in the same temp dir, so a
file is only counted when a process of this run was seen holding a socket bound at it:
`observe_temp_sockets()` (called at every case teardown, before the driver shuts down, and
by `snapshot()`) reads /proc/net/unix for sockets bound directly in the temp dir or in a
`cw-*` dir there, and records the entry when the socket's inode is an open fd of this
process or of one it started (each inode is looked up once: a busy machine's other sockets
cost one process scan, not one per case). A file whose binder died before any observation
is missed.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass

from harness.hygiene import ownership, process_tree

OWN_PREFIX = "cw-"  # the prefix of every dir the harness makes in the temp dir

_BOUND: set[str] = set()  # temp-dir entries a socket of this run was seen bound in
_EXAMINED: set[int] = set()  # socket inodes already attributed (a socket keeps its binder)
_EXAMINED_MAX = 100_000  # forgotten past this (a long session on a busy machine)


@dataclass(frozen=True)
class Snapshot:
    children: frozenset[int]
    sockets: int
    ipc_dirs: frozenset[str]
    threads: frozenset[str]
    temp_entries: frozenset[str] = frozenset()  # observed entries that still exist


def _children() -> frozenset[int]:
    """Every live process this one started, directly or not: its descendants by parent
    chain, and every process carrying its owner marker (a grandchild that called setsid()
    and was re-parented to init keeps the marker in its environment)."""
    table = process_tree.process_table()
    found = process_tree.descendants([os.getpid()], table)
    found |= process_tree.marked(process_tree.OWNER_VAR, process_tree.owner_token(), table)
    return frozenset(found)


def _command_of(pid: int) -> str:
    """A process's command line, short (what a leak report names), '?' once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return f"{pid}: ?"
    text = " ".join(a.decode("utf-8", "replace") for a in argv if a)
    return f"{pid}: {text[:160]}"


def _socket_fds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            continue
    return count


def _temp_roots() -> set[str]:
    root = tempfile.gettempdir()
    return {os.path.normpath(root), os.path.realpath(root)}


def temp_entry(path: str, roots: set[str] | None = None) -> str | None:
    """The temp-dir entry a socket at `path` would leave behind, if a run must not leave
    it: the socket itself when it lies directly in the temp dir (vLLM's default ipc
    paths), or the `cw-*` dir it lies in. None for anything else (pytest's basetemp, ...)."""
    path = os.path.normpath(path)
    for root in roots if roots is not None else _temp_roots():
        rel = os.path.relpath(path, root)
        if rel.startswith(os.pardir) or rel == os.curdir:
            continue
        first = rel.split(os.sep, 1)[0]
        if first == rel or first.startswith(OWN_PREFIX):
            return os.path.join(root, first)
    return None


def _bound_unix_sockets() -> dict[int, str]:
    """inode -> path of every unix socket bound to a filesystem path (this netns)."""
    found: dict[int, str] = {}
    try:
        with open("/proc/net/unix") as fh:
            lines = fh.read().splitlines()[1:]
    except OSError:
        return found
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[7].startswith("/"):
            found[int(fields[6])] = fields[7]
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    return inodes


def observe_temp_sockets() -> None:
    """Record the temp-dir entries in which a process of this run holds a bound unix
    socket now (see the module docstring); cheap when there is none to attribute."""
    roots = _temp_roots()
    tracked = {os.path.realpath(d) for d in ownership.LIVE_IPC_DIRS} | set(ownership.LIVE_IPC_DIRS)
    candidates: dict[int, str] = {}
    for inode, path in _bound_unix_sockets().items():
        entry = temp_entry(path, roots)
        # Our own in-process ipc dirs are accounted for by `ipc_dirs` already.
        if (entry is not None and entry not in _BOUND and entry not in tracked
                and inode not in _EXAMINED):
            candidates[inode] = entry
    if not candidates:
        return
    for pid in {os.getpid(), *_children()}:
        for inode in _socket_inodes(pid) & candidates.keys():
            _BOUND.add(candidates[inode])
    if len(_EXAMINED) > _EXAMINED_MAX:
        _EXAMINED.clear()
    _EXAMINED.update(candidates)  # other programs' sockets are not looked up again


_SESSION_HELPERS: list[Callable[[], None]] = []


def register_run_helper(stop: Callable[[], None]) -> None:
    """A process-wide helper that lives for the session (vllm-py's DP-coordinator fork
    server): `stop` ends it at session end, before the leak check."""
    _SESSION_HELPERS.append(stop)


def stop_run_helpers() -> list[str]:
    """Stop every registered helper; what failed to stop, as text."""
    problems = []
    while _SESSION_HELPERS:
        stop = _SESSION_HELPERS.pop()
        try:
            stop()
        except Exception as exc:  # reported with the leaks, never raised at teardown
            problems.append(f"session helper {getattr(stop, '__qualname__', stop)} did not "
                            f"stop: {type(exc).__name__}: {exc}")
    return problems


def snapshot() -> Snapshot:
    observe_temp_sockets()
    threads = frozenset(t.name for t in threading.enumerate()
                        if t.name.startswith(("mock-engine", "mock-dp-coordinator")))
    left = frozenset(e for e in _BOUND if os.path.lexists(e))
    return Snapshot(_children(), _socket_fds(), frozenset(ownership.LIVE_IPC_DIRS), threads, left)


def leaks_since(before: Snapshot) -> list[str]:
    """Human-readable leaks: what exists now that did not exist at `before`."""
    now = snapshot()
    problems = []
    if now.children - before.children:
        left = sorted(now.children - before.children)
        problems.append(f"child processes still running (descendants included): {left} "
                        f"({'; '.join(_command_of(pid) for pid in left[:4])})")
    if now.sockets > before.sockets:
        problems.append(f"{now.sockets - before.sockets} socket fd(s) still open")
    if now.ipc_dirs - before.ipc_dirs:
        problems.append(f"ipc dirs not removed: {sorted(now.ipc_dirs - before.ipc_dirs)}")
    if now.threads:
        problems.append(f"engine threads still alive: {sorted(now.threads)}")
    if now.temp_entries - before.temp_entries:
        problems.append(f"unix sockets (or cw-* dirs holding them) that processes of this "
                        f"run bound, left in the temp dir: "
                        f"{sorted(now.temp_entries - before.temp_entries)}")
    return problems
