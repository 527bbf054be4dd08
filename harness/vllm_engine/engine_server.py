"""The engine server: one child process per mode that imports vLLM once and launches engines.

Why a server: importing vLLM costs 10-30 s, so it happens once per mode and per harness
process, in a child process (`server_process.main`) with a clean fd table and its own
environment (VLLM_TARGET_DEVICE, loopback VLLM_HOST_IP). This module is the harness's side
of it: `EngineServer` starts the child, sends it JSON control messages over a private
socketpair and tracks each launch (`Launch`) from the events one reader thread receives.
It never imports vLLM.

Reaping, in layers:

* A group's `stop()` asks the server to shut its engine down. The server uses vLLM's own
  process manager: SIGTERM, a bounded wait, then SIGKILL.
* If the server does not confirm in time, the harness SIGKILLs the engine pids itself.
* The server exits when the harness process goes away (EOF on its control socket, or its
  parent changing), and shuts every engine down first.
* cpu-stub engines also get PR_SET_PDEATHSIG, so they cannot outlive the server.
* `shutdown_servers()` (also registered with atexit) stops the servers, with a bounded wait
  and SIGKILL.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import multiprocessing.connection as mpc
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.locations import IMPORT_ROOT

Mode = Literal["cpu-stub", "gpu"]
MODES: tuple[Mode, ...] = ("cpu-stub", "gpu")
ENV_GPU_MODEL = "COREWIRE_GPU_MODEL"
ENV_GPU_MAX_MODEL_LEN = "COREWIRE_GPU_MAX_MODEL_LEN"
ENV_GPU_MEMORY_UTILIZATION = "COREWIRE_GPU_MEMORY_UTILIZATION"

SERVER_START_TIMEOUT = 180.0  # importing vLLM + torch on a slow 2-core box
CONTROL_TIMEOUT = 10.0  # an answer from the server to one control message
LOG_TAIL_BYTES = 4000
_REPO_ROOT = IMPORT_ROOT  # the server imports harness and mock_engines from here
# Not `-m`: that would import the server module twice (as the package's and as __main__).
_SERVER_MAIN = ("import sys; from harness.vllm_engine.server_process import main; "
                "sys.exit(main(sys.argv[1:]))")


class EngineUnavailable(RuntimeError):
    """The requested engine cannot run here (e.g. GPU mode without a CUDA device)."""


class VllmCoreError(RuntimeError):
    """The engine server or a real engine failed (the message carries the log tail)."""


@dataclass
class Launch:
    """What the harness knows about one launched engine set."""

    id: int
    pids: list[int] = field(default_factory=list)
    launched: threading.Event = field(default_factory=threading.Event)
    up: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    exited: dict[int, int | None] = field(default_factory=dict)  # unexpected exits
    start_seconds: float | None = None
    stop_seconds: float | None = None


class EngineServer:
    """One long-lived child process that imports vLLM once and launches engines on request.

    Control messages are JSON over a private socketpair, read by one reader thread.
    """

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}
        self._ready = threading.Event()
        self._failed: str | None = None
        self._conn: mpc.Connection | None = None
        self._send_lock = threading.Lock()
        self._launches: dict[int, Launch] = {}
        self._ids = itertools.count(1)
        self._reader: threading.Thread | None = None
        self._log_dir = tempfile.mkdtemp(prefix="cw-refsrv-")
        self.log_path = os.path.join(self._log_dir, "engine-server.log")

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Spawn the server (returns at once; `wait_ready` bounds the vLLM import)."""
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env.update(VLLM_HOST_IP="127.0.0.1", PYTHONUNBUFFERED="1",
                   VLLM_TARGET_DEVICE="cpu" if self.mode == "cpu-stub" else "cuda",
                   PYTHONPATH=os.pathsep.join(
                       p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER_MAIN, "--serve", "--fd", str(theirs.fileno()),
                 "--mode", self.mode],
                pass_fds=[theirs.fileno()], env=env, cwd=_REPO_ROOT,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)  # the harness's Ctrl-C is for the harness
        theirs.close()
        self._conn = mpc.Connection(ours.detach())
        self._reader = threading.Thread(target=self._read, name=f"engine-server-{self.mode}",
                                        daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float) -> None:
        """Block until vLLM is imported in the server; raises with the log tail if not."""
        if not self._ready.wait(timeout) and self._failed is None:
            raise VllmCoreError(f"engine server ({self.mode}) not ready within "
                                       f"{timeout:.0f}s\n{self.log_tail()}")
        if self._failed is not None:
            raise VllmCoreError(f"engine server ({self.mode}) failed: {self._failed}\n"
                                       f"{self.log_tail()}")

    @property
    def failed(self) -> str | None:
        return self._failed

    def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the server to exit (it stops its engines first); SIGKILL after `timeout`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self._send({"op": "exit"})
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)
        for launch in list(self._launches.values()):
            kill_pids(launch.pids)  # belt and braces: nothing may outlive the harness
        if self._conn is not None:
            self._conn.close()
        if self._reader is not None:
            self._reader.join(5.0)
        shutil.rmtree(self._log_dir, ignore_errors=True)

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - limit))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return "(no engine server log)"
        return f"--- engine server log tail ({self.log_path}) ---\n{text}"

    # ------------------------------------------------------------------ launches

    def launch(self, *, inputs: Sequence[str] = (), outputs: Sequence[str] = (),
               handshake: str | None = None, step_delay_s: float = 0.0,
               log_stats: bool = True, engine_args: dict[str, Any] | None = None) -> Launch:
        """Queue a launch (the server handles it once ready); returns its state at once."""
        launch = Launch(next(self._ids))
        self._launches[launch.id] = launch
        self._send({"op": "launch", "id": launch.id, "inputs": list(inputs),
                    "outputs": list(outputs), "handshake": handshake,
                    "step_delay_s": step_delay_s, "log_stats": log_stats,
                    "engine_args": engine_args or {}})
        return launch

    def stop_launch(self, launch: Launch, timeout: float) -> None:
        """Shut one launch's engines down; SIGKILL them if the server does not confirm."""
        if not launch.stopped.is_set() and self.alive:
            with contextlib.suppress(OSError, ValueError):
                self._send({"op": "stop", "id": launch.id, "timeout": timeout})
            launch.stopped.wait(timeout + 2.0)
        if not launch.stopped.is_set():
            kill_pids(launch.pids)
        self._launches.pop(launch.id, None)

    def _send(self, message: dict[str, Any]) -> None:
        if self._conn is None:
            raise VllmCoreError("engine server is not started")
        with self._send_lock:
            self._conn.send_bytes(json.dumps(message).encode())

    def _read(self) -> None:
        assert self._conn is not None
        try:
            while True:
                event = json.loads(self._conn.recv_bytes())
                self._dispatch(event)
        except (EOFError, OSError):
            pass
        finally:
            if not self._ready.is_set():
                self._failed = self._failed or "the engine server exited during startup"
                self._ready.set()
            for launch in self._launches.values():  # nobody will answer these any more
                if not launch.stopped.is_set():
                    launch.error = launch.error or "the engine server exited"
                    launch.stopped.set()

    def _dispatch(self, event: dict[str, Any]) -> None:
        kind = event.get("ev")
        if kind == "server_ready":
            self.info = event
            self._ready.set()
            return
        if kind == "server_failed":
            self._failed = str(event.get("error"))
            self._ready.set()
            return
        launch = self._launches.get(int(event.get("id", -1)))
        if launch is None:
            return
        if kind == "launched":
            launch.pids = [int(p) for p in event["pids"]]
            launch.launched.set()
        elif kind == "up":
            launch.start_seconds = float(event["seconds"])
            launch.up.set()
        elif kind == "failed":
            launch.error = str(event["error"])
            launch.launched.set()
        elif kind == "exited":
            launch.exited.update({int(k): v for k, v in event["exitcodes"].items()})
        elif kind == "stopped":
            launch.stop_seconds = float(event["seconds"])
            launch.stopped.set()


def kill_pids(pids: Sequence[int]) -> None:
    """SIGKILL engine processes that are still there (our own children's children)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


_SERVERS: dict[str, EngineServer] = {}
_SERVERS_LOCK = threading.Lock()


def engine_server(mode: Mode) -> EngineServer:
    """This process's engine server for `mode`, started (not waited for) on first use."""
    with _SERVERS_LOCK:
        server = _SERVERS.get(mode)
        if server is None or (server.proc is not None and not server.alive):
            server = _SERVERS[mode] = EngineServer(mode)
            server.start()
        return server


def shutdown_servers(timeout: float = 10.0) -> None:
    """Stop every engine server of this process (and thereby every engine); bounded."""
    with _SERVERS_LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.shutdown(timeout)


atexit.register(shutdown_servers)


def check_available(mode: Mode) -> None:
    """Raise EngineUnavailable (with the reason) when `mode` cannot run here."""
    if mode not in MODES:
        raise ValueError(f"unknown vLLM-core engine mode {mode!r}; one of {MODES}")
    if mode == "cpu-stub":
        return
    try:
        import torch
    except Exception as exc:  # no torch, or a broken one
        raise EngineUnavailable(f"no CUDA device: torch is not importable ({exc})") from exc
    if not torch.cuda.is_available():
        raise EngineUnavailable(
            f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, "
            f"CUDA build {torch.version.cuda or 'none'}); the GPU vLLM-core engine runs "
            f"only on a CUDA machine and is never faked")
    model = os.environ.get(ENV_GPU_MODEL)
    if not model:
        raise EngineUnavailable(f"{ENV_GPU_MODEL} is not set: name the (local) model the GPU "
                                "vLLM-core engine should load")


__all__ = ["ENV_GPU_MAX_MODEL_LEN", "ENV_GPU_MEMORY_UTILIZATION", "ENV_GPU_MODEL", "MODES",
           "SERVER_START_TIMEOUT", "EngineServer", "EngineUnavailable", "Launch", "Mode",
           "VllmCoreError", "check_available", "engine_server", "kill_pids",
           "shutdown_servers"]
