"""The reference frontend's protocol logic as a pure state machine (no sockets, no loop).

It is correct by construction and deliberately explicit: each rule the conformance suites
check is one small method (routing, ready aggregation, abort batching, utility
aggregation, death handling), so a mutant frontend overrides exactly one of them.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.frontends.driver import (
    FrontendError,
    ObservedConfig,
    StartupError,
    StreamHandle,
    prompt_embeds_bytes,
)
from harness.frontends.reference.coordinator import CoordinatorCore
from harness.frontends.reference.sessions import SessionRules, SessionState
from harness.frontends.reference.utilities import (
    DEFAULT_AGGREGATION,
    UTILITY_AGGREGATION,
    Aggregation,
)
from harness.transport.sockets import engine_identity
from harness.vocab import EOS_TOKEN_ID, detokenize
from harness.wire import DEFAULT_CODEC, EngineDead, ProtocolError, WireCodec
from harness.wire import messages as m

MAX_ABORT_BATCH = 1024  # ids per drain pass, as vLLM's Rust client does
Send = tuple[bytes, list[bytes]]  # (engine identity, frames after the identity)


class EngineDeadError(FrontendError):
    """An engine reported ENGINE_CORE_DEAD, broke the protocol, or went away."""


class InconsistentResults(FrontendError):
    """Engines answered a consensus utility differently; the message names the values."""


class UtilityFailed(FrontendError):
    """An engine answered a utility call with a failure message."""


class DuplicateRequestId(FrontendError):
    """A client-chosen request id is already in flight; nothing was sent."""


@dataclass
class EngineState:
    rank: int
    identity: bytes
    ready: m.EngineCoreReadyResponse | None = None
    registered: bool = False
    inflight: int = 0
    reported: int = 0  # waiting + running as the engine or the coordinator last reported


@dataclass
class RequestState:
    request_id: str
    rank: int
    handle: StreamHandle
    stop: tuple[str, ...] = ()
    # With stop strings: text of delivered tokens withheld until it can no longer be the
    # start of a stop string (vLLM's stop buffer), so no client ever sees a stop string.
    held_text: str = ""
    session: SessionState | None = None  # a streaming-input (resumable) request


@dataclass
class PendingUtility:
    """One fanned-out utility call: a call id per engine, results in engine order."""

    method: str
    call_ids: dict[int, int]  # call_id -> rank
    results: dict[int, Any] = field(default_factory=dict)  # rank -> value
    failures: dict[int, str] = field(default_factory=dict)  # rank -> failure message

    @property
    def complete(self) -> bool:
        return len(self.results) + len(self.failures) == len(self.call_ids)

    def missing_ranks(self) -> list[int]:
        answered = set(self.results) | set(self.failures)
        return sorted(r for r in self.call_ids.values() if r not in answered)


class ReferenceFrontendCore(SessionRules):
    """Frontend role for one client (client_index) over N engines (DP ranks)."""

    # The state machine of the DP coordinator the frontend owns in handshake mode.
    coordinator_class: type[CoordinatorCore] = CoordinatorCore

    def __init__(self, ranks: Sequence[int], *, codec: WireCodec = DEFAULT_CODEC,
                 client_index: int = 0) -> None:
        if not ranks:
            raise ValueError("a frontend needs at least one engine")
        self.codec = codec
        self.client_index = client_index
        self.engines = {r: EngineState(r, engine_identity(r)) for r in ranks}
        self._by_identity = {e.identity: e for e in self.engines.values()}
        self.config = ObservedConfig()
        self.requests: dict[str, RequestState] = {}
        self.utilities: dict[int, PendingUtility] = {}  # call_id -> call
        self.dead: EngineDeadError | None = None
        self._rotation = itertools.cycle(sorted(ranks))
        self._next_id = itertools.count()
        self._session = uuid.uuid4().hex[:8]
        self._call_ids = itertools.count(1)
        self._block_sizes: dict[int, int] = {}
        self.pending_drops: list[str] = []  # ids waiting for the abort drain loop
        self.stop_aborts: dict[str, int] = {}  # ended by a stop string -> owning rank
        self.current_wave = 0  # the DP coordinator's latest wave, stamped on every ADD
        # Handshake mode with an owned DP coordinator: its (input, output) addresses for INIT.
        self.coordinator_addresses: tuple[str, str] | None = None
        self.hello_seen: set[int] = set()  # handshake mode: ranks that sent HELLO
        self.handshake_ready_seen: set[int] = set()  # ... and READY

    # ------------------------------------------------------------ registration

    @property
    def registered(self) -> bool:
        return all(e.registered for e in self.engines.values())

    def registration_timeout(self, timeout: float) -> StartupError:
        """The error for engines that never registered; it names them."""
        missing = [r for r, e in sorted(self.engines.items()) if not e.registered]
        return StartupError(f"engines {missing} did not register within {timeout:.1f}s")

    def on_ready(self, identity: bytes, payload: bytes) -> None:
        """Apply one engine's ready frame; raises StartupError on anything unacceptable."""
        engine = self._by_identity.get(bytes(identity))
        if engine is None:
            raise StartupError(f"ready frame from unexpected engine identity "
                               f"{bytes(identity).hex()}")
        if engine.registered:
            raise StartupError(f"engine {engine.rank} registered twice")
        try:
            ready = self.codec.decode_ready(payload)
        except ProtocolError as exc:
            raise StartupError(f"engine {engine.rank} sent an invalid ready response: "
                               f"{exc.detail}") from exc
        engine.ready, engine.registered = ready, True
        if ready is not None:
            self.apply_ready(engine.rank, ready)

    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        """max_model_len = min, num_gpu_blocks = sum, block_size synced and checked."""
        cfg = self.config
        cfg.max_model_len = (ready.max_model_len if cfg.max_model_len is None
                             else min(cfg.max_model_len, ready.max_model_len))
        cfg.num_gpu_blocks = (cfg.num_gpu_blocks or 0) + ready.num_gpu_blocks
        self._block_sizes[rank] = ready.block_size
        self.check_block_sizes()
        cfg.block_size = ready.block_size

    def check_block_sizes(self) -> None:
        if len(set(self._block_sizes.values())) > 1:
            raise StartupError(f"engines disagree on block_size: {self._block_sizes}")

    # ------------------------------------------------------------ handshake mode

    def _handshake_engine(self, identity: bytes, stage: str) -> EngineState:
        engine = self._by_identity.get(bytes(identity))
        if engine is None:
            raise StartupError(f"{stage} from unexpected engine identity "
                               f"{bytes(identity).hex()}")
        return engine

    def _handshake_status(self, engine: EngineState, payload: bytes) -> str:
        try:
            return self.codec.decode_handshake_status(payload).status
        except ProtocolError as exc:
            raise StartupError(f"engine {engine.rank} sent an invalid handshake message: "
                               f"{exc.detail}") from exc

    def on_handshake(self, identity: bytes, payload: bytes, inputs: Sequence[str],
                     outputs: Sequence[str]) -> bytes | None:
        """One message on the handshake ROUTER: HELLO is answered with INIT (the addresses
        to connect to; returned), READY is recorded. Anything out of order is refused."""
        engine = self._handshake_engine(identity, "handshake message")
        status = self._handshake_status(engine, payload)
        if status == "HELLO":
            if engine.rank in self.hello_seen:
                raise StartupError(f"engine {engine.rank} sent HELLO twice")
            self.hello_seen.add(engine.rank)
            return self.init_message(engine.rank, inputs, outputs)
        if engine.rank not in self.hello_seen or engine.rank in self.handshake_ready_seen:
            raise StartupError(f"engine {engine.rank} sent READY out of order")
        self.handshake_ready_seen.add(engine.rank)
        return None

    def init_message(self, rank: int, inputs: Sequence[str], outputs: Sequence[str]) -> bytes:
        addresses = m.EngineZmqAddresses(list(inputs), list(outputs))
        if self.coordinator_addresses is not None:  # utils.py:1272-1274
            addresses.coordinator_input, addresses.coordinator_output = \
                self.coordinator_addresses
        return self.codec.encode_init(m.EngineHandshakeMetadata(addresses, {}))

    @property
    def handshake_complete(self) -> bool:
        return self.handshake_ready_seen == set(self.engines)

    def handshake_timeout(self, timeout: float) -> StartupError:
        """Names the engines missing at the first stage that is incomplete."""
        for stage, seen in (("HELLO", self.hello_seen),
                            ("ready response", {r for r, e in self.engines.items()
                                                if e.registered}),
                            ("READY", self.handshake_ready_seen)):
            missing = sorted(set(self.engines) - seen)
            if missing:
                return StartupError(f"handshake: no {stage} from engines {missing} within "
                                    f"{timeout:.1f}s")
        return StartupError("handshake timed out")

    # ------------------------------------------------------------------ requests

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise EngineDeadError(f"engine core is dead: {self.dead}")

    def add_request(self, prompt: Sequence[int], max_tokens: int, *,
                    data_parallel_rank: int | None = None,
                    stop: Sequence[str] | None = None, request_id: str | None = None,
                    params: Mapping[str, Any] | None = None) -> tuple[StreamHandle, Send]:
        """Register a request and return its handle and the ADD to send."""
        return self.register_request(prompt, max_tokens,
                                     data_parallel_rank=data_parallel_rank, stop=stop,
                                     request_id=request_id, params=params)

    def register_request(self, prompt: Sequence[int], max_tokens: int, *,
                         data_parallel_rank: int | None = None,
                         stop: Sequence[str] | None = None, request_id: str | None = None,
                         params: Mapping[str, Any] | None = None, resumable: bool = False
                         ) -> tuple[StreamHandle, Send]:
        """add_request's work; `resumable` opens a streaming-input session (sessions.py)."""
        self._check_alive()
        if not self.registered:
            raise FrontendError("frontend is not serving yet")
        rid = self.assign_request_id(request_id)
        extra_args, cache_salt = self.pass_through(params)
        embeds = self.input_tensor(params)
        rank = self.route(data_parallel_rank)
        handle = StreamHandle(list(prompt), request_id=rid)
        self.requests[rid] = RequestState(rid, rank, handle, tuple(stop or ()),
                                          session=SessionState() if resumable else None)
        self.engines[rank].inflight += 1
        sampling = m.SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                  _eos_token_id=EOS_TOKEN_ID,
                                  _all_stop_token_ids={EOS_TOKEN_ID}, extra_args=extra_args)
        request = m.EngineCoreRequest(
            rid, list(prompt), None, sampling, None, time.time(), None, cache_salt,
            data_parallel_rank, prompt_embeds=embeds, client_index=self.client_index,
            current_wave=self.current_wave, resumable=resumable, external_req_id=rid)
        return handle, (self.engines[rank].identity, self.codec.encode_add(request))

    def assign_request_id(self, request_id: str | None) -> str:
        """A client-chosen id is used as is; a live duplicate is refused before any ADD
        (vllm-rs `Error::DuplicateRequestId`). A finished id may be reused."""
        if request_id is None:
            return f"cw-{self._session}-{next(self._next_id)}"
        if request_id in self.requests:
            raise DuplicateRequestId(f"request id {request_id!r} is already in flight")
        return request_id

    def pass_through(self, params: Mapping[str, Any] | None
                     ) -> tuple[dict[str, Any] | None, str | None]:
        """(SamplingParams.extra_args, cache_salt) carrying the client's fields unchanged."""
        fields = dict(params or {})
        cache_salt = fields.pop("cache_salt", None)
        fields.pop("prompt_embeds", None)  # a tensor field of its own (input_tensor)
        return (fields or None), cache_salt

    def input_tensor(self, params: Mapping[str, Any] | None) -> m.WireArray | None:
        """generate(params={"prompt_embeds": rows}) as a float32 tensor (torch dtype name,
        as vLLM's encoder writes it); the codec moves a large one into an aux frame."""
        rows = (params or {}).get("prompt_embeds")
        if rows is None:
            return None
        try:
            shape, data = prompt_embeds_bytes(rows)
        except (TypeError, ValueError, IndexError) as exc:
            raise FrontendError(f"prompt_embeds rejected: {exc}") from exc
        return m.WireArray("float32", shape, data)

    def route(self, data_parallel_rank: int | None) -> int:
        """An explicit rank is honoured (and validated); otherwise the least-loaded engine."""
        if data_parallel_rank is not None:
            if data_parallel_rank not in self.engines:
                raise FrontendError(f"data_parallel_rank {data_parallel_rank} is not one of "
                                    f"this frontend's engines {sorted(self.engines)}")
            return data_parallel_rank
        start = next(self._rotation)
        order = sorted(self.engines, key=lambda r: (self.load_score(r),
                                                    (r - start) % len(self.engines)))
        return order[0]

    def load_score(self, rank: int) -> int:
        """Own in-flight count, raised to the engine's reported load (other clients' work)."""
        engine = self.engines[rank]
        return max(engine.inflight, engine.reported)

    def on_load_report(self, rank: int, waiting: int, running: int) -> None:
        if rank in self.engines:
            self.engines[rank].reported = waiting + running

    def _finish(self, rid: str, reason: str | None, error: str | None = None) -> None:
        state = self.requests.pop(rid, None)
        if state is not None:
            self.engines[state.rank].inflight -= 1
            if state.held_text:  # no stop string can follow any more: release it
                state.handle.add_tokens([], state.held_text)
                state.held_text = ""
            state.handle.finish(reason, error)

    # ------------------------------------------------------------------ outputs

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        """Apply one engine message; returns utility calls it completed."""
        if self.dead is not None:
            return []
        try:
            message = self.codec.decode_outputs(frames)
        except ProtocolError as exc:
            self.mark_dead(f"protocol error on the output socket: {exc}")
            return []
        if isinstance(message, EngineDead):
            self.mark_dead("ENGINE_CORE_DEAD received")
            return []
        if message.wave_complete is not None or message.start_wave is not None:
            self.on_dp_control(message)
            return []
        if message.utility_output is not None:
            done = self.on_utility_output(message.engine_index, message.utility_output)
            return [done] if done is not None else []
        stats = message.scheduler_stats
        if isinstance(stats, dict) and stats.get("num_running_reqs") is not None:
            self.on_load_report(message.engine_index, int(stats.get("num_waiting_reqs") or 0),
                                int(stats["num_running_reqs"]))
        for output in message.outputs:
            self.on_request_output(output)
        if message.finished_requests:
            self.on_finished_requests(message.finished_requests)
        return []

    def on_dp_control(self, message: m.EngineCoreOutputs) -> None:
        """wave_complete / start_wave belong on the coordinator's path; on the main output
        path they mean a miswired engine or coordinator, so the client fails closed
        (vLLM's Rust client: UnexpectedDispatcherOutput)."""
        self.mark_dead(f"DP control on the main output path from engine "
                       f"{message.engine_index} (wave_complete={message.wave_complete}, "
                       f"start_wave={message.start_wave})")

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        """A coordinator publication: the newest wave is what later ADDs carry; counts (one
        triple per DP rank, in rank order) are load reports."""
        self.current_wave = update.current_wave
        ranks = sorted(self.engines)
        for i, (waiting, running, _kv) in enumerate(update.counts or []):
            if i < len(ranks):
                self.on_load_report(ranks[i], int(waiting), int(running))

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        state = self.requests.get(output.request_id)
        if state is None:
            if output.finished:  # ended by a stop string, and now finished by its engine:
                self.stop_aborts.pop(output.request_id, None)  # no ABORT owed any more
            return  # unknown or already finished/aborted: ignored
        handle = state.handle
        if output.new_token_ids and state.stop:
            if self.deliver_until_stop(state, output):
                return
        elif output.new_token_ids:
            handle.add_tokens(output.new_token_ids, detokenize(output.new_token_ids))
        if output.finish_reason is not None:
            if state.session is not None and self.segment_continues(state, output):
                return  # a segment boundary: the session's stream goes on
            if output.finish_reason is m.FinishReason.ERROR:
                detail = output.error.message if output.error else "request failed in engine"
                self._finish(output.request_id, "error", detail)
            else:
                self._finish(output.request_id, str(output.finish_reason))

    def on_finished_requests(self, request_ids: Iterable[str]) -> None:
        """The engine retired these ids. One still open got no final output: its stream
        ends with an error instead of waiting forever (vllm-rs: RequestStreamClosed)."""
        for rid in request_ids:
            self.stop_aborts.pop(rid, None)  # retired by the engine: no ABORT owed
            if self.retired_by_engine(rid):
                self._finish(rid, "error", f"engine retired request {rid} without a "
                                           "final output")

    def deliver_until_stop(self, state: RequestState, output: m.EngineCoreOutput) -> bool:
        """Token by token: a stop string ends the stream at the token completing it, with
        the text before it; the rest of the chunk is dropped (vLLM's _trim_surplus_tokens).
        Returns True when a stop string ended the stream."""
        handle = state.handle
        keep = max(len(s) for s in state.stop) - 1
        tokens = output.new_token_ids
        for i, token in enumerate(tokens):
            state.held_text += detokenize([token])
            pos = self.stop_position(state)
            if pos >= 0:
                # Held text covers every possible match start, so pos >= len(handle.text).
                text = (handle.text + state.held_text)[len(handle.text):pos]
                state.held_text = ""
                handle.add_tokens([token], text)
                self.end_at_stop(state, engine_finished=output.finished)
                return True
            last = output.finished and i == len(tokens) - 1
            cut = len(state.held_text) if last else max(0, len(state.held_text) - keep)
            text, state.held_text = state.held_text[:cut], state.held_text[cut:]
            handle.add_tokens([token], text)
        return False

    def stop_position(self, state: RequestState) -> int:
        """Where the earliest stop string starts in the stream's text so far, else -1."""
        text = state.handle.text + state.held_text
        found = [pos for pos in (text.find(stop) for stop in state.stop) if pos >= 0]
        return min(found) if found else -1

    def end_at_stop(self, state: RequestState, engine_finished: bool) -> None:
        """End the stream with 'stop' (later outputs are ignored) and, unless the engine
        already finished the request, owe its engine an ABORT."""
        self._finish(state.request_id, "stop")
        if not engine_finished:
            self.stop_aborts[state.request_id] = state.rank
            self.pending_drops.append(state.request_id)

    # ------------------------------------------------------------------ aborts

    def queue_drop(self, request_ids: Iterable[str]) -> None:
        """The client went away from these streams; the drain loop aborts them."""
        for rid in request_ids:
            state = self.requests.get(rid)
            if state is not None and not state.handle.ended:
                state.handle.dropped = True
            self.pending_drops.append(rid)

    def drain_drops(self) -> list[Send]:
        """One drain pass: at most 1024 queued ids, grouped per engine, never empty."""
        batch, self.pending_drops = (self.pending_drops[:MAX_ABORT_BATCH],
                                     self.pending_drops[MAX_ABORT_BATCH:])
        if self.dead is not None:
            return []
        per_engine: dict[int, list[str]] = {}
        for rid in batch:
            state = self.requests.get(rid)
            if state is None:
                owner = self.stop_aborts.pop(rid, None)  # ended by a stop string: owed
                if owner is not None:
                    per_engine.setdefault(owner, []).append(rid)
                continue  # finished, aborted or unknown: skipped
            for rank in self.abort_ranks(state):
                per_engine.setdefault(rank, []).append(rid)
            self._finish(rid, state.handle.finish_reason or "abort")
        return self.abort_frames(per_engine)

    def abort(self, request_ids: Iterable[str]) -> list[Send]:
        """Explicit abort: live ids only, streams ended locally first, one frame per engine."""
        self._check_alive()
        per_engine: dict[int, list[str]] = {}
        for rid in dict.fromkeys(request_ids):
            state = self.requests.get(rid)
            if state is None:
                continue
            for rank in self.abort_ranks(state):
                per_engine.setdefault(rank, []).append(rid)
            self._finish(rid, "abort")
        return self.abort_frames(per_engine)

    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[Send]:
        return [(self.engines[rank].identity, self.codec.encode_abort(ids))
                for rank, ids in sorted(per_engine.items()) if ids]

    # ------------------------------------------------------------------ utilities

    def start_utility(self, method: str, args: Sequence[Any]) -> tuple[PendingUtility,
                                                                       list[Send]]:
        """Fan a utility call out to every engine, each with its own call id."""
        self._check_alive()
        call = PendingUtility(method, {})
        sends: list[Send] = []
        for rank in sorted(self.engines):
            call_id = next(self._call_ids)
            call.call_ids[call_id] = rank
            self.utilities[call_id] = call
            sends.append((self.engines[rank].identity,
                          self.codec.encode_utility(self.client_index, call_id, method, args)))
        return call, sends

    def on_utility_output(self, engine_index: int, out: m.UtilityOutput
                          ) -> PendingUtility | None:
        call = self.utilities.pop(out.call_id, None)
        if call is None:
            return None  # unknown or already-answered call id: dropped
        rank = call.call_ids[out.call_id]
        if out.failure_message is not None:
            call.failures[rank] = out.failure_message
        else:
            call.results[rank] = out.result.value if out.result is not None else None
        return call if call.complete else None

    def forget_utility(self, call: PendingUtility) -> None:
        for call_id in call.call_ids:
            self.utilities.pop(call_id, None)

    def utility_values(self, call: PendingUtility) -> list[Any]:
        """Results in engine order, or UtilityFailed naming every failing engine."""
        if call.failures:
            detail = "; ".join(f"engine {r}: {msg}" for r, msg in sorted(call.failures.items()))
            raise UtilityFailed(f"utility {call.method} failed: {detail}")
        return [call.results[r] for r in sorted(call.results)]

    aggregation: Mapping[str, Aggregation] = UTILITY_AGGREGATION

    def aggregate(self, method: str, values: list[Any]) -> Any:
        """The call's answer from the engines' answers (engine order), by the method's rule."""
        if method == "is_sleeping":
            return self.aggregate_is_sleeping(values)
        if method == "reset_prefix_cache":
            return self.aggregate_reset_prefix_cache(values)
        rule = self.aggregation.get(method, DEFAULT_AGGREGATION)
        if rule is Aggregation.CONSENSUS:
            if any(v != values[0] for v in values):
                raise InconsistentResults(f"{method} returned inconsistent results across "
                                          f"engines: {values}")
            return values[0]
        if rule is Aggregation.ALL:
            return all(bool(v) for v in values)
        if rule is Aggregation.FLATTEN:
            flat: list[Any] = []
            for value in values:
                flat.extend(value if isinstance(value, list) else [value])
            return flat
        if rule is Aggregation.FIRST:
            return values[0]
        return None

    def aggregate_is_sleeping(self, values: list[Any]) -> bool:
        """Consensus: every engine must agree, else an error that names the values."""
        if len(set(values)) != 1 or not isinstance(values[0], bool):
            raise InconsistentResults(f"is_sleeping returned inconsistent results across "
                                      f"engines: {values}")
        return values[0]

    def aggregate_reset_prefix_cache(self, values: list[Any]) -> bool:
        """AND over every engine's answer."""
        return all(bool(v) for v in values)

    # ------------------------------------------------------------------ death

    def mark_dead(self, reason: str) -> None:
        """Fail every open stream and pending utility call; later calls fail fast."""
        if self.dead is not None:
            return
        self.dead = EngineDeadError(reason)
        for rid in list(self.requests):
            self._finish(rid, "error", f"engine dead: {reason}")
        self.pending_drops.clear()
        self.stop_aborts.clear()

