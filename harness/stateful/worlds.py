"""The two worlds the machine drives one frontend core in: in memory, or on real sockets.

* `SansIOWorld` (transport "sansio", the default): `ReferenceFrontendCore` and
  `MockEngineCore`s wired in memory. Every frame still goes through the real codec and
  both real state machines; the harness plays the sockets, so delivery itself is a rule
  (which engine's frames arrive next, when the drain pass runs, when virtual time
  advances) and hypothesis explores races deterministically. What the frontend does with
  each message, each utility call and each drain pass comes from harness/frontends/
  core_io.py, the module the real frontend's loop is meant to share (see its status).
* `SocketWorld` (transport "sockets"): `ReferenceFrontend` + `EngineGroup` on real ZMQ
  sockets, one asyncio loop per example; interleavings come from real timing and every
  wait is bounded.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from harness.frontends.api import StartupError, StreamHandle
from harness.frontends.reference.core import ReferenceFrontendCore, ToEngine
from harness.frontends.reference.frontend import CoreFactory
from harness.frontends.reference.waiters import (
    SyncWaiter,
    UtilityWaiters,
    drain_pass,
    no_reply,
    take_output,
)
from harness.protocol.timing import DEFAULT, Timescale
from harness.protocol.transport.sockets import engine_identity
from harness.stateful.engine_view import aborts_of, errors_of, merged_records
from harness.stateful.model import WireModel
from harness.stateful.probe import probe_core
from harness.stateful.socket_world import SocketWorld
from mock_engines.engine import ALL_CLIENTS, MockEngineCore
from mock_engines.script import EngineScript
from mock_engines.transcript import Record

TRANSPORTS: tuple[str, ...] = ("sansio", "sockets")
SETTLE_ROUNDS = 2000  # sans-IO: delivery rounds before "does not quiesce" is a hang
PUMP_ROUNDS = 200  # sans-IO: rounds a utility call may take before the transport's timeout


class World(Protocol):
    """The transport the machine drives: in-memory (sans-IO) or real sockets."""

    sans_io: bool
    core: ReferenceFrontendCore

    def generate(self, prompt: list[int], dp_rank: int | None,
                 stop: list[str] | None) -> StreamHandle: ...
    def drop(self, request_ids: list[str]) -> None: ...
    def abort(self, request_ids: list[str]) -> None: ...
    def utility(self, method: str) -> bool: ...
    def script(self, rank: int) -> EngineScript: ...
    def on_engine(self, rank: int, action: Callable[[MockEngineCore, float], None]) -> None: ...
    def settle(self) -> bool: ...
    def received_aborts(self) -> list[tuple[int, list[str]]]: ...
    def protocol_errors(self) -> list[tuple[int, str]]: ...
    def records(self) -> list[Record]: ...
    def close(self) -> None: ...


def make_world(transport: str, ranks: Sequence[int], core_factory: CoreFactory,
               model: WireModel, scripts: Sequence[EngineScript],
               timescale: Timescale = DEFAULT) -> World:
    """The world of one transport name (see TRANSPORTS); `timescale` scales the socket
    world's bounds (the in-memory world waits on nothing)."""
    if transport == "sansio":
        return SansIOWorld(ranks, core_factory, model, scripts)
    if transport == "sockets":
        return SocketWorld(ranks, core_factory, model, scripts, timescale)
    raise ValueError(f"unknown transport {transport!r}; known: {TRANSPORTS}")


def utility_args(method: str) -> list[Any]:
    """The arguments the machine's two utilities are called with."""
    return [False, False] if method == "reset_prefix_cache" else []


class SansIOWorld:
    """Frontend core and engine cores wired in memory; the machine decides every delivery.

    Per-engine FIFO order is kept in both directions (one ZMQ connection each way), the
    order across engines is the machine's choice.
    """

    sans_io = True

    def __init__(self, ranks: Sequence[int], core_factory: CoreFactory, model: WireModel,
                 scripts: Sequence[EngineScript]) -> None:
        self.now = 0.0
        self.ranks = list(ranks)
        self.engines = {r: MockEngineCore(r, s, codec=model.codec, dp_size=len(self.ranks))
                        for r, s in zip(self.ranks, scripts, strict=True)}
        self.core = probe_core(core_factory(self.ranks, codec=model.codec), model)
        self._by_identity = {engine_identity(r): r for r in self.ranks}
        self.to_engine: dict[int, collections.deque[list[bytes]]] = {
            r: collections.deque() for r in self.ranks}
        self.to_frontend: dict[int, collections.deque[list[bytes]]] = {
            r: collections.deque() for r in self.ranks}
        self.drop_signal = False
        self.waiters: UtilityWaiters[SyncWaiter] = UtilityWaiters()
        for rank, engine in self.engines.items():
            payload = engine.ready_payload()
            engine.record_ready(self.now, payload)
            self.core.on_ready(engine_identity(rank), payload)
        if not self.core.registered:
            raise StartupError("frontend core did not register every engine")

    # ------------------------------------------------------------ plumbing

    def _send(self, sends: Sequence[ToEngine]) -> None:
        for identity, frames in sends:
            rank = self._by_identity.get(bytes(identity))
            if rank is not None:  # a ROUTER drops frames for unknown identities
                self.to_engine[rank].append(list(frames))

    def _to_core(self, frames: list[bytes]) -> None:
        if take_output(self.core, frames, self.waiters):
            self.drop_signal = True
        if self.core.dead is not None:
            self.waiters.fail_all(self.core.dead)

    def _poll(self, rank: int) -> bool:
        outs = self.engines[rank].poll(self.now)
        for out in outs:
            if out.client_index in (0, ALL_CLIENTS):
                self.to_frontend[rank].append(out.frames)
        return bool(outs)

    def deliver_inputs(self, rank: int, count: int) -> None:
        queue = self.to_engine[rank]
        for _ in range(min(count, len(queue))):
            self.engines[rank].receive(queue.popleft(), self.now)

    def deliver_outputs(self, rank: int, count: int) -> None:
        queue = self.to_frontend[rank]
        for _ in range(min(count, len(queue))):
            self._to_core(queue.popleft())

    def tick(self, seconds: float) -> None:
        self.now += seconds
        for rank in self.ranks:
            self._poll(rank)

    def drain(self) -> None:
        """One pass of the frontend's abort drain loop, if it has been signalled."""
        if not self.drop_signal:
            return
        sends, self.drop_signal = drain_pass(self.core)
        self._send(sends)

    def _round(self) -> bool:
        moved = self.drop_signal
        self.drain()
        for rank in self.ranks:
            moved = moved or bool(self.to_engine[rank])
            self.deliver_inputs(rank, len(self.to_engine[rank]))
        for rank in self.ranks:
            moved = self._poll(rank) or moved
        for rank in self.ranks:
            moved = moved or bool(self.to_frontend[rank])
            self.deliver_outputs(rank, len(self.to_frontend[rank]))
        return moved

    # ------------------------------------------------------------ World

    def generate(self, prompt: list[int], dp_rank: int | None,
                 stop: list[str] | None) -> StreamHandle:
        handle, send = self.core.add_request(prompt, 8, data_parallel_rank=dp_rank, stop=stop)
        self._send([send])
        return handle

    def drop(self, request_ids: list[str]) -> None:
        self.core.queue_drop(request_ids)
        self.drop_signal = True

    def abort(self, request_ids: list[str]) -> None:
        self._send(self.core.abort(request_ids))

    def utility(self, method: str) -> bool:
        values = self._call_all(method, utility_args(method))
        if method == "is_sleeping":
            return self.core.aggregate_is_sleeping(values)
        return self.core.aggregate_reset_prefix_cache(values)

    def _call_all(self, method: str, args: list[Any]) -> list[Any]:
        """`ReferenceFrontend.call_all` with delivery rounds for the event loop."""
        waiter = SyncWaiter()
        with self.waiters.call(self.core, method, args, waiter) as (call, sends):
            self._send(sends)
            for _ in range(PUMP_ROUNDS):
                if waiter.done() or not self._round():
                    break
            if waiter.exception is not None:
                raise waiter.exception
            if not waiter.done():
                raise no_reply(call, "(the transport's timeout)")
        return self.core.utility_values(call)

    def script(self, rank: int) -> EngineScript:
        return self.engines[rank].script

    def on_engine(self, rank: int, action: Callable[[MockEngineCore, float], None]) -> None:
        action(self.engines[rank], self.now)

    def settle(self) -> bool:
        """Deliver, drain and advance virtual time until nothing is left to happen."""
        for _ in range(SETTLE_ROUNDS):
            if self._round():
                continue
            deadlines = [d for e in self.engines.values()
                         if (d := e.next_deadline()) is not None and d != math.inf]
            if not deadlines:
                return True
            self.now = max(self.now, min(deadlines))
        return False

    def received_aborts(self) -> list[tuple[int, list[str]]]:
        return aborts_of(list(self.engines.values()))

    def protocol_errors(self) -> list[tuple[int, str]]:
        return errors_of(list(self.engines.values()))

    def records(self) -> list[Record]:
        return merged_records(list(self.engines.values()))

    def close(self) -> None:
        pass
