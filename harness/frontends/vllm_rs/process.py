"""The vllm-rs process: launched in its release's command-line form, waited on until it
serves, and always ended.

We play vLLM's Python supervisor (`vllm/v1/utils.py` RustFrontendProcessManager): bind the HTTP
TCP listener and the two raw AF_UNIX listeners the engines connect to, hand their fds to
`vllm-rs frontend`, then start the mock engines against the listener paths. Releases before
0.32 take ipc addresses they bind themselves instead of fds (vllm_rs_releases.py). Cases that
need the frontend to own HELLO / INIT / READY run `vllm-rs serve` instead, with a stand-in for
its managed Python engine (vllm_rs_handshake.py).

The process logs into the driver's private directory; its tail is what a failed start or a
verdict's diagnostics quote. A process is SIGTERMed, then SIGKILLed, and reaped; one still
alive when the interpreter exits is killed then.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import math
import os
import re
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.artefacts.vllm_dist import VLLM_VERSION, tiny_model_dir, vllm_rs_binary
from harness.frontends.api import StartupError, UnsupportedOperation
from harness.frontends.vllm_rs import handshake as hs
from harness.frontends.vllm_rs.control import ControlClient
from harness.frontends.vllm_rs.fetch import release_binary
from harness.frontends.vllm_rs.http import CONNECTION_ERRORS, HOST
from harness.frontends.vllm_rs.releases import RsRelease
from harness.protocol.timing import Timescale
from harness.protocol.transport.endpoints import PrivateIpcDir, ReservedTcpPort

if TYPE_CHECKING:
    from harness.frontends.api import EngineSide

STARTUP_LOG_LINES = 40
DIAGNOSTIC_LOG_LINES = 60
TERM_GRACE = 5.0  # seconds between SIGTERM and SIGKILL
PROBE_PATH = "/v1/models"  # answers 200 once the frontend serves
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# (method, path) -> (HTTP status, body): how the start probes the HTTP surface.
Probe = Callable[[str, str], Awaitable[tuple[int, bytes]]]

_LIVE: set[subprocess.Popen[bytes]] = set()  # processes to kill if the interpreter exits early


@atexit.register
def _kill_leftovers() -> None:
    """Last resort (e.g. an interrupted session): never leave a vllm-rs process behind."""
    for proc in list(_LIVE):
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            proc.wait(TERM_GRACE)


@functools.cache
def _binary(version: str | None = None) -> Path:
    """Resolving (and maybe fetching) a binary is expensive: once per release per session.
    None is plain `vllm-rs` (installed vLLM 0.33.0 or $COREWIRE_VLLM_RS); a release of the
    installed version reuses that binary, any other is fetched from its wheel once."""
    if version is None or version == VLLM_VERSION:
        return vllm_rs_binary()
    return release_binary(version)


@functools.lru_cache(maxsize=1)
def model_dir() -> str:
    """The tiny model the frontend serves (also the `model` of every completion)."""
    return str(tiny_model_dir())


def _unix_listener(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def _tcp_listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((HOST, 0))
        sock.listen(4096)
    except OSError:
        sock.close()
        raise
    return sock


class RsProcess:
    """One vllm-rs binary run at a time: its listeners, private directory, log and process."""

    def __init__(self, release: RsRelease, version: str | None,
                 extra_args: dict[str, Any]) -> None:
        """`version` None: plain `vllm-rs` (see `_binary`); `extra_args` go into
        `--args-json` over the driver's defaults."""
        self.release = release
        self.version = version
        self.extra_args = extra_args
        self.port: int | None = None
        self.control: ControlClient | None = None  # the gRPC Control service, once started
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: str | None = None
        self._saved_log = ""  # the log tail, kept past stop (diagnostics come after it)
        self._ipc: PrivateIpcDir | None = None
        self._listeners: list[socket.socket] = []
        self._reserved: list[ReservedTcpPort] = []  # ports the binary binds, held till stop

    def command(self, in_fd: int | str, out_fd: int | str, http_fd: int, group: EngineSide,
                ready_timeout: int, grpc_fd: int | None = None) -> list[str]:
        """The exact command line (also what the report quotes), in the release's form:
        `in_fd`/`out_fd` are inherited listener fds (0.32+) or ipc addresses the binary binds
        itself (before 0.32)."""
        ranks = [e.rank for e in group.engines]
        start = min(ranks)
        args = {"model_tag": model_dir(), "engine_ready_timeout_secs": ready_timeout,
                "http_timeout_keep_alive": 5, **self.extra_args}
        rel = self.release
        cmd = [str(_binary(self.version)), "frontend", "--listen-fd", str(http_fd)]
        if rel.listener_fds:
            cmd += ["--input-listener-fd", str(in_fd), "--output-listener-fd", str(out_fd)]
        else:
            cmd += ["--input-address", str(in_fd), "--output-address", str(out_fd)]
        if rel.engine_start_index_flag:
            cmd += ["--engine-start-index", str(start)]
        elif start != 0:
            raise UnsupportedOperation(f"vllm-rs {rel.version} has no --engine-start-index "
                                       f"(from 0.24.0): engine ranks must start at 0")
        cmd += ["--engine-count", str(len(ranks))]
        if rel.data_parallel_size_flag:
            cmd += ["--data-parallel-size", str(start + len(ranks))]
        if grpc_fd is not None:  # the Control service (see vllm_rs_control.py)
            cmd += ["--grpc-listen-fd", str(grpc_fd)]
        if group.stats_address is not None:
            cmd += ["--coordinator-address", group.stats_address]
        return [*cmd, "--args-json", json.dumps(args, sort_keys=True)]

    def launch_frontend(self, group: EngineSide, timeout: float, env: dict[str, str],
                        timescale: Timescale) -> None:
        """`vllm-rs frontend` on listeners we bind, then the engines bootstrapped onto them."""
        self._ipc = PrivateIpcDir(prefix="cw-rs-")
        in_path, out_path = self._ipc.path_for("in"), self._ipc.path_for("out")
        http = _tcp_listener()
        self._listeners = [http]
        in_arg: int | str = "ipc://" + in_path
        out_arg: int | str = "ipc://" + out_path
        if self.release.listener_fds:
            inp, out = _unix_listener(in_path), _unix_listener(out_path)
            self._listeners += [inp, out]
            in_arg, out_arg = inp.fileno(), out.fileno()
        grpc_fd: int | None = None
        if self.release.grpc_control:
            grpc = _tcp_listener()
            self._listeners.append(grpc)
            self.control = ControlClient(grpc.getsockname()[1], timescale=timescale)
            grpc_fd = grpc.fileno()
        self.port = http.getsockname()[1]
        fds = [sock.fileno() for sock in self._listeners]
        for fd in fds:
            os.set_inheritable(fd, True)
        # Let the binary's own registration timeout fire just before ours, so its reason
        # ("engine input registration timed out after Ns") is in the log we attach.
        ready_timeout = max(1, math.floor(timeout - 0.5))
        cmd = self.command(in_arg, out_arg, http.fileno(), group, ready_timeout, grpc_fd)
        self._spawn(cmd, env, fds)
        # Like vLLM's supervisor, drop our copies once the child holds them: if the frontend
        # dies, engines and HTTP clients then get "connection refused" instead of parking in
        # a backlog nobody accepts from.
        self._close_listeners()
        group.start_bootstrapped(["ipc://" + in_path], ["ipc://" + out_path])

    def launch_handshake_owner(self, group: EngineSide, timeout: float,
                               env: dict[str, str]) -> None:
        """`vllm-rs serve` owns HELLO / INIT / READY; the engines answer it (see
        vllm_rs_handshake.py)."""
        self._ipc = PrivateIpcDir(prefix="cw-rs-")
        # Held (not merely free) until stop: see ReservedTcpPort for the race this closes.
        for _ in range(2):  # one at a time: stop() releases what was reserved if one fails
            self._reserved.append(ReservedTcpPort(HOST))
        handshake_port, self.port = (reserved.port for reserved in self._reserved)
        cmd = hs.serve_command(str(_binary(self.version)), model_dir(),
                               hs.write_stand_in(self._ipc.path), handshake_port, self.port,
                               len(group.engines), max(1, math.floor(timeout - 0.5)))
        self._spawn(cmd, env, [])
        group.start_handshake(f"tcp://{HOST}:{handshake_port}", local=False, headless=True,
                              timeout=timeout)

    def _spawn(self, cmd: list[str], env: dict[str, str], fds: list[int]) -> None:
        """Any ipc path or temp file the process tree makes goes into the private dir,
        removed at stop: `vllm-rs serve` binds `{base}/vllm-rs-i-<hex>` (the binary reads
        VLLM_RPC_BASE_PATH, as vLLM's Python does for `ipc://{base}/{uuid4}`)."""
        assert self._ipc is not None
        env = {**env, "VLLM_RPC_BASE_PATH": self._ipc.path, "TMPDIR": self._ipc.path}
        self.log_path = os.path.join(self._ipc.path, "vllm-rs.log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, pass_fds=fds, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, env=env)
        _LIVE.add(self.proc)

    def _close_listeners(self) -> None:
        for sock in self._listeners:
            sock.close()
        self._listeners = []

    async def wait_serving(self, deadline: float, probe: Probe) -> None:
        """Until GET /v1/models answers 200; the process exiting or the bound passing fails."""
        last = "no answer"
        while True:
            proc = self.proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                tail = self.log_tail(STARTUP_LOG_LINES)
                errors = [ln for ln in tail.splitlines() if "ERROR" in ln or "rror:" in ln]
                headline = errors[-1].strip() if errors else "(no error line logged)"
                raise StartupError(f"vllm-rs exited with {code} before serving: {headline}\n"
                                   f"{tail}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StartupError(f"vllm-rs did not serve {PROBE_PATH} within the bound "
                                   f"({last}):\n{self.log_tail(STARTUP_LOG_LINES)}")
            try:
                status, body = await asyncio.wait_for(probe("GET", PROBE_PATH),
                                                      min(remaining, 0.5))
                if status == 200:
                    return
                last = f"HTTP {status}: {body[:200]!r}"
            except (asyncio.TimeoutError, *CONNECTION_ERRORS) as exc:
                last = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.05)

    def log_tail(self, lines: int) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                tail = deque(fh, maxlen=lines)
        except OSError:
            return ""
        return _ANSI.sub("", b"".join(tail).decode("utf-8", "replace")).rstrip()

    def diagnostics(self) -> str:
        return self.log_tail(DIAGNOSTIC_LOG_LINES) if self.log_path else self._saved_log

    async def stop(self) -> None:
        """End the process (bounded), release listeners, the Control channel and the
        directory; the log tail stays readable through `diagnostics`."""
        proc, self.proc = self.proc, None
        if proc is not None:
            await _terminate(proc)
            _LIVE.discard(proc)
        self._close_listeners()
        for reserved in self._reserved:
            reserved.release()
        self._reserved = []
        if self.control is not None:
            self.control.close()
            self.control = None
        if self._ipc is not None:
            self._saved_log = self.log_tail(DIAGNOSTIC_LOG_LINES)
            self._ipc.cleanup()
            self._ipc = None
            self.log_path = None
        self.port = None


async def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, wait up to TERM_GRACE, SIGKILL, reap: never leaves the process behind."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.to_thread(proc.wait, TERM_GRACE)


__all__ = ["DIAGNOSTIC_LOG_LINES", "RsProcess", "model_dir"]
