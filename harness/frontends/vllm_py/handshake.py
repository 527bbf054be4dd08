"""vLLM 0.33.0's AsyncLLM as the owner of the HELLO / INIT / READY handshake.

AsyncLLM owns the handshake when it is built *without* `client_addresses`: `MPClient` binds
its input ROUTER / output PULL itself and enters `launch_core_engines` (core_client.py:
699-714), which binds the handshake ROUTER and runs `wait_for_engine_startup`
(v1/engine/utils.py:1403-1580: HELLO -> INIT :1517, READY :1552) before the client waits for
the engines' ready frames on its input socket (core_client.py:757-775). The supported way to
make it wait for engines it does not spawn is the multi-node layout: `--data-parallel-size N
--data-parallel-size-local 0` on the frontend and `--headless` engines elsewhere. Then no
engine process is started (`local_engine_count == 0`), every rank is a remote engine that
must say `local=False, headless=True` (utils.py:1419-1422, :1494-1518), the handshake socket is
`tcp://<data_parallel_master_ip>:<data_parallel_rpc_port>` (utils.py:1343-1352) and the
input/output sockets are loopback TCP (`get_engine_zmq_bind_addresses`, utils.py:1120-1160).
The mock engines play the headless engines. For DP > 1 vLLM also starts its real DP
coordinator process (utils.py:1265-1279) and names it in INIT; the mock engines subscribe
to it (coordinated cases serve a MoE config, `moe_model_dir`, so it coordinates waves).
AsyncLLM.shutdown() stops it.

How the coordinator process starts is deployment, not protocol, and the harness must choose
it: vLLM forks it (`get_mp_context()`, coordinator.py:99, fork unless spawn is forced) from
the process that builds AsyncLLM. Under `vllm serve` that is the API server before it serves;
here it is the harness process, which at that moment runs mock-engine, ZMQ and other cases'
threads. A fork copies every lock in the state another thread left it, so a child that then
takes one (vLLM's `configure_logging` flushes the log handlers' streams, coordinator.py:181)
waits for ever on a lock whose owner does not exist in it; the coordinator never reports its
addresses (`_wait_for_zmq_addrs` waits 120 s, coordinator.py:56-66), AsyncLLM sends no INIT
and the case ends in TIMEOUT (tests/vllm_lane/test_vllm_py_handshake.py reproduces it by
holding the log stream's lock at the fork). So the coordinator starts from a fork server instead
(`coordinator_context`, vllm_py_forkserver.py): a single-threaded process made once, when the
driver is built (outside any case's bound), forked from the worker before any case thread
runs, with vLLM already imported; each coordinator is a fork of that clean process, in
milliseconds, running vLLM's own `run_coordinator`. Spawning it (the CPU platform's default)
would re-import vLLM, about 10 s a case.

The handshake port is reserved (`ReservedTcpPort`), not merely free: between picking a free
port and AsyncLLM binding it, any port-0 bind in any process (another worker's frontend or DP
coordinator) could be handed it, and the engines' HELLO went to that stranger (a HELLO with
no INIT, the `handshake.init.coordinator_addresses_2_engines[vllm-py]` TIMEOUT that recurred
after the fork-server change; tests/test_reserved_port.py).

`wait_for_engine_startup` has no bound: it polls the handshake socket every 10 s for ever
(utils.py:1439-1452); `VLLM_ENGINE_READY_TIMEOUT_S` only bounds the later ready-frame wait.
So the constructor runs on its own thread, and the driver waits for it up to the startup
bound plus a grace. A construction still blocked then is the frontend's behaviour (it would
wait for good): the driver aborts it and raises `StartupHang`, which cases grade by their
level. The abort uses vLLM's own hook: `CoreEngineLaunch.watched_frontend_processes`
(utils.py:1202, what `vllm serve` sets to its API server processes, serve.py:382) are polled
by `wait_for_engine_startup` with the handshake socket; one whose sentinel becomes readable
ends startup with "Frontend process failed during engine core initialization"
(utils.py:1431-1474). The driver registers a pipe there; writing to it unblocks the
constructor, whose finaliser closes every socket and stops the coordinator.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import copy
import gc
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from harness.artefacts.vllm_dist import tiny_model_dir
from harness.frontends.api import StartupError, StartupHang
from harness.frontends.vllm_py.forkserver import coordinator_context
from harness.protocol.timing import Timescale
from harness.protocol.transport.endpoints import ReservedTcpPort

if TYPE_CHECKING:
    from harness.frontends.api import EngineSide

STARTUP_GRACE = 2.0  # seconds past the startup bound before a blocked start is a hang
ABORT_JOIN_TIMEOUT = 10.0  # for the aborted constructor to unwind (coordinator included)
LOCK_TIMEOUT = 5.0  # a previous construction still holding the patched launcher
POLL_INTERVAL = 0.005  # the loop polls the constructor thread's outcome
HOST = "127.0.0.1"

_CONFIGS: dict[tuple[int, bool], Any] = {}  # (dp size, MoE) -> pristine handshake config
_CONFIG_LOCK = threading.Lock()
# One construction at a time per process: it swaps module globals of vLLM's core_client and
# coordinator for its duration.
_CONSTRUCT_LOCK = threading.Lock()
# A MoE variant of fixtures/tiny-model's config: vLLM runs DP wave coordination only for MoE
# models (utils.py:1265-1270 `enable_wave_coordination=is_moe`). No weights are loaded: the
# frontend reads config and tokenizer only.
MOE_CONFIG = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
              "num_local_experts": 4, "num_experts_per_tok": 2}
_MOE_DIR: list[str] = []


def moe_model_dir() -> str:
    """A per-process copy of the tiny model whose config is MoE (made once, under the lock)."""
    if not _MOE_DIR:
        path = tempfile.mkdtemp(prefix="cw-moe-model-")
        source = tiny_model_dir()
        for item in source.iterdir():
            if item.is_file():
                shutil.copy(item, path)
        with open(source / "config.json") as fh:
            config = json.load(fh)
        with open(os.path.join(path, "config.json"), "w") as fh:
            json.dump({**config, **MOE_CONFIG}, fh)
        _MOE_DIR.append(path)
        # Once per process, for every case of the run: removed when the process exits.
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return _MOE_DIR[0]


def handshake_config(engine_args: Any, dp_size: int, port: int, moe: bool = False) -> Any:
    """A private VllmConfig for a frontend owning the handshake of `dp_size` remote
    headless engines (`--data-parallel-size-local 0`) at tcp://127.0.0.1:`port`; `moe`
    serves a MoE config, so its DP coordinator coordinates waves."""
    with _CONFIG_LOCK:
        base = _CONFIGS.get((dp_size, moe))
        if base is None:
            model = moe_model_dir() if moe else str(tiny_model_dir())
            args = engine_args(model=model, skip_tokenizer_init=False,
                               data_parallel_size=dp_size, data_parallel_size_local=0,
                               data_parallel_address=HOST, data_parallel_rpc_port=port)
            base = _CONFIGS[(dp_size, moe)] = args.create_engine_config()
    config = copy.deepcopy(base)
    config.parallel_config.data_parallel_rpc_port = port
    return config


class _StartupCanceller:
    """Looks like a watched frontend process to wait_for_engine_startup: a pipe whose read
    end is its sentinel; `fire()` makes it readable, which aborts the startup wait."""

    name = "corewire-startup-bound"
    exitcode: int | None = None  # read by vLLM's error message only

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        self.sentinel = self._read
        self.fired = False

    def fire(self) -> None:
        if not self.fired:
            self.fired = True
            with contextlib.suppress(OSError):
                os.write(self._write, b"x")

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


class HandshakeStartup:
    """One AsyncLLM construction in handshake mode, on its own thread, abortable."""

    def __init__(self, vllm: Any, config: Any, ready_timeout: float,
                 timescale: Timescale, port: ReservedTcpPort) -> None:
        self._vllm = vllm  # harness.frontends.vllm_py.loader._Vllm
        self._port = port  # held until the constructor has bound (or failed to bind) it
        self._timescale = timescale
        self._config = config
        self._ready_timeout = ready_timeout
        self._canceller = _StartupCanceller()
        # The thread's outcome: the AsyncLLM (handed over once, never kept here) or why not.
        self._done = threading.Event()
        self._llm: Any = None
        self._failure: StartupError | None = None
        self._thread = threading.Thread(target=self._run, name="vllm-py-handshake-startup",
                                        daemon=True)
        self._closed = False

    def begin(self) -> None:
        self._thread.start()

    @contextlib.contextmanager
    def _patched(self) -> Iterator[None]:
        """Register the canceller with launch_core_engines, bound the ready-frame wait, start
        the DP coordinator from the fork server; everything restored afterwards."""
        module = self._vllm.core_client
        original = module.launch_core_engines
        canceller = self._canceller

        @contextlib.contextmanager
        def launch_watched(*args: Any, **kwargs: Any) -> Iterator[Any]:
            with original(*args, **kwargs) as launch:
                launch.watched_frontend_processes = (*launch.watched_frontend_processes,
                                                     canceller)
                yield launch

        coordinator = self._vllm.coordinator
        saved_knob = module.VLLM_ENGINE_READY_TIMEOUT_S
        saved_context = coordinator.get_mp_context
        module.launch_core_engines = launch_watched
        module.VLLM_ENGINE_READY_TIMEOUT_S = self._ready_timeout
        coordinator.get_mp_context = coordinator_context
        try:
            yield
        finally:
            module.launch_core_engines = original
            module.VLLM_ENGINE_READY_TIMEOUT_S = saved_knob
            coordinator.get_mp_context = saved_context

    def _run(self) -> None:
        if not _CONSTRUCT_LOCK.acquire(timeout=self._timescale.scaled(LOCK_TIMEOUT)):
            self._failure = StartupError(
                "a previous AsyncLLM handshake-mode startup is still running in this process")
            self._done.set()
            return
        failure: str | None = None
        try:
            with self._patched():
                llm = self._vllm.async_llm(self._config, executor_class=None,
                                           log_stats=False, log_requests=False)
        except Exception as exc:
            failure = _describe(exc)
            del exc  # its traceback holds the half-built client; let the GC have it
        finally:
            self._port.release()
            _CONSTRUCT_LOCK.release()
        if failure is not None:
            # The half-built client closed its sockets and stopped its coordinator; collecting
            # it now terminates its ZMQ context (and runs AsyncLLM.__del__) instead of leaving
            # that to a later GC pass or interpreter exit. A full pass (~0.3 s, failures
            # only): after a long wait the half-built AsyncLLM is in the oldest generation.
            gc.collect()
            self._failure = StartupError(f"AsyncLLM did not start: {failure}")
        else:
            self._llm = llm
        self._done.set()

    async def result(self, bound: float) -> Any:
        """The AsyncLLM; StartupError when vLLM refused to start, StartupHang when it was
        still waiting `bound` + grace seconds after begin()."""
        waited = bound + self._timescale.scaled(STARTUP_GRACE)
        give_up = time.monotonic() + waited
        while not self._done.is_set() and time.monotonic() < give_up:
            await asyncio.sleep(POLL_INTERVAL)
        if self._done.is_set():
            if self._failure is not None:
                raise self._failure
            return self.orphan()
        problem = await self.close()
        raise StartupHang(
            f"AsyncLLM's startup neither served nor failed within {waited:.1f}s (startup "
            f"bound {bound:.1f}s): wait_for_engine_startup polls the handshake socket with no "
            f"timeout (v1/engine/utils.py:1439-1452); the driver aborted it"
            + (f" ({problem})" if problem else ""))

    async def close(self) -> str | None:
        """Abort a construction still running and reap its thread (bounded); a problem
        text if it did not unwind. An AsyncLLM built meanwhile is handed to `orphan`."""
        if self._closed:
            return None
        self._closed = True
        self._canceller.fire()
        if not self._thread.is_alive():
            self._port.release()  # never begun, or already done
        began = time.monotonic()
        limit = self._timescale.scaled(ABORT_JOIN_TIMEOUT)
        while self._thread.is_alive() and time.monotonic() - began < limit:
            await asyncio.sleep(0.01)
        if self._thread.is_alive():
            return (f"the aborted AsyncLLM constructor did not unwind within {limit:.0f}s "
                    f"(its canceller pipe is left open)")
        self._canceller.close()
        return None

    def blocked_at(self) -> str:
        """The innermost frames of the constructor thread while it runs (evidence for a
        startup that neither serves nor fails), '' once it has finished."""
        ident = self._thread.ident
        frame = sys._current_frames().get(ident) if ident is not None else None
        if frame is None or not self._thread.is_alive():
            return ""
        return "".join(traceback.format_stack(frame)[-8:]).rstrip()

    def orphan(self) -> Any:
        """The AsyncLLM built (or None), handed over once: also one that finished building
        after the driver gave up on it, which the driver still must shut down."""
        llm, self._llm = self._llm, None
        return llm


async def start_owner(vllm: Any, group: EngineSide, timeout: float,
                      timescale: Timescale) -> HandshakeStartup:
    """Begin building AsyncLLM as the handshake owner and point the engines at it."""
    # Held until AsyncLLM binds it: a port merely free now could meanwhile go to any port-0
    # bind (the DP coordinator's own sockets, another worker's frontend), and the engines
    # would say HELLO to a stranger (the handshake TIMEOUT flake, see ReservedTcpPort).
    reservation = ReservedTcpPort(HOST)
    port = reservation.port
    dp_size = len(group.engines)
    try:
        # On the loop, like the driver's other configs: ~0.15 s the first time per DP size, a
        # deep copy after (an executor thread would outlive the case).
        config = handshake_config(vllm.engine_args, dp_size, port, moe=group.coordinated)
    except Exception as exc:
        reservation.release()
        raise StartupError(f"could not build vLLM's handshake-mode config for {dp_size} "
                           f"engine(s): {_describe(exc)}") from exc
    if group.coordinated:  # engines started with the same config report its hash (MoE DP)
        from mock_engines.group import EngineGroup
        if not isinstance(group, EngineGroup):
            reservation.release()
            raise StartupError("a frontend-owned DP coordinator is only scripted with mock "
                               f"engines, not {type(group).__name__}")
        config_hash = config.parallel_config.compute_hash()
        for engine in group.engines:
            engine.script.parallel_config_hash = config_hash
    startup = HandshakeStartup(vllm, config, max(0.05, timeout), timescale, reservation)
    startup.begin()
    # Remote headless engines (the only kind a frontend with no local engines accepts in
    # internal-LB mode, utils.py:1419-1422, :1503-1518); they retry until the handshake
    # socket is bound.
    group.start_handshake(f"tcp://{HOST}:{port}", local=False, headless=True,
                          timeout=timeout)
    return startup


def start_output_tasks(llm: Any) -> None:
    """What AsyncLLM and its client start eagerly when built on the event loop
    (async_llm.py:218-224, core_client.py:1183-1191, :1512-1519); built on a thread, start
    them now, on the loop, so no engine output waits for the first request."""
    client = llm.engine_core
    for starter in (getattr(llm, "_run_output_handler", None),
                    getattr(client, "_ensure_output_queue_task", None),
                    getattr(client, "_ensure_stats_update_task", None)):
        if callable(starter):
            starter()
