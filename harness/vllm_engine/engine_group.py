"""`VllmCoreGroup`: vLLM's real engine core behind the `EngineGroup` interface.

Where the mock engines say what we believe vLLM 0.33.0 says, this group runs what vLLM
says: its real `EngineCoreProc` (scheduler, KV cache manager, socket threads, utilities,
abort handling), launched by this process's engine server (engine_server.py: one child
process per mode that imports vLLM once; server_process.py: that child). The model
underneath is chosen by mode:

* "cpu-stub": `StubExecutor` (arithmetic tokens, no weights), so it runs anywhere;
* "gpu": vLLM's real executor with the real model named by COREWIRE_GPU_MODEL; without a
  CUDA device it raises `EngineUnavailable` and is never faked.

Between the frontend under test and the engine sits a `RecordingProxy`, whose transcript is
`group.transcript`: the same queries cases run against mock engines apply unchanged. A
cpu-stub engine starts in about a second once its server has imported vLLM.

Only DP=1 is supported: a real DP>1 deployment needs vLLM's own DP coordinator, whose
address is known only after launch, while drivers read `stats_address` before it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from harness.protocol.wire import WireCodec
from harness.vllm_engine.engine_server import (
    SERVER_START_TIMEOUT,
    EngineServer,
    Launch,
    Mode,
    VllmCoreError,
    check_available,
    engine_server,
    kill_pids,
)
from harness.vllm_engine.proxy import RecordingProxy
from mock_engines.transcript import MergedTranscript, Record, Transcript


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
        kill_pids([pid])


class VllmCoreGroup:
    """The real vLLM engine core (DP=1) behind a recording proxy, as an engine group."""

    # What drivers read of any engine group (see mock_engines.group.EngineGroup): the real
    # engine is always bootstrapped, with no frontend-owned handshake or coordinator.
    handshake = False
    coordinated = False

    def __init__(self, engines: int = 1, *, mode: Mode = "cpu-stub",
                 step_delay_s: float = 0.0, log_stats: bool = True,
                 engine_args: dict[str, Any] | None = None,
                 codec: WireCodec) -> None:
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
        self._launch: Launch | None = None
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


__all__ = ["VllmCoreEngine", "VllmCoreGroup"]
