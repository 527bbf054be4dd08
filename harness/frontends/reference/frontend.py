"""The reference frontend's I/O: asyncio + pyzmq around `ReferenceFrontendCore`.

Binds the input ROUTER and output PULL like vLLM's frontends, reads one ready frame per
engine (bounded), then runs three tasks: the output reader, the abort drain loop (which
coalesces dropped streams per engine), and a socket monitor that turns a lost engine
connection into engine death instead of a silent hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, Protocol, cast

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from harness.frontends.api import GREEDY, Sampling, StartupError, StreamHandle
from harness.frontends.reference.coordinator import (
    CoordinatorError,
    Effect,
    LoadReport,
    Publish,
    WaveChanged,
)
from harness.frontends.reference.coordinator_io import CoordinatorTransport
from harness.frontends.reference.core import EngineDeadError, PendingUtility, ReferenceFrontendCore
from harness.frontends.reference.waiters import UtilityWaiters, drain_pass, no_reply, take_output
from harness.protocol.timing import DEFAULT, Timescale
from harness.protocol.transport.sockets import make_socket
from harness.protocol.wire import ProtocolError, WireCodec
from harness.protocol.wire import messages as m

SUBSCRIBE_ALL = b"\x01"  # an XSUB subscription to every topic (what a 0.33.0 coordinator
# ignores; any other message from a frontend it logs as unexpected, coordinator.py:311-354)


class CoreFactory(Protocol):
    """Builds the frontend core (the reference's, a mutant's, a probed one) for the ranks,
    speaking the codec of the profile the driver was built for."""

    def __call__(self, ranks: Sequence[int], *, codec: WireCodec) -> ReferenceFrontendCore: ...


class ReferenceFrontend:
    """One frontend client over N engines on real sockets."""

    def __init__(self, ranks: Sequence[int], *, codec: WireCodec,
                 core_factory: CoreFactory = ReferenceFrontendCore,
                 utility_timeout: float | None = None, fail_calls_on_death: bool = True,
                 first_output_deadline: float | None = None,
                 stats_address: str | None = None, timescale: Timescale = DEFAULT) -> None:
        self.core = core_factory(list(ranks), codec=codec)
        self.stats_address = stats_address  # the DP coordinator's XPUB (waves, load)
        self.utility_timeout = (timescale.scaled(3.0) if utility_timeout is None
                                else utility_timeout)
        # Both knobs exist for the mutant self-test; the defaults are the correct behaviour.
        self.fail_calls_on_death = fail_calls_on_death
        self.first_output_deadline = first_output_deadline
        self._ctx = zmq.asyncio.Context()
        self._router: zmq.asyncio.Socket | None = None
        self._pull: zmq.asyncio.Socket | None = None
        self._stats: zmq.asyncio.Socket | None = None
        self._handshake: zmq.asyncio.Socket | None = None
        self._coordinator: CoordinatorTransport | None = None
        self._addresses: tuple[list[str], list[str]] = ([], [])
        self._tasks: list[asyncio.Task[None]] = []
        self._waiters: UtilityWaiters[asyncio.Future[PendingUtility]] = UtilityWaiters()
        self._drop_signal = asyncio.Event()
        self._closed = False
        # The first background task (reader, abort drain, monitor) that died of an exception:
        # a harness fault the driver reports (the case is ERROR), never a silent TIMEOUT.
        self.task_failure: str | None = None

    # ------------------------------------------------------------------ startup

    def bind(self, input_address: str, output_address: str,
             handshake_address: str | None = None,
             coordinator: tuple[str, str] | None = None) -> None:
        """Bind input and output; with a handshake address the frontend also owns
        HELLO / INIT / READY (engines learn the input/output addresses from INIT), and with
        `coordinator` (input, output) addresses a DP coordinator that INIT names too."""
        ctx = cast("zmq.Context[zmq.Socket[bytes]]", self._ctx)
        self._addresses = ([input_address], [output_address])
        if handshake_address is not None:
            self._handshake = hs = cast(zmq.asyncio.Socket, make_socket(ctx, zmq.ROUTER))
            hs.bind(handshake_address)
            if coordinator is not None:
                core = self.core.coordinator_class(len(self.core.engines),
                                                   codec=self.core.codec)
                self._coordinator = CoordinatorTransport(core, self._ctx,
                                                         self._on_coordinator_effect,
                                                         self._on_coordinator_error)
                self._coordinator.bind(*coordinator)
                self.core.coordinator_addresses = coordinator
        self._router = router = cast(zmq.asyncio.Socket, make_socket(ctx, zmq.ROUTER))
        self._pull = pull = cast(zmq.asyncio.Socket, make_socket(ctx, zmq.PULL))
        router.bind(input_address)
        pull.bind(output_address)
        if self.stats_address is not None:  # subscribed in wait_ready, before registration
            # XSUB like vLLM's clients: the only thing it ever sends is the subscription.
            self._stats = stats = cast(zmq.asyncio.Socket, make_socket(ctx, zmq.XSUB))
            stats.connect(self.stats_address)

    async def wait_ready(self, timeout: float) -> None:
        """Read one ready frame per engine; StartupError names the engines that never came."""
        assert self._router is not None
        deadline = time.monotonic() + timeout
        if self._stats is not None:
            await self._stats.send(SUBSCRIBE_ALL)
        if self._coordinator is not None:
            self._coordinator.start()
        if self._handshake is not None:
            await self._run_handshake(deadline, timeout)
        while not self.core.registered:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self.core.registration_timeout(timeout)
            if not await self._router.poll(remaining * 1000):
                continue
            frames = await self._router.recv_multipart()
            if len(frames) != 2:
                raise StartupError(f"ready message must be [identity, payload], got "
                                   f"{len(frames)} frames")
            self.core.on_ready(frames[0], frames[1])
        self._tasks = [self._spawn(self._read_outputs()), self._spawn(self._drain_aborts()),
                       self._spawn(self._watch_disconnects())]
        if self._stats is not None:
            self._tasks.append(self._spawn(self._read_dp_stats()))

    async def _run_handshake(self, deadline: float, timeout: float) -> None:
        """HELLO -> INIT per engine, their ready frames, then READY from every engine."""
        assert self._handshake is not None and self._router is not None
        poller = zmq.asyncio.Poller()
        poller.register(self._handshake, zmq.POLLIN)
        poller.register(self._router, zmq.POLLIN)
        while not (self.core.handshake_complete and self.core.registered):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self.core.handshake_timeout(timeout)
            events = dict(await poller.poll(remaining * 1000))
            if self._router in events:
                frames = await self._router.recv_multipart()
                if len(frames) != 2:
                    raise StartupError(f"ready message must be [identity, payload], got "
                                       f"{len(frames)} frames")
                self.core.on_ready(frames[0], frames[1])
            if self._handshake in events:
                frames = await self._handshake.recv_multipart()
                if len(frames) != 2:
                    raise StartupError(f"handshake message must be [identity, payload], "
                                       f"got {len(frames)} frames")
                init = self.core.on_handshake(frames[0], frames[1], *self._addresses)
                if init is not None:
                    await self._handshake.send_multipart([frames[0], init])

    # ------------------------------------------------------------------ requests

    async def generate(self, prompt: Sequence[int], max_tokens: int, *,
                       data_parallel_rank: int | None = None,
                       stop: Sequence[str] | None = None, request_id: str | None = None,
                       params: Mapping[str, Any] | None = None,
                       sampling: Sampling = GREEDY) -> StreamHandle:
        # Only when set: wrapped cores (the stateful probe) keep the older signature.
        options: dict[str, Any] = {}
        if request_id is not None:
            options["request_id"] = request_id
        if params:
            options["params"] = params
        if sampling != GREEDY:
            options["sampling"] = sampling
        handle, send = self.core.add_request(prompt, max_tokens,
                                             data_parallel_rank=data_parallel_rank, stop=stop,
                                             **options)
        await self._send([send])
        if self._coordinator is not None and handle.request_id in self.core.requests:
            rank = self.core.requests[handle.request_id].rank
            for effect in self._coordinator.core.on_frontend_request(rank):
                await self._coordinator_effect(effect)
        if self.first_output_deadline is not None:
            asyncio.get_running_loop().call_later(
                self.first_output_deadline, self._deadline_passed, handle)
        return handle

    async def open_session(self, prompt: Sequence[int], max_tokens: int, *,
                           data_parallel_rank: int | None = None,
                           sampling: Sampling = GREEDY) -> StreamHandle:
        handle, send = self.core.open_session(prompt, max_tokens,
                                              data_parallel_rank=data_parallel_rank,
                                              sampling=sampling)
        await self._send([send])
        return handle

    async def continue_session(self, request_id: str, prompt: Sequence[int],
                               max_tokens: int) -> None:
        await self._send(self.core.continue_session(request_id, prompt, max_tokens))

    async def close_session(self, request_id: str) -> None:
        await self._send(self.core.close_session(request_id))

    def _deadline_passed(self, handle: StreamHandle) -> None:
        """A request without output by the deadline is aborted at its engine (the frames
        the core returns are sent, not dropped) and its stream ends with an error."""
        if not handle.first_output.is_set() and handle.request_id is not None:
            handle.finish("error", "no output within the first-output deadline")
            sends = self.core.abort([handle.request_id])  # the stream already ended: error
            if sends:
                self._tasks.append(self._spawn(self._send(sends)))

    def drop(self, handles: Sequence[StreamHandle]) -> None:
        """The client went away from these streams. One that already ended has nothing
        left to abort, and its client id may name a newer request by now (vLLM: a finished
        generate() has returned; Rust's terminated stream skips its auto-abort), so only
        streams still open are dropped."""
        self.drop_requests([h.request_id for h in handles
                            if h.request_id is not None and not h.ended])

    def drop_requests(self, request_ids: Sequence[str]) -> None:
        """Drop by request id (the stateful worlds model streams by id): the drain loop
        aborts what is still live."""
        self.core.queue_drop(request_ids)
        self._drop_signal.set()

    async def abort(self, request_ids: Sequence[str]) -> None:
        await self._send(self.core.abort(request_ids))

    # ------------------------------------------------------------------ utilities

    async def call_all(self, method: str, args: Sequence[Any]) -> list[Any]:
        """Fan out, wait (bounded) for every engine, return results in engine order."""
        future: asyncio.Future[PendingUtility] = asyncio.get_running_loop().create_future()
        with self._waiters.call(self.core, method, args, future) as (call, sends):
            await self._send(sends)
            try:
                await asyncio.wait_for(asyncio.shield(future), self.utility_timeout)
            except asyncio.TimeoutError:
                raise no_reply(call, f"within {self.utility_timeout:.1f}s") from None
        return self.core.utility_values(call)

    async def call_utility(self, method: str, args: Sequence[Any]) -> Any:
        """Any utility: fan out, then fold the answers by the method's aggregation rule.

        Cancelling the caller unregisters every call id of the call (call_all's finally),
        so a late reply is dropped as unknown and later calls are unaffected.
        """
        return self.core.aggregate(method, await self.call_all(method, list(args)))

    async def is_sleeping(self) -> bool:
        return self.core.aggregate_is_sleeping(await self.call_all("is_sleeping", []))

    async def reset_prefix_cache(self, reset_running_requests: bool = False,
                                 reset_connector: bool = False) -> bool:
        values = await self.call_all("reset_prefix_cache",
                                     [reset_running_requests, reset_connector])
        return self.core.aggregate_reset_prefix_cache(values)

    # ------------------------------------------------------------------ coordinator

    async def _coordinator_effect(self, effect: Effect) -> None:
        if isinstance(effect, Publish):
            assert self._coordinator is not None
            await self._coordinator.publish(effect)
        else:
            self._on_coordinator_effect(effect)

    def _on_coordinator_effect(self, effect: Effect) -> None:
        """In-process, what vLLM's coordinator publishes to its frontends (wave, load)."""
        if isinstance(effect, WaveChanged):
            self.core.on_dp_stats(m.DPStatsUpdate(None, effect.state.current_wave,
                                                  effect.state.engines_running))
        elif isinstance(effect, LoadReport):
            self.core.on_load_report(effect.rank, effect.waiting, effect.running)

    def _on_coordinator_error(self, error: CoordinatorError) -> None:
        """A miswired engine on the coordinator path: the client fails closed (vllm-rs
        closes its registries, inproc.rs:193-199)."""
        self.core.mark_dead(f"DP coordinator: {error}")
        if self.core.dead is not None:
            self._fail_waiters(self.core.dead)

    # ------------------------------------------------------------------ tasks

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(
            work, name=f"reference frontend {getattr(work, '__qualname__', 'task')}")
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """A background task ended: if by an exception, record it and fail pending calls."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        if self.task_failure is None:
            self.task_failure = f"{task.get_name()} died: {type(exc).__name__}: {exc}"
        self._waiters.fail_all(EngineDeadError(self.task_failure))

    async def _send(self, sends: Sequence[tuple[bytes, list[bytes]]]) -> None:
        assert self._router is not None
        for identity, frames in sends:
            await self._router.send_multipart([identity, *frames])

    async def _read_outputs(self) -> None:
        assert self._pull is not None
        while True:
            frames = await self._pull.recv_multipart()
            if take_output(self.core, frames, self._waiters):
                self._drop_signal.set()
            if self.core.dead is not None:
                self._fail_waiters(self.core.dead)

    async def _read_dp_stats(self) -> None:
        """Coordinator publications; an undecodable one is skipped (load info only)."""
        assert self._stats is not None
        while True:
            payload = await self._stats.recv()
            try:
                update = self.core.codec.decode_dp_stats(payload)
            except ProtocolError:
                continue
            self.core.on_dp_stats(update)

    async def _drain_aborts(self) -> None:
        while True:
            await self._drop_signal.wait()
            self._drop_signal.clear()
            await asyncio.sleep(0)  # let a burst of drops land before the pass
            sends, more = drain_pass(self.core)
            await self._send(sends)
            if more:
                self._drop_signal.set()

    async def _watch_disconnects(self) -> None:
        assert self._router is not None and self._pull is not None
        monitors = [s.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                    for s in (self._router, self._pull)]
        try:
            poller = zmq.asyncio.Poller()
            for mon in monitors:
                poller.register(mon, zmq.POLLIN)
            while True:
                for sock, _ in await poller.poll():
                    msg = parse_monitor_message(await sock.recv_multipart())
                    if msg["event"] == zmq.EVENT_DISCONNECTED:
                        self.core.mark_dead(f"engine connection lost "
                                            f"({msg['endpoint']!r} disconnected)")
                        if self.core.dead is not None:
                            self._fail_waiters(self.core.dead)
        finally:
            for sock in (self._router, self._pull):
                with contextlib.suppress(zmq.ZMQError):
                    sock.disable_monitor()
            for mon in monitors:
                mon.close(0)

    def _fail_waiters(self, error: EngineDeadError) -> None:
        if not self.fail_calls_on_death and not self._closed:
            return
        self._waiters.fail_all(error)

    # ------------------------------------------------------------------ close

    async def close(self) -> None:
        """Cancel tasks, close sockets, terminate the context; idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task  # an exception is already in task_failure (_task_done)
        self._fail_waiters(EngineDeadError("frontend closed"))
        if self._coordinator is not None:
            await self._coordinator.close()
        for sock in (self._router, self._pull, self._stats, self._handshake):
            if sock is not None:
                sock.close(0)
        self._ctx.term()
