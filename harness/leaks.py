"""Session-end leak accounting: child processes, socket fds, ipc dirs, engine threads.

The harness starts subprocesses, threads and sockets for every case; a leak in one case
slows or breaks the next, so the test sessions assert that none survive.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from harness import process_tree
from harness.transport.endpoints import PrivateIpcDir


@dataclass(frozen=True)
class Snapshot:
    children: frozenset[int]
    sockets: int
    ipc_dirs: frozenset[str]
    threads: frozenset[str]


def _children() -> frozenset[int]:
    """Every live process this one started, directly or not: its descendants by parent
    chain, and every process carrying its owner marker (a grandchild that called setsid()
    and was re-parented to init keeps the marker in its environment)."""
    table = process_tree.process_table()
    found = process_tree.descendants([os.getpid()], table)
    found |= process_tree.marked(process_tree.OWNER_VAR, process_tree.owner_token(), table)
    return frozenset(found)


def _socket_fds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            continue
    return count


def snapshot() -> Snapshot:
    threads = frozenset(t.name for t in threading.enumerate()
                        if t.name.startswith(("mock-engine", "mock-dp-coordinator")))
    return Snapshot(_children(), _socket_fds(), frozenset(PrivateIpcDir.live), threads)


def leaks_since(before: Snapshot) -> list[str]:
    """Human-readable leaks: what exists now that did not exist at `before`."""
    now = snapshot()
    problems = []
    if now.children - before.children:
        problems.append(f"child processes still running (descendants included): "
                        f"{sorted(now.children - before.children)}")
    if now.sockets > before.sockets:
        problems.append(f"{now.sockets - before.sockets} socket fd(s) still open")
    if now.ipc_dirs - before.ipc_dirs:
        problems.append(f"ipc dirs not removed: {sorted(now.ipc_dirs - before.ipc_dirs)}")
    if now.threads:
        problems.append(f"engine threads still alive: {sorted(now.threads)}")
    return problems
