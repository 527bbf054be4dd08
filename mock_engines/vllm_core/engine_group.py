"""`VllmCoreGroup`: vLLM's real engine core behind the `EngineGroup` interface.

Where the mock engines say what we believe vLLM 0.33.0 says, this group runs what vLLM
says: its real `EngineCoreProc` (scheduler, KV cache manager, socket threads, utilities,
abort handling) in a child process, started with vLLM's own `launch_core_engines`. The
model underneath is chosen by mode:

* "cpu-stub": `StubExecutor` (arithmetic tokens, no weights), so it runs anywhere;
* "gpu": vLLM's real executor with the real model named by COREWIRE_GPU_MODEL; without a
  CUDA device it raises `EngineUnavailable` and is never faked.

Between the frontend under test and the engine sits a `RecordingProxy`, whose transcript is
`group.transcript`: the same queries cases run against mock engines apply unchanged.

Processes. Importing vLLM costs 10-30 s, so it happens once per mode and per harness
process, in an *engine server*: a child process (`main(["--serve", ...])`) with a clean fd
table and its own environment (VLLM_TARGET_DEVICE, loopback VLLM_HOST_IP). The server
builds configs and, per group, calls `launch_core_engines`, which forks (cpu-stub) the
`EngineCoreProc` and runs vLLM's real HELLO / INIT / READY handshake with it. A cpu-stub
engine starts in about a second.

Reaping, in layers:

* A group's `stop()` asks the server to shut its engine down. The server uses vLLM's own
  process manager: SIGTERM, a bounded wait, then SIGKILL.
* If the server does not confirm in time, the harness SIGKILLs the engine pids itself.
* The server exits when the harness process goes away (EOF on its control socket, or its
  parent changing), and shuts every engine down first.
* cpu-stub engines also get PR_SET_PDEATHSIG, so they cannot outlive the server.
* `shutdown_servers()` (also registered with atexit) stops the servers, with a bounded wait
  and SIGKILL.

Only DP=1 is supported: a real DP>1 deployment needs vLLM's own DP coordinator, whose
address is known only after launch, while drivers read `stats_address` before it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
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
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from harness.vllm_dist import tiny_model_dir
from harness.wire import DEFAULT_CODEC, WireCodec
from mock_engines.transcript import MergedTranscript, Record, Transcript
from mock_engines.vllm_core.proxy import RecordingProxy

Mode = Literal["cpu-stub", "gpu"]
MODES: tuple[Mode, ...] = ("cpu-stub", "gpu")
ENV_GPU_MODEL = "COREWIRE_GPU_MODEL"
ENV_GPU_MAX_MODEL_LEN = "COREWIRE_GPU_MAX_MODEL_LEN"
ENV_GPU_MEMORY_UTILIZATION = "COREWIRE_GPU_MEMORY_UTILIZATION"

SERVER_START_TIMEOUT = 180.0  # importing vLLM + torch on a slow 2-core box
CONTROL_TIMEOUT = 10.0  # an answer from the server to one control message
LOG_TAIL_BYTES = 4000
_REPO_ROOT = Path(__file__).resolve().parents[2]
# Not `-m`: that would import this module twice (as the package's and as __main__).
_SERVER_MAIN = ("import sys; from mock_engines.vllm_core.engine_group import main; "
                "sys.exit(main(sys.argv[1:]))")


class EngineUnavailable(RuntimeError):
    """The requested engine cannot run here (e.g. GPU mode without a CUDA device)."""


class VllmCoreError(RuntimeError):
    """The engine server or a real engine failed (the message carries the log tail)."""


# =====================================================================================
# Harness side: the engine server's client
# =====================================================================================


@dataclass
class _Launch:
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
        self._launches: dict[int, _Launch] = {}
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
            _kill_pids(launch.pids)  # belt and braces: nothing may outlive the harness
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
               log_stats: bool = True, engine_args: dict[str, Any] | None = None) -> _Launch:
        """Queue a launch (the server handles it once ready); returns its state at once."""
        launch = _Launch(next(self._ids))
        self._launches[launch.id] = launch
        self._send({"op": "launch", "id": launch.id, "inputs": list(inputs),
                    "outputs": list(outputs), "handshake": handshake,
                    "step_delay_s": step_delay_s, "log_stats": log_stats,
                    "engine_args": engine_args or {}})
        return launch

    def stop_launch(self, launch: _Launch, timeout: float) -> None:
        """Shut one launch's engines down; SIGKILL them if the server does not confirm."""
        if not launch.stopped.is_set() and self.alive:
            with contextlib.suppress(OSError, ValueError):
                self._send({"op": "stop", "id": launch.id, "timeout": timeout})
            launch.stopped.wait(timeout + 2.0)
        if not launch.stopped.is_set():
            _kill_pids(launch.pids)
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


def _kill_pids(pids: Sequence[int]) -> None:
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


# =====================================================================================
# Harness side: the group
# =====================================================================================


class VllmCoreEngine:
    """One real engine (DP rank) as cases see it: a rank, a transcript, fault hooks.

    Faults that a real engine cannot be told to commit are injected by the proxy and
    recorded as such; `exit()` really kills the engine process.
    """

    def __init__(self, rank: int, group: VllmCoreGroup) -> None:
        self.rank = rank
        self._group = group

    @property
    def transcript(self) -> Transcript:
        return self._group.proxy.transcript

    @property
    def pid(self) -> int | None:
        launch = self._group._launch
        return launch.pids[0] if launch is not None and launch.pids else None

    def send_dead(self) -> None:
        self._group.proxy.inject_dead()

    def send_garbage(self, frames: list[bytes], client_index: int = 0) -> None:
        self._group.proxy.inject_garbage(frames, client_index)

    def stop_reading(self) -> None:
        self._group.proxy.stop_reading()

    def resume_reading(self) -> None:
        self._group.proxy.resume_reading()

    def close_sockets(self) -> None:
        self._group.proxy.close_frontend_sockets()

    def exit(self) -> None:
        """SIGKILL the real engine process (its sockets close; nothing is sent)."""
        pid = self.pid
        if pid is None:
            raise RuntimeError(f"vLLM-core engine {self.rank} is not running")
        self._group._killed = True
        self.transcript.append(Record(time.monotonic(), self.rank, "out", "fault", (), None,
                                      None, f"engine process {pid} killed (SIGKILL)"))
        _kill_pids([pid])


class VllmCoreGroup:
    """The real vLLM engine core (DP=1) behind a recording proxy, as an engine group."""

    # What drivers read of any engine group (see mock_engines.group.EngineGroup): the real
    # engine is always bootstrapped, with no frontend-owned handshake or coordinator.
    handshake = False
    coordinated = False

    def __init__(self, engines: int = 1, *, mode: Mode = "cpu-stub",
                 step_delay_s: float = 0.0, log_stats: bool = True,
                 engine_args: dict[str, Any] | None = None,
                 codec: WireCodec = DEFAULT_CODEC) -> None:
        if engines != 1:
            raise NotImplementedError(
                "the vLLM-core engine group runs one engine (DP=1): a real DP>1 deployment "
                "needs vLLM's own DP coordinator, whose stats address exists only after "
                "launch, while drivers read stats_address before they start")
        check_available(mode)
        self.mode = mode
        self.step_delay_s = step_delay_s
        self.log_stats = log_stats
        self.engine_args = dict(engine_args or {})
        self.proxy = RecordingProxy([0], codec=codec)
        self.transcript = MergedTranscript([self.proxy.transcript])
        self.engines = [VllmCoreEngine(0, self)]
        self._server: EngineServer | None = None
        self._launch: _Launch | None = None
        self._killed = False
        self._closed = False
        self.stop_seconds: float | None = None

    def __len__(self) -> int:
        return len(self.engines)

    def __getitem__(self, index: int) -> VllmCoreEngine:
        return self.engines[index]

    @property
    def stats_address(self) -> str | None:
        return None  # DP=1: no coordinator

    @property
    def start_seconds(self) -> float | None:
        """Engine start as the server measured it (launch to handshake READY), if up."""
        return self._launch.start_seconds if self._launch is not None else None

    # ------------------------------------------------------------------ start

    def prepare(self, timeout: float = SERVER_START_TIMEOUT) -> None:
        """Start this mode's engine server and wait until vLLM is imported there.

        Optional: starting without it works, but then the first group's startup bound must
        cover the import (tens of seconds on a small box).
        """
        engine_server(self.mode).wait_ready(timeout)

    def start_bootstrapped(self, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        """Proxy the frontend's bound addresses, launch the engine against the proxy.

        Returns once the proxy is bound and the launch is queued; `wait_registered` (or the
        frontend's own ready wait) bounds the rest.
        """
        self._begin()
        eng_in, eng_out = self.proxy.start_bootstrapped(inputs, outputs)
        self._launch = self._get_server().launch(
            inputs=eng_in, outputs=eng_out, step_delay_s=self.step_delay_s,
            log_stats=self.log_stats, engine_args=self.engine_args)

    def start_handshake(self, address: str, *, local: bool = True, headless: bool = False,
                        timeout: float = 30.0) -> None:
        """The engine does vLLM's real HELLO / INIT / READY with the frontend, via the proxy.

        Only `local=True, headless=False` (what a local engine says). `timeout` is accepted
        for interface compatibility: how long a real engine waits for INIT is vLLM's own
        (HANDSHAKE_TIMEOUT_MINS), not ours to script.
        """
        if not local or headless:
            raise NotImplementedError("a real local engine says local=True, headless=False; "
                                      "remote/headless engines are not launched here")
        self._begin()
        engine_handshake = self.proxy.start_handshake(address)
        self._launch = self._get_server().launch(
            handshake=engine_handshake, step_delay_s=self.step_delay_s,
            log_stats=self.log_stats, engine_args=self.engine_args)

    def _begin(self) -> None:
        if self._launch is not None or self._closed:
            raise RuntimeError("a vLLM-core engine group starts once")

    def _get_server(self) -> EngineServer:
        if self._server is None:
            self._server = engine_server(self.mode)
        return self._server

    def wait_registered(self, timeout: float) -> bool:
        """True once the engine's ready frame reached the frontend (False: timeout/failure)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proxy.wait_registered(min(0.05, max(0.0, deadline - time.monotonic()))):
                return True
            launch = self._launch
            if launch is None or launch.error is not None or launch.exited:
                return False
            if self._server is not None and self._server.failed is not None:
                return False
            if time.monotonic() >= deadline:
                return False

    def failures(self) -> list[tuple[int, BaseException]]:
        """Launch errors, unexpected engine exits, proxy and server failures."""
        out: list[tuple[int, BaseException]] = []
        tail = self._server.log_tail() if self._server is not None else ""
        if self._server is not None and self._server.failed is not None:
            out.append((0, VllmCoreError(f"engine server failed: "
                                                f"{self._server.failed}\n{tail}")))
        launch = self._launch
        if launch is not None and launch.error is not None and not self._closed:
            out.append((0, VllmCoreError(f"engine launch failed: {launch.error}\n"
                                                f"{tail}")))
        if launch is not None and launch.exited and not self._killed:
            out.append((0, VllmCoreError(f"engine process exited unexpectedly: "
                                                f"{launch.exited}\n{tail}")))
        if self.proxy.failure is not None:
            out.append((0, self.proxy.failure))
        return out

    def diagnostics(self) -> str:
        return self._server.log_tail() if self._server is not None else ""

    # ------------------------------------------------------------------ stop

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the engine (reaped, SIGKILL as last resort), then the proxy; bounded."""
        if self._closed:
            return
        self._closed = True
        start = time.monotonic()
        errors: list[str] = []
        if self._launch is not None and self._server is not None:
            self._launch.launched.wait(min(timeout, 2.0))  # know the pids before stopping
            self._server.stop_launch(self._launch, timeout)
            if not self._launch.stopped.is_set():
                errors.append(f"engine server did not confirm the engine stopped within "
                              f"{timeout}s; pids {self._launch.pids} were SIGKILLed")
        try:
            self.proxy.stop(timeout)
        except TimeoutError as exc:
            errors.append(str(exc))
        self.stop_seconds = time.monotonic() - start
        if errors:
            raise TimeoutError("; ".join(errors))

    def __enter__(self) -> VllmCoreGroup:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# =====================================================================================
# Server side (a child process; the only place that imports vLLM)
# =====================================================================================


class _Server:
    """The engine server's state: configs per engine-args set, live engine managers."""

    def __init__(self, conn: mpc.Connection, mode: Mode) -> None:
        self.conn = conn
        self.mode = mode
        self.parent = os.getppid()
        self.managers: dict[int, Any] = {}  # launch id -> CoreEngineProcManager
        self.watch: dict[Any, int] = {}  # process sentinel -> launch id
        self.configs: dict[str, Any] = {}
        import vllm  # the 10-30 s import this process exists for
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.utils import (
            CoreEngineProcManager,
            EngineZmqAddresses,
            launch_core_engines,
        )
        from vllm.v1.executor.abstract import Executor

        self.vllm_version = vllm.__version__
        self.EngineArgs = EngineArgs
        self.CoreEngineProcManager = CoreEngineProcManager
        self.EngineZmqAddresses = EngineZmqAddresses
        self.launch_core_engines = launch_core_engines
        self.Executor = Executor
        self.config({})  # the default config, built before we say we are ready

    def send(self, message: dict[str, Any]) -> None:
        self.conn.send_bytes(json.dumps(message).encode())

    # ------------------------------------------------------------------ configs

    def config(self, overrides: dict[str, Any]) -> Any:
        key = json.dumps(overrides, sort_keys=True)
        cached = self.configs.get(key)
        if cached is None:
            if self.mode == "cpu-stub":
                args: dict[str, Any] = dict(model=str(tiny_model_dir()),
                                            skip_tokenizer_init=True, max_model_len=1024,
                                            enforce_eager=True)
            else:
                args = dict(model=os.environ[ENV_GPU_MODEL], skip_tokenizer_init=True,
                            max_model_len=int(os.environ.get(ENV_GPU_MAX_MODEL_LEN, "1024")),
                            enforce_eager=True,
                            gpu_memory_utilization=float(
                                os.environ.get(ENV_GPU_MEMORY_UTILIZATION, "0.5")))
            args.update(overrides)
            cached = self.configs[key] = self.EngineArgs(**args).create_engine_config()
            if self.mode == "cpu-stub":
                # The CPU platform just forced "spawn" (a 10-30 s re-import of vLLM per
                # engine). Fork is safe from this process -- no device context, no work of
                # its own besides launching -- and starts an engine in about a second.
                os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
        return copy.deepcopy(cached)

    # ------------------------------------------------------------------ launches

    def launch(self, msg: dict[str, Any]) -> None:
        lid = int(msg["id"])
        start = time.monotonic()
        try:
            cfg = self.config(dict(msg.get("engine_args") or {}))
            if self.mode == "cpu-stub":
                from mock_engines.vllm_core.stub_executor import (
                    StubExecutor,
                    stub_additional_config,
                )
                cfg.additional_config.update(stub_additional_config(
                    float(msg.get("step_delay_s", 0.0)), die_with_parent=True))
                executor: Any = StubExecutor
            else:
                executor = self.Executor.get_class(cfg)
            log_stats = bool(msg.get("log_stats", True))
            if msg.get("handshake"):
                # The frontend under test plays the launcher's handshake role (via the
                # proxy), so vLLM's process manager is used without its launcher half.
                manager = self.CoreEngineProcManager(
                    local_engine_count=1, start_index=0, local_start_index=0,
                    vllm_config=cfg, local_client=True, handshake_address=msg["handshake"],
                    executor_class=executor, log_stats=log_stats)
                self._adopt(lid, manager)
                return
            addresses = self.EngineZmqAddresses(inputs=list(msg["inputs"]),
                                                outputs=list(msg["outputs"]))
            try:
                with self.launch_core_engines(cfg, executor, log_stats, addresses) as launch:
                    if launch.engine_manager is not None:
                        self._adopt(lid, launch.engine_manager)
            except BaseException:
                self._drop(lid, timeout=2.0)
                raise
            self.send({"ev": "up", "id": lid, "seconds": time.monotonic() - start})
        except Exception as exc:
            self.send({"ev": "failed", "id": lid, "error": f"{type(exc).__name__}: {exc}"})

    def _adopt(self, lid: int, manager: Any) -> None:
        self.managers[lid] = manager
        for proc in manager.processes:
            self.watch[proc.sentinel] = lid
        self.send({"ev": "launched", "id": lid, "pids": [p.pid for p in manager.processes]})

    def _drop(self, lid: int, timeout: float) -> dict[int, int | None]:
        manager = self.managers.pop(lid, None)
        if manager is None:
            return {}
        for sentinel in [s for s, i in self.watch.items() if i == lid]:
            del self.watch[sentinel]
        manager.shutdown(timeout)
        return {p.pid: p.exitcode for p in manager.processes}

    def stop(self, msg: dict[str, Any]) -> None:
        lid = int(msg["id"])
        start = time.monotonic()
        codes = self._drop(lid, float(msg.get("timeout", 5.0)))
        self.send({"ev": "stopped", "id": lid, "exitcodes": {str(k): v for k, v in codes.items()},
                   "seconds": time.monotonic() - start})

    def exited(self, sentinel: Any) -> None:
        lid = self.watch.pop(sentinel, None)
        manager = self.managers.get(lid) if lid is not None else None
        if manager is None:
            return
        codes = {str(p.pid): p.exitcode for p in manager.processes if p.sentinel == sentinel}
        self.send({"ev": "exited", "id": lid, "exitcodes": codes})

    # ------------------------------------------------------------------ loop

    def serve(self) -> None:
        self.send({"ev": "server_ready", "pid": os.getpid(), "vllm_version": self.vllm_version,
                   "mode": self.mode})
        while os.getppid() == self.parent:
            ready = mpc.wait([self.conn, *self.watch], timeout=1.0)
            for item in ready:
                if item is self.conn:
                    try:
                        msg = json.loads(self.conn.recv_bytes())
                    except EOFError:
                        return  # the harness went away
                    op = msg.get("op")
                    if op == "exit":
                        return
                    if op == "launch":
                        self.launch(msg)
                    elif op == "stop":
                        self.stop(msg)
                else:
                    self.exited(item)

    def close(self) -> None:
        for lid in list(self.managers):
            with contextlib.suppress(Exception):
                self._drop(lid, timeout=5.0)


def _serve(fd: int, mode: Mode) -> int:
    conn = mpc.Connection(fd)

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    os.environ["VLLM_HOST_IP"] = "127.0.0.1"
    try:
        server = _Server(conn, mode)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            conn.send_bytes(json.dumps({"ev": "server_failed",
                                        "error": f"{type(exc).__name__}: {exc}"}).encode())
        raise
    try:
        server.serve()
    finally:
        server.close()
    # Every engine is reaped by now; skip the interpreter's slow teardown of torch/vLLM
    # (seconds, and noisy) -- nothing is left that needs it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="corewire vLLM-core engine server "
                                                 "(started by VllmCoreGroup)")
    parser.add_argument("--serve", action="store_true", required=True)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--mode", choices=MODES, default="cpu-stub")
    args = parser.parse_args(argv)
    return _serve(args.fd, args.mode)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["ENV_GPU_MODEL", "MODES", "EngineServer", "EngineUnavailable", "Mode",
           "VllmCoreEngine", "VllmCoreError", "VllmCoreGroup",
           "check_available", "engine_server", "shutdown_servers"]
