"""The engine server process: the only place that imports vLLM.

Started by `EngineServer` (engine_server.py) as `main(["--serve", "--fd", N, "--mode", M])`,
it imports vLLM once, builds an engine config per set of engine-args overrides, and per
launch calls vLLM's own `launch_core_engines` (or, in handshake mode, its
`CoreEngineProcManager` alone), which forks (cpu-stub) the `EngineCoreProc` and runs vLLM's
real HELLO / INIT / READY handshake with it. It reports each launch's pids, readiness,
failures and unexpected exits back as JSON events, and shuts every engine down when the
harness goes away (EOF on the control socket, or a new parent).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import multiprocessing.connection as mpc
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from harness.artefacts.vllm_dist import tiny_model_dir
from harness.vllm_engine.engine_server import (
    ENV_GPU_MAX_MODEL_LEN,
    ENV_GPU_MEMORY_UTILIZATION,
    ENV_GPU_MODEL,
    MODES,
    Mode,
)


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
                from harness.vllm_engine.stub_executor import (
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


__all__ = ["main"]
