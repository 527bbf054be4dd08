"""The real-transport world: `ReferenceFrontend` + `EngineGroup` on ZMQ, one loop per example.

The same machine and model as the in-memory world, but interleavings come from real
timing. The loop runs only inside each bounded call, so between steps the model and the
handles are read from a quiet frontend while the engine threads keep going.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from harness.frontends.api import StreamHandle
from harness.frontends.reference.frontend import CoreFactory, ReferenceFrontend
from harness.protocol.timing import DEFAULT, Timescale
from harness.protocol.transport.endpoints import PrivateIpcDir
from harness.stateful.engine_view import aborts_of, errors_of, merged_records
from harness.stateful.invariants import InvariantViolation
from harness.stateful.model import WireModel
from harness.stateful.probe import probe_core
from mock_engines.engine import MockEngineCore
from mock_engines.group import EngineGroup
from mock_engines.script import EngineScript
from mock_engines.transcript import Record

T = TypeVar("T")


class SocketWorld:
    """`ReferenceFrontend` + `EngineGroup` on real ZMQ sockets, one asyncio loop per example."""

    sans_io = False

    def __init__(self, ranks: Sequence[int], core_factory: CoreFactory, model: WireModel,
                 scripts: Sequence[EngineScript], timescale: Timescale = DEFAULT) -> None:
        self.ranks = list(ranks)
        self.model = model
        self.timescale = timescale
        self.call_timeout = self.timescale.scaled(5.0)
        self.loop = asyncio.new_event_loop()
        try:
            self.frontend = ReferenceFrontend(
                self.ranks, codec=model.codec,
                core_factory=lambda rs, *, codec: probe_core(core_factory(rs, codec=codec),
                                                             model),
                utility_timeout=timescale.scaled(2.0), timescale=timescale)
        except BaseException:
            self.loop.close()
            raise
        self.core = self.frontend.core
        self.group = EngineGroup(list(scripts), codec=model.codec)
        self.ipc = PrivateIpcDir()
        inputs, outputs = self.ipc.address("in"), self.ipc.address("out")
        try:
            self.frontend.bind(inputs, outputs)
            self.group.start_bootstrapped([inputs], [outputs])
            self._run(self.frontend.wait_ready(timescale.scaled(10.0)), timescale.scaled(12.0),
                      "startup")
        except BaseException:
            self.close()
            raise

    def _run(self, coro: Awaitable[T], timeout: float, what: str) -> T:
        try:
            return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))
        except asyncio.TimeoutError:
            raise InvariantViolation("no_call_hangs", f"{what} did not return within "
                                     f"{timeout:.1f}s") from None

    def _spin(self) -> None:
        """Let the frontend's tasks (reader, drain loop) run briefly."""
        self._run(asyncio.sleep(0.002), self.call_timeout, "spin")

    def generate(self, prompt: list[int], dp_rank: int | None,
                 stop: list[str] | None) -> StreamHandle:
        handle = self._run(self.frontend.generate(prompt, 8, data_parallel_rank=dp_rank,
                                                  stop=stop),
                           self.call_timeout, "generate")
        self._spin()
        return handle

    def drop(self, request_ids: list[str]) -> None:
        self.frontend.drop_requests(request_ids)
        self._spin()

    def abort(self, request_ids: list[str]) -> None:
        self._run(self.frontend.abort(request_ids), self.call_timeout, "abort")
        self._spin()

    def utility(self, method: str) -> bool:
        call = (self.frontend.is_sleeping() if method == "is_sleeping"
                else self.frontend.reset_prefix_cache())
        return self._run(call, self.call_timeout, method)

    def script(self, rank: int) -> EngineScript:
        return self.group.engines[self.ranks.index(rank)].script

    def on_engine(self, rank: int, action: Callable[[MockEngineCore, float], None]) -> None:
        """Run `action` on the engine's own thread and wait (bounded) until it ran."""
        engine = self.group.engines[self.ranks.index(rank)]
        runner = engine.runner
        assert runner is not None
        done = threading.Event()

        def command() -> None:
            try:
                action(engine.core, time.monotonic())
            finally:
                done.set()

        runner.call(command)
        if not done.wait(self.call_timeout):
            raise InvariantViolation("no_call_hangs", f"engine {rank} did not run a command "
                                     f"within {self.call_timeout:.1f}s")

    def _counts(self) -> tuple[int, int]:
        inputs = outputs = 0
        for engine in self.group.engines:
            for r in engine.transcript.snapshot():
                if r.channel == "input":
                    inputs += 1
                elif r.channel == "output" and r.direction == "out":
                    outputs += 1
        return inputs, outputs

    async def _quiesce(self, bound: float) -> bool:
        deadline = time.monotonic() + bound
        last: tuple[int, ...] | None = None
        stable = 0
        while time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            inputs, outputs = self._counts()
            snapshot = (inputs, outputs, self.model.sent_frames, self.model.delivered)
            quiet = (inputs == self.model.sent_frames and outputs == self.model.delivered
                     and not self.core.pending_drops)
            stable = stable + 1 if quiet and snapshot == last else 0
            if stable >= 3:
                return True
            last = snapshot
        return False

    def settle(self) -> bool:
        bound = self.timescale.scaled(5.0)
        return self._run(self._quiesce(bound), bound + 1.0, "settle")

    def _cores(self) -> list[MockEngineCore]:
        return [e.core for e in self.group.engines]

    def received_aborts(self) -> list[tuple[int, list[str]]]:
        return aborts_of(self._cores())

    def protocol_errors(self) -> list[tuple[int, str]]:
        return errors_of(self._cores())

    def records(self) -> list[Record]:
        return merged_records(self._cores())

    def close(self) -> None:
        """Frontend first (so engine exits are not deaths), then engines, ipc, loop."""
        try:
            if not self.loop.is_closed():
                with contextlib.suppress(asyncio.TimeoutError):
                    self.loop.run_until_complete(
                        asyncio.wait_for(self.frontend.close(), self.timescale.scaled(5.0)))
        finally:
            try:
                self.group.stop(self.timescale.scaled(5.0))
            finally:
                self.ipc.cleanup()
                if not self.loop.is_closed():
                    self.loop.close()
