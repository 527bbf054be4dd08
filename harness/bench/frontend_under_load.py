"""One frontend under test behind load-mode mock engines, with the meters a scenario reads.

`BenchFrontend` starts a driver against an `EngineGroup` whose engines run in load mode
(mock_engines/loadgen.py) with counters-only transcripts, and gives a scenario:

* `EngineMeter`: the time each engine thread was running or waiting for a core over a
  window / the window's wall time, from /proc (the engines' own utilisation: the refusal
  rule reads the busiest engine);
* `FrontendCpu`: CPU seconds of the frontend's process tree where it is a separate process,
  else of this process minus the engine threads (the frontend and the bench client together).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from harness.bench.proc import self_cpu, thread_cpu, thread_runnable, tree_cpu
from harness.frontends.api import FrontendDriver, StreamHandle
from harness.frontends.run_config import RunConfig
from harness.frontends.table import make_driver
from harness.protocol.timing import DEFAULT, Timescale
from harness.protocol.transport.endpoints import PrivateIpcDir
from harness.protocol.wire import codec_for
from mock_engines import EngineGroup, EngineScript
from mock_engines.loadgen import LoadMode, LoadStats

PROMPT = (1, 2, 3, 4)


@dataclass
class BenchOptions:
    """Every size and window of a run (`quick()` for development and the smoke test)."""

    concurrency: tuple[int, ...] = (1, 16, 256, 1024)
    tokens_per_request: int = 256
    warmup_s: float = 1.0
    window_s: float = 3.0
    repeat: int = 3  # throughput windows per level (best kept, all recorded)
    latency_streams: int = 16
    latency_step_interval_s: float = 0.005
    ttft_requests: int = 100
    utility_calls: int = 200
    utility_engines: tuple[int, ...] = (1, 4)
    abort_streams: int = 1000
    abort_step_interval_s: float = 0.05
    startup_runs: int = 3
    startup_timeout_s: float = 120.0
    stream_timeout_s: float = 60.0
    # Busy work per engine step (seconds): a deliberately slow engine, so that the refusal
    # rule can be seen firing (the smoke test); 0 in every real run.
    engine_step_cost_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    timescale: Timescale = DEFAULT  # the drivers' bounds (`corewire bench`: $COREWIRE_TIMESCALE)

    @classmethod
    def quick(cls) -> BenchOptions:
        return cls(concurrency=(1, 16, 64), tokens_per_request=32, warmup_s=0.3,
                   window_s=1.0, repeat=1, latency_streams=4, ttft_requests=20, utility_calls=30,
                   abort_streams=200, startup_runs=1)


def frontend_pid(driver: FrontendDriver) -> int | None:
    """The pid of a driver's frontend process, where it runs one (vllm-rs, subprocess)."""
    for attr in ("proc", "_proc"):
        proc = getattr(driver, attr, None)
        pid = getattr(proc, "pid", None)
        if isinstance(pid, int):
            return pid
    return None


class EngineMeter:
    """Busy fraction of every engine thread over one window: the time the thread was
    running or runnable (waiting for a core) / wall time. Waiting in poll, on a blocked
    send or for the GIL is not busy: the engine then waits for the frontend."""

    def __init__(self, group: EngineGroup) -> None:
        self._threads = [e.runner.native_id for e in group.engines if e.runner is not None]
        self._t0 = 0.0
        self._cpu0: list[float | None] = []
        self.start()

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._cpu0 = [thread_runnable(t) for t in self._threads]

    def busy(self) -> float | None:
        """The busiest engine's fraction since `start` (None: not measurable here)."""
        wall = time.monotonic() - self._t0
        if wall <= 0:
            return None
        fractions = [(now - then) / wall for then, now in
                     zip(self._cpu0, (thread_runnable(t) for t in self._threads),
                         strict=True)
                     if then is not None and now is not None]
        return round(max(fractions), 4) if fractions else None


class FrontendCpu:
    """CPU seconds spent by the frontend (see the module docstring for the scope)."""

    def __init__(self, driver: FrontendDriver, group: EngineGroup) -> None:
        self._pid = frontend_pid(driver)
        self._engine_threads = [e.runner.native_id for e in group.engines
                                if e.runner is not None]
        self.scope = ("frontend process tree" if self._pid is not None else
                      "harness process minus engine threads (frontend + bench client)")

    @property
    def separate(self) -> bool:
        """The frontend runs in its own process (its CPU is its own, the client's apart)."""
        return self._pid is not None

    def sample(self) -> float | None:
        if self._pid is not None:
            return tree_cpu(self._pid)
        return self.harness_sample()

    def harness_sample(self) -> float:
        """This process minus the engine threads: the bench client and its driver (and the
        frontend itself when it runs in-process)."""
        engines = sum(thread_cpu(t) or 0.0 for t in self._engine_threads)
        return self_cpu() - engines


class BenchFrontend:
    """`async with BenchFrontend(spec, engines, mode, options) as fe:` a served frontend."""

    def __init__(self, spec: str, engines: int, mode: LoadMode, options: BenchOptions) -> None:
        self.spec = spec
        self.options = options
        self.ipc = PrivateIpcDir()
        mode = LoadMode(step_interval=mode.step_interval, record_steps=mode.record_steps,
                        send_hwm=mode.send_hwm,
                        step_cost=mode.step_cost or options.engine_step_cost_s)
        scripts = [EngineScript(load=mode, retain_transcript=False) for _ in range(engines)]
        coordinator = self.ipc.address("dp-stats") if engines > 1 else None
        config = RunConfig(spec, timescale=options.timescale)
        self.group = EngineGroup(scripts, codec=codec_for(config.engine_profile),
                                 coordinator_address=coordinator)
        self.driver: FrontendDriver = make_driver(config)
        self.started_at = 0.0
        self.serving_at = 0.0

    async def __aenter__(self) -> BenchFrontend:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def start(self) -> None:
        self.started_at = time.monotonic()
        await self.driver.start(self.group, self.options.startup_timeout_s)
        self.serving_at = time.monotonic()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.driver.shutdown(), 60)
        with contextlib.suppress(Exception):
            self.group.stop()
        self.ipc.cleanup()

    @property
    def stats(self) -> list[LoadStats]:
        return [e.core.load.stats for e in self.group.engines if e.core.load is not None]

    def meter(self) -> EngineMeter:
        return EngineMeter(self.group)

    def frontend_cpu(self) -> FrontendCpu:
        return FrontendCpu(self.driver, self.group)

    async def generate(self, max_tokens: int) -> StreamHandle:
        return await self.driver.generate(list(PROMPT), max_tokens)

    async def drain(self, handles: list[StreamHandle]) -> int:
        """Wait (bounded) for every stream to end; drop what is still open. Returns how
        many had to be dropped."""
        open_ = [h for h in handles if not h.ended]
        deadline = time.monotonic() + self.options.stream_timeout_s
        while open_ and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            open_ = [h for h in open_ if not h.ended]
        if open_:
            with contextlib.suppress(Exception):
                await self.driver.drop(open_)
        return len(open_)
