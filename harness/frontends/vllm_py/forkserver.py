"""The process vllm-py's DP coordinators are forked from (why a fork server at all:
vllm_py_handshake.py's docstring).

vLLM forks its coordinator from the process that built AsyncLLM, one that has imported vLLM
(`get_mp_context()`, coordinator.py:99). The harness cannot fork from a worker running a case
(other threads hold locks the child would inherit), so the coordinator comes from a fork
server: multiprocessing's own (`get_context("forkserver")`), which forks each child from a
single-threaded server process and hands the worker an ordinary `Process`.

Where that server comes from is the cost. multiprocessing *spawns* it: a fresh interpreter
that imports vLLM's coordinator module, ~7-9 CPU-s per pytest worker, a third of the vllm-py
lane's CPU on 2 cores. Here it is *forked* from the worker instead, at the moment the driver
is built (before any case starts engines, frontends or threads), after vLLM is imported: the
server starts in milliseconds with vLLM already in memory, as `vllm serve`'s own process
has it. Forking is safe then because the worker runs no other Python thread (checked: if
one runs, or multiprocessing's internals are not the ones this was written against, the
spawned server is used, as before); the server closes every descriptor it inherited but its
own, restores default signal handlers and never runs the worker's exit handlers.

The server then runs multiprocessing's unchanged loop (`forkserver.main`); the worker's
`ForkServer` is pointed at it through the three attributes its own `ensure_running` sets
(`_forkserver_address`, `_forkserver_alive_fd`, `_forkserver_pid`, Python 3.10-3.13).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import multiprocessing.context
import os
import select
import signal
import socket
import sys
import threading
import time
import warnings
from multiprocessing import connection, forkserver, resource_tracker
from typing import Any

from harness.frontends.api import StartupError
from harness.hygiene.leaks import register_run_helper

COORDINATOR_MODULE = "vllm.v1.engine.coordinator"
FORKSERVER_START_TIMEOUT = 120.0  # a spawned server imports vLLM's coordinator (~5-10 s)
STOP_TIMEOUT = 10.0  # for the server to go once the session has closed its alive pipe
# The multiprocessing.forkserver internals the forked server relies on (3.14 adds an
# authentication key to the server's protocol).
FORKABLE_PYTHONS = ((3, 10), (3, 11), (3, 12), (3, 13))
_LOCK = threading.Lock()
_CONTEXT: list[multiprocessing.context.BaseContext] = []
_HOW: list[str] = []  # "forked" or "spawned", for the tests and diagnostics


def coordinator_context() -> multiprocessing.context.BaseContext:
    """The fork-server context DP coordinators start from: the server is made once per
    process (forked from here when that is safe, else spawned with vLLM's coordinator
    module preloaded and waited for), so no case pays for it inside its startup bound."""
    with _LOCK:
        if not _CONTEXT:
            tracker_was_running = resource_tracker._resource_tracker._pid is not None  # type: ignore[attr-defined]
            context = multiprocessing.get_context("forkserver")
            # What a spawned server imports: here, and wherever multiprocessing starts one
            # anew (it does when the server has died).
            context.set_forkserver_preload([COORDINATOR_MODULE])
            if _fork_server_here():
                _HOW.append("forked")
            else:
                _spawn_server(context)
                _HOW.append("spawned")
            register_run_helper(_stop_server)
            if not tracker_was_running:  # the server's start started multiprocessing's tracker
                register_run_helper(resource_tracker._resource_tracker._stop)  # type: ignore[attr-defined]
            _CONTEXT.append(context)
        return _CONTEXT[0]


def how_started() -> str:
    """"forked", "spawned", or "" before the first coordinator_context()."""
    return _HOW[-1] if _HOW else ""


def _spawn_server(context: multiprocessing.context.BaseContext) -> None:
    """multiprocessing's own start: a fresh interpreter that imports the coordinator module,
    waited for through a child that only returns."""
    probe = context.Process(target=os.getpid, name="corewire-forkserver-ready")  # type: ignore[attr-defined]
    probe.start()
    probe.join(FORKSERVER_START_TIMEOUT)
    if probe.exitcode != 0:
        raise StartupError(f"the DP coordinator's fork server did not come up within "
                           f"{FORKSERVER_START_TIMEOUT:.0f}s (exit {probe.exitcode})")


def _can_fork_here() -> bool:
    server: Any = forkserver._forkserver
    return (sys.version_info[:2] in FORKABLE_PYTHONS
            and COORDINATOR_MODULE in sys.modules  # else there is nothing to share
            and threading.current_thread() is threading.main_thread()
            and threading.active_count() == 1
            and all(hasattr(server, name) for name in (
                "_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid"))
            and server._forkserver_pid is None)


def _fork_server_here() -> bool:
    """Fork the server from this process; False (nothing changed) where that is not safe."""
    if not _can_fork_here():
        return False
    resource_tracker.ensure_running()  # shared with the coordinators, as a spawned server's
    address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
    except OSError:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(address)
        return False
    with warnings.catch_warnings():  # Python >= 3.12 warns of any other OS thread (execnet's
        warnings.simplefilter("ignore", DeprecationWarning)  # reader); checked above
        pid = os.fork()
    if pid == 0:  # the server: never returns
        _serve(listener.fileno(), alive_r, alive_w)
    os.close(alive_r)
    listener.close()
    server: Any = forkserver._forkserver
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    return True


def _serve(listener_fd: int, alive_r: int, alive_w: int) -> None:
    """The forked server's whole life: multiprocessing's loop, then _exit (the worker's
    atexit handlers, pytest's and ZMQ's, are not the server's)."""
    code = 1
    try:
        gc.disable()  # the worker's objects are never finalised here (they close what they own)
        os.close(alive_w)  # EOF on alive_r once every client's copy is gone
        for number in range(1, signal.NSIG):  # the worker's Python handlers (SIG_IGN stays)
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                if callable(signal.getsignal(number)):
                    signal.signal(number, signal.SIG_DFL)
        _blank_inherited({listener_fd, alive_r})
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 -- the worker's were capture
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 -- objects, now blanked
        forkserver.main(listener_fd, alive_r, [])
        code = 0
    except SystemExit:  # the loop's end: every client has gone
        code = 0
    except BaseException:
        with contextlib.suppress(Exception):
            import traceback
            traceback.print_exc()
    finally:
        os._exit(code)


def _open_descriptors() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: probe each number
        found = []
        for fd in range(os.sysconf("SC_OPEN_MAX")):
            with contextlib.suppress(OSError):
                os.fstat(fd)
                found.append(fd)
        return found


def _blank_inherited(keep: set[int]) -> None:
    """Point every descriptor inherited from the worker (but stdio and `keep`) at /dev/null.

    Not closed: the worker's objects still hold those numbers (a logging stream, pytest's
    capture file, sockets), and a closed number is reused by the next descriptor opened
    here, which those objects would then write to (seen: a coordinator's log line in the
    server's alive pipe). Blanked, they read EOF and write nowhere, and no socket, pipe or
    listening port of the worker stays open in the server or its children."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in _open_descriptors():
        if fd > 2 and fd not in keep and fd != devnull:
            with contextlib.suppress(OSError):
                os.dup2(devnull, fd)
    os.close(devnull)


def _stop_server() -> None:
    """End the server at session end, bounded. As the stdlib's `_stop` (the call its own
    tests use), forked or spawned alike: closing the alive pipe asks the server to go once
    no coordinator holds a copy. A server still there after STOP_TIMEOUT means a coordinator
    outlived its case: the server is killed and that is raised, for the leak report."""
    with _LOCK:
        if not _CONTEXT:
            return
        _CONTEXT.clear()
        server: Any = forkserver._forkserver
        with server._lock:
            pid = server._forkserver_pid
            if pid is None:
                return
            os.close(server._forkserver_alive_fd)
            server._forkserver_alive_fd = None
            ended = _reaped(pid, STOP_TIMEOUT)
            if not ended:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            server._forkserver_pid = None
            with contextlib.suppress(OSError):
                os.unlink(server._forkserver_address)
            server._forkserver_address = None
    if not ended:
        raise RuntimeError(f"the DP coordinators' fork server (pid {pid}) was still serving "
                           f"{STOP_TIMEOUT:.0f}s after the session ended (a coordinator "
                           f"outlived its case); killed")


def _reaped(pid: int, timeout: float) -> bool:
    """Wait up to `timeout` for child `pid` to end and reap it; ends on its exit (a pidfd)
    where the platform has one."""
    deadline = time.monotonic() + timeout
    pidfd = -1
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(pid)
    try:
        while True:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if pidfd >= 0:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(left, 0.02))
    finally:
        if pidfd >= 0:
            os.close(pidfd)
