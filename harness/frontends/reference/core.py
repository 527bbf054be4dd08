"""The reference frontend's protocol logic as a pure state machine (no sockets, no loop).

It is correct by construction and deliberately explicit: each rule the conformance suites
check is one small method (routing, ready aggregation, abort batching, utility
aggregation, death handling), so a mutant frontend overrides exactly one of them.
Rules of one topic are mixins beside this module: sessions.py, utilities.py, handshake.py
(HELLO/INIT/READY), stop_strings.py (stream text) and data_parallel.py (routing, the DP
coordinator); the records and errors are in state.py, re-exported here.

Every request carries a `Phase` of the lifecycle table (harness/protocol/lifecycle.py, the frontend
role), and `_advance` is the one place a phase changes: `requests` (the live ones),
`stopped` (ended at a stop string, ABORT owed) and `ended` (terminal, the newest MAX_ENDED)
are indexes `_advance` keeps in step with the phases, and the drain queue `pending_drops`
is only an order of ids to look at; what a drain pass or an
explicit abort does with an id is its phase's business. The events engines cause (OUTPUT,
STOP_MATCHED, FINAL_OUTPUT, ENGINE_DEAD) are legal in every phase, so nothing an engine
sends can be an illegal transition; ABORT and DRAIN come from this core alone, and one the
table refuses is a bug of ours (`LifecycleError`).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from harness.frontends.api import (
    GREEDY,
    FrontendError,
    ObservedConfig,
    Sampling,
    StartupError,
    StreamHandle,
    prompt_embeds_bytes,
)
from harness.frontends.reference.coordinator import CoordinatorCore
from harness.frontends.reference.data_parallel import DataParallelRules
from harness.frontends.reference.handshake import HandshakeRules
from harness.frontends.reference.sessions import SessionRules, SessionState
from harness.frontends.reference.state import (
    DuplicateRequestId,
    EngineDeadError,
    EngineState,
    InvalidRequest,
    RequestState,
    ToEngine,
)
from harness.frontends.reference.stop_strings import StopStringRules
from harness.frontends.reference.utilities import (
    InconsistentResults,
    PendingUtility,
    UtilityFailed,
    UtilityRules,
)
from harness.protocol.lifecycle import Event, Phase, next_phase
from harness.protocol.transport.sockets import engine_identity
from harness.protocol.vocab import EOS_TOKEN_ID
from harness.protocol.wire import EngineDead, ProtocolError, WireCodec
from harness.protocol.wire import messages as m

MAX_ABORT_BATCH = 1024  # ids per drain pass, as vLLM's Rust client does
# Terminal requests remembered (newest last), so a late drop, abort or output of one is a
# lookup in the lifecycle table; one still owed an ABORT is in `stopped`, never forgotten.
MAX_ENDED = 4096
T = TypeVar("T")

__all__ = ["MAX_ABORT_BATCH", "MAX_ENDED", "DuplicateRequestId", "EngineDeadError",
           "EngineState", "InconsistentResults", "InvalidRequest", "PendingUtility",
           "ReferenceFrontendCore", "RequestState", "ToEngine", "UtilityFailed"]

# Below this temperature vLLM treats a request as greedy (_SAMPLING_EPS, sampling_params.py).
GREEDY_BELOW = 1e-5


class ReferenceFrontendCore(SessionRules, UtilityRules, HandshakeRules, StopStringRules,
                            DataParallelRules):
    """Frontend role for one client (client_index) over N engines (DP ranks).

    `codec` is the protocol profile's codec the driver was built for (no default: the
    profile is the driver's decision, never a global one).
    """

    # The state machine of the DP coordinator the frontend owns in handshake mode.
    coordinator_class: type[CoordinatorCore] = CoordinatorCore

    def __init__(self, ranks: Sequence[int], *, codec: WireCodec,
                 client_index: int = 0) -> None:
        if not ranks:
            raise ValueError("a frontend needs at least one engine")
        self.codec = codec
        self.client_index = client_index
        self.engines = {r: EngineState(r, engine_identity(r)) for r in ranks}
        self._by_identity = {e.identity: e for e in self.engines.values()}
        self.config = ObservedConfig()
        # Indexes of the phases, kept by _advance: the LIVE requests, those ended at a stop
        # string with an ABORT still owed (STOP_PENDING), and the terminal ones (bounded).
        self.requests: dict[str, RequestState] = {}
        self.stopped: dict[str, RequestState] = {}
        self.ended: OrderedDict[str, RequestState] = OrderedDict()
        self.utilities: dict[int, PendingUtility] = {}  # call_id -> call
        self.dead: EngineDeadError | None = None
        self._rotation = itertools.cycle(sorted(ranks))
        self._next_id = itertools.count()
        self._session = uuid.uuid4().hex[:8]
        self._call_ids = itertools.count(1)
        self._block_sizes: dict[int, int] = {}
        self.pending_drops: list[str] = []  # the drain queue: ids, in order, any phase
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

    def _known_engine(self, identity: bytes, stage: str) -> EngineState:
        """The engine of `identity`, or StartupError naming the identity and the stage."""
        engine = self._by_identity.get(bytes(identity))
        if engine is None:
            raise StartupError(f"{stage} from unexpected engine identity "
                               f"{bytes(identity).hex()}")
        return engine

    def _startup_decode(self, engine: EngineState, decode: Callable[[bytes], T],
                        payload: bytes, what: str) -> T:
        """`decode(payload)`, or StartupError naming the engine and what it sent."""
        try:
            return decode(payload)
        except ProtocolError as exc:
            raise StartupError(f"engine {engine.rank} sent an invalid {what}: "
                               f"{exc.detail}") from exc

    def on_ready(self, identity: bytes, payload: bytes) -> None:
        """Apply one engine's ready frame; raises StartupError on anything unacceptable."""
        engine = self._known_engine(identity, "ready frame")
        if engine.registered:
            raise StartupError(f"engine {engine.rank} registered twice")
        ready = self._startup_decode(engine, self.codec.decode_ready, payload,
                                     "ready response")
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

    # ------------------------------------------------------------------ requests

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise EngineDeadError(f"engine core is dead: {self.dead}")

    def add_request(self, prompt: Sequence[int], max_tokens: int, *,
                    data_parallel_rank: int | None = None,
                    stop: Sequence[str] | None = None, request_id: str | None = None,
                    params: Mapping[str, Any] | None = None,
                    sampling: Sampling = GREEDY) -> tuple[StreamHandle, ToEngine]:
        """Register a request and return its handle and the ADD to send."""
        return self.register_request(prompt, max_tokens,
                                     data_parallel_rank=data_parallel_rank, stop=stop,
                                     request_id=request_id, params=params, sampling=sampling)

    def register_request(self, prompt: Sequence[int], max_tokens: int, *,
                         data_parallel_rank: int | None = None,
                         stop: Sequence[str] | None = None, request_id: str | None = None,
                         params: Mapping[str, Any] | None = None, resumable: bool = False,
                         sampling: Sampling = GREEDY) -> tuple[StreamHandle, ToEngine]:
        """add_request's work; `resumable` opens a streaming-input session (sessions.py)."""
        self._check_alive()
        if not self.registered:
            raise FrontendError("frontend is not serving yet")
        self.check_request(prompt, max_tokens, sampling)
        rid = self.assign_request_id(request_id)
        extra_args, cache_salt = self.pass_through(params)
        embeds = self.input_tensor(params)
        rank = self.route(data_parallel_rank)
        handle = StreamHandle(list(prompt), request_id=rid)
        self.ended.pop(rid, None)  # a reused id names the new request from now on
        self.stopped.pop(rid, None)
        self.requests[rid] = RequestState(rid, rank, handle, tuple(stop or ()),
                                          min_tokens=sampling.min_tokens,
                                          session=SessionState(sampling=sampling)
                                          if resumable else None)
        self.engines[rank].inflight += 1
        request = m.EngineCoreRequest(
            rid, list(prompt), None, self.sampling_params(max_tokens, sampling, extra_args),
            None, time.time(), None, cache_salt,
            data_parallel_rank, prompt_embeds=embeds, client_index=self.client_index,
            current_wave=self.current_wave, resumable=resumable, external_req_id=rid)
        return handle, (self.engines[rank].identity, self.codec.encode_add(request))

    def check_request(self, prompt: Sequence[int], max_tokens: int,
                      sampling: Sampling) -> None:
        """Refuse, before any ADD, what both 0.33.0 frontends refuse at submission: an
        empty prompt (input_processor.py:565-566; Rust llm request.rs:74-79), a prompt
        that leaves no room for one output token within the agreed max_model_len: longer
        (input_processor.py:574-590; Rust lower.rs:372-378) or exactly as long
        (input_processor.py:593-602; Rust lower.rs:381 PromptFillsContext), min_tokens
        above max_tokens (sampling_params.py:701-704; Rust lower.rs:185-190)."""
        if not prompt:
            raise InvalidRequest("the prompt is empty")
        limit = self.config.max_model_len
        if limit is not None and len(prompt) >= limit:
            raise InvalidRequest(f"the prompt (length {len(prompt)}) leaves no room for an "
                                 f"output token within max_model_len {limit}")
        if sampling.min_tokens > max_tokens:
            raise InvalidRequest(f"min_tokens {sampling.min_tokens} is above max_tokens "
                                 f"{max_tokens}")

    def sampling_params(self, max_tokens: int, sampling: Sampling,
                        extra_args: dict[str, Any] | None = None) -> m.SamplingParams:
        """The ADD's SamplingParams for what the client asked, as vLLM's frontends build
        it: a greedy request's top_p/top_k/min_p reset (sampling_params.py:615-619), the
        model's EOS as _eos_token_id unless ignore_eos, and EOS with the client's stop
        token ids in _all_stop_token_ids (the engine's min_tokens rule reads them)."""
        greedy = sampling.temperature < GREEDY_BELOW
        return m.SamplingParams(
            temperature=sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            top_k=0 if greedy else sampling.top_k,
            min_p=0.0 if greedy else sampling.min_p,
            seed=sampling.seed, ignore_eos=sampling.ignore_eos,
            min_tokens=sampling.min_tokens,
            stop_token_ids=list(sampling.stop_token_ids) or None, max_tokens=max_tokens,
            _eos_token_id=None if sampling.ignore_eos else EOS_TOKEN_ID,
            _all_stop_token_ids={EOS_TOKEN_ID, *sampling.stop_token_ids},
            extra_args=extra_args)

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

    def load_score(self, rank: int) -> int:
        """Own in-flight count, raised to the engine's reported load (other clients' work)."""
        engine = self.engines[rank]
        return max(engine.inflight, engine.reported)

    def on_load_report(self, rank: int, waiting: int, running: int) -> None:
        if rank in self.engines:
            self.engines[rank].reported = waiting + running

    # ------------------------------------------------------------------ lifecycle

    def request(self, rid: str) -> RequestState | None:
        """The request `rid` names, live or ended (None: unknown, or long forgotten)."""
        return self.requests.get(rid) or self.stopped.get(rid) or self.ended.get(rid)

    def _advance(self, state: RequestState, event: Event) -> Phase:
        """The one place a phase changes: along the lifecycle table (LifecycleError if it
        has no such transition: a bug of this core), with the indexes kept in step."""
        was = state.phase
        state.phase = next_phase(was, event, state.request_id)
        if state.phase is not was:
            self._reindex(state, was)
        return state.phase

    def _reindex(self, state: RequestState, was: Phase) -> None:
        """Move a request between the indexes of its old and new phase; the terminal ones
        are kept for the newest MAX_ENDED requests only (the oldest are forgotten)."""
        rid = state.request_id
        if was.live and not state.phase.live:
            self.requests.pop(rid, None)
        if was is Phase.STOP_PENDING:
            self.stopped.pop(rid, None)
        if state.phase is Phase.STOP_PENDING:
            self.stopped[rid] = state
        elif state.phase.terminal:
            self.ended[rid] = state
            self.ended.move_to_end(rid)
            while len(self.ended) > MAX_ENDED:
                self.ended.popitem(last=False)

    def _finish(self, rid: str, event: Event, reason: str | None,
                error: str | None = None) -> None:
        """A live request leaves LIVE by `event`: its routing slot is released, held text
        delivered, its stream ended with `reason` (a request not live: nothing)."""
        state = self.requests.get(rid)
        if state is None:
            return
        self.engines[state.rank].inflight -= 1
        if state.held_text:  # no stop string can follow any more: release it
            state.handle.add_tokens([], state.held_text)
            state.held_text = ""
        self._advance(state, event)
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

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        state = self.requests.get(output.request_id)
        if state is None:
            self.on_ended_output(output)
            return
        handle = state.handle
        if output.new_token_ids and state.stop:
            if self.deliver_until_stop(state, output):
                return
        elif output.new_token_ids:
            handle.add_tokens(output.new_token_ids,
                              "".join(self.token_text(output, i)
                                      for i in range(len(output.new_token_ids))))
        if output.finish_reason is not None:
            if state.session is not None and self.segment_continues(state, output):
                return  # a segment boundary: the session's stream goes on
            self.end_by_engine(state, output)

    def end_by_engine(self, state: RequestState, output: m.EngineCoreOutput) -> None:
        """The engine's final output ends the stream with its finish reason (and the error
        message of an ERROR); the engine is done with it, so no ABORT is owed."""
        if output.finish_reason is m.FinishReason.ERROR:
            detail = output.error.message if output.error else "request failed in engine"
            self._finish(state.request_id, Event.FINAL_OUTPUT, "error", detail)
        else:
            self._finish(state.request_id, Event.FINAL_OUTPUT, str(output.finish_reason))

    def on_ended_output(self, output: m.EngineCoreOutput) -> None:
        """An output for a request that is not live is ignored, but a final one retires
        the ABORT a stop string left owed (STOP_PENDING + FINAL_OUTPUT -> FINISHED)."""
        state = self.request(output.request_id)
        if state is not None:
            self._advance(state, Event.FINAL_OUTPUT if output.finished else Event.OUTPUT)

    def on_finished_requests(self, request_ids: Iterable[str]) -> None:
        """The engine retired these ids: no ABORT is owed for any of them any more."""
        for rid in request_ids:
            stopped = self.stopped.get(rid)
            if stopped is not None:
                self._advance(stopped, Event.FINAL_OUTPUT)
            elif self.retired_by_engine(rid):
                self.retired_without_output(rid)

    def retired_without_output(self, rid: str) -> None:
        """A live request the engine retired without a final output: its stream ends with
        an error instead of waiting forever (vllm-rs: RequestStreamClosed)."""
        self._finish(rid, Event.FINAL_OUTPUT, "error",
                     f"engine retired request {rid} without a final output")

    def hold_back(self, state: RequestState) -> int:
        """Characters withheld at the end of the text: any shorter tail could still be the
        start of a stop string (vLLM's stop buffer, len(longest stop) - 1)."""
        return max(len(s) for s in state.stop) - 1

    # ------------------------------------------------------------------ aborts

    def queue_drop(self, request_ids: Iterable[str]) -> None:
        """The client went away from these streams (DROP); the drain loop aborts them."""
        for rid in request_ids:
            state = self.request(rid)
            if state is not None:
                self._advance(state, Event.DROP)
                if state.phase.live and not state.handle.ended:
                    state.handle.dropped = True
            self.pending_drops.append(rid)

    def drain_drops(self) -> list[ToEngine]:
        """One drain pass: at most 1024 queued ids, grouped per engine, never empty."""
        batch, self.pending_drops = (self.pending_drops[:MAX_ABORT_BATCH],
                                     self.pending_drops[MAX_ABORT_BATCH:])
        if self.dead is not None:
            return []
        per_engine: dict[int, list[str]] = {}
        for rid in batch:
            for rank in self.drain_ranks(rid):
                per_engine.setdefault(rank, []).append(rid)
        return self.abort_frames(per_engine)

    def drain_ranks(self, rid: str) -> list[int]:
        """Where a drain pass aborts one queued id: nowhere unless its phase owes an ABORT
        (a dropped live request: its engines, its stream ended; a stop string's: its
        owner); the request is DRAINED. Finished, aborted, drained or unknown: skipped."""
        state = self.request(rid)
        if state is None or not state.phase.abort_owed:
            return []
        if not state.phase.live:  # STOP_PENDING: the stream already ended at "stop"
            self._advance(state, Event.DRAIN)
            return [state.rank]
        ranks = self.abort_ranks(state)
        self._finish(rid, Event.DRAIN, state.handle.finish_reason or "abort")
        return ranks

    def abort(self, request_ids: Iterable[str]) -> list[ToEngine]:
        """Explicit abort: live ids only, streams ended locally first, one frame per engine."""
        self._check_alive()
        return self.abort_frames(self.explicit_abort_batch(list(dict.fromkeys(request_ids))))

    def explicit_abort_batch(self, request_ids: Sequence[str]) -> dict[int, list[str]]:
        """The ids of one explicit abort, grouped per engine."""
        per_engine: dict[int, list[str]] = {}
        for rid in request_ids:
            for rank in self.explicit_abort_ranks(rid):
                per_engine.setdefault(rank, []).append(rid)
        return per_engine

    def explicit_abort_ranks(self, rid: str) -> list[int]:
        """Where an explicit abort sends one id: a live request's engines (it is ABORTED,
        its stream ends "abort"); an ended or unknown id goes nowhere (a stop string's
        owed ABORT is left to the drain pass)."""
        state = self.request(rid)
        if state is None or not state.phase.live:
            return []
        ranks = self.abort_ranks(state)
        self._finish(rid, Event.ABORT, "abort")
        return ranks

    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[ToEngine]:
        return [(self.engines[rank].identity, self.codec.encode_abort(ids))
                for rank, ids in sorted(per_engine.items()) if ids]

    # ------------------------------------------------------------------ death

    def mark_dead(self, reason: str) -> None:
        """Fail every open stream and pending utility call; later calls fail fast."""
        if self.dead is not None:
            return
        self.dead = EngineDeadError(reason)
        for rid in list(self.requests):
            self._finish(rid, Event.ENGINE_DEAD, "error", f"engine dead: {reason}")
        for state in list(self.stopped.values()):
            self._advance(state, Event.ENGINE_DEAD)  # no ABORT is ever sent after death
        self.pending_drops.clear()

