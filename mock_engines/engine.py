"""One mock engine (one DP rank) as a pure state machine: frames in, frames out.

No sockets and no clock of its own: the runner feeds it received frames with the current
time, asks it for whatever is due, and sleeps until `next_deadline()`. That keeps every
behaviour testable without I/O and lets the same core sit behind any transport.

Like vLLM's engine it emits at most one step per request per `poll()` and batches all
requests that are due in one step into one `EngineCoreOutputs` per client.

Each request id has one `Phase`, moved only through the ENGINE table of
harness/protocol/lifecycle.py. What the frontend sends that the table refuses (a duplicate ADD of
a live id, an ABORT of an ended or unknown id) is the frontend's doing: kept in `refused`
(the transcript keeps the frame itself) and otherwise ignored, never a crash. Load mode's
requests are the pre-encoded stepper's own (mock_engines/loadgen.py), outside the table:
its hot path counts them in `LoadStats` instead.
"""

from __future__ import annotations

import collections
import heapq
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from harness.protocol.lifecycle import Event, LifecycleError, Phase, Role, next_phase
from harness.protocol.wire import (
    AbortRequests,
    AddRequest,
    ProtocolError,
    WireCodec,
)
from harness.protocol.wire import messages as m
from mock_engines.loadgen import LoadStepper
from mock_engines.script import (
    Die,
    Emit,
    EmitArrays,
    EngineScript,
    Finish,
    FinishedOnly,
    Garbage,
    StatsOnly,
    Step,
    default_ready,
)
from mock_engines.transcript import Record, Transcript

ALL_CLIENTS = -1
REFUSED_KEPT = 256  # refused ADDs / ABORTs kept as evidence (a misbehaving frontend may
#                     send any number)


class Outgoing(NamedTuple):
    """Frames to send on the output socket of `client_index` (ALL_CLIENTS: every one)."""

    client_index: int
    frames: list[bytes]


@dataclass(slots=True)
class _RunningRequest:
    """A scheduled request's position in its script (the lifecycle is in `phases`)."""

    request: m.EngineCoreRequest
    steps: list[Step]
    position: int
    due: float
    added: float = 0.0
    tokens_sent: int = 0
    outputs_sent: int = 0
    # Streaming-input session: inputs (ADD, its index) that arrived while this segment ran.
    queued: list[tuple[m.EngineCoreRequest, int]] = field(default_factory=list)


@dataclass(order=True)
class _PendingReply:
    due: float
    seq: int
    client_index: int = field(compare=False)
    output: m.UtilityOutput = field(compare=False)


class MockEngineCore:
    """The engine role of the protocol for one rank, driven by an `EngineScript`."""

    def __init__(self, rank: int, script: EngineScript | None = None, *,
                 codec: WireCodec, transcript: Transcript | None = None,
                 dp_size: int = 1) -> None:
        """`codec`: the protocol this engine speaks (`codec_for(profile)`)."""
        self.rank = rank
        self.script = script or EngineScript()
        self.codec = codec
        self.transcript = transcript if transcript is not None \
            else Transcript(codec=self.codec, retain=self.script.retain_transcript)
        self.dp_size = dp_size
        # Every id this engine took an ADD for, in its ENGINE-role phase (ended ones stay:
        # they are what a late ABORT is judged by).
        self.phases: dict[str, Phase] = {}
        # The last ADD of each id in a holding phase (OPEN, SEGMENT, AWAITING_INPUT).
        self.held: dict[str, m.EngineCoreRequest] = {}
        # The script position of each held request that has steps to run.
        self.running: dict[str, _RunningRequest] = {}
        self.refused: collections.deque[LifecycleError] = collections.deque(
            maxlen=REFUSED_KEPT)
        self.dead = False
        self._adds_seen = 0
        self._replies: list[_PendingReply] = []
        self._reply_seq = 0
        self._outbox: list[Outgoing] = []
        self._finished_for_client: dict[int, list[str]] = {}
        self._step_counter = 0
        self._stats_only_due = False  # log_stats: one stats-only message once idle
        # Load-generator mode: requests run in the pre-encoded stepper, not as scripts.
        self.load: LoadStepper | None = (
            LoadStepper(rank, self.codec, self.script.load, self.script.weight_version)
            if self.script.load is not None else None)

    # ------------------------------------------------------------ registration

    def ready_payload(self) -> bytes:
        """The one frame this engine registers with on each input socket."""
        if self.script.ready_payload is not None:
            return self.script.ready_payload
        ready = self.script.ready or default_ready(
            self.rank, self.dp_size, vllm_version=self.codec.profile.vllm_version)
        return self.codec.encode_ready(ready)

    def record_ready(self, now: float, payload: bytes) -> None:
        try:
            message: Any = self.codec.decode_ready_message(payload)
        except ProtocolError:
            message = None  # deliberately malformed (scripted); the hex shows it
        self._record(now, "out", "ready", [payload], message, note="ready response")

    # ------------------------------------------------------------------ input

    def receive(self, frames: list[bytes], now: float) -> None:
        """Handle one message from a frontend's ROUTER (identity already stripped)."""
        try:
            message = self.codec.decode_engine_input(frames)
        except ProtocolError as exc:
            self._record(now, "in", "input", frames, error=exc)
            return
        self._record(now, "in", "input", frames, message)
        if self.dead:
            return
        if isinstance(message, AddRequest):
            self._on_add(message.request, now)
        elif isinstance(message, AbortRequests):
            self._on_abort(message.request_ids)
        elif isinstance(message, m.UtilityRequest):
            self._on_utility(message, now)
        # START_DP_WAVE is only legal from the coordinator; it is recorded, nothing more.

    def _on_add(self, request: m.EngineCoreRequest, now: float) -> None:
        self._stats_only_due = False  # busy again: the next step carries stats anyway
        index = self._adds_seen
        self._adds_seen += 1
        if self.load is not None:
            if not request.abort_immediately:
                self.load.add(request, now)
            return
        self._take_input(request, index, now)

    def _take_input(self, request: m.EngineCoreRequest, index: int, now: float) -> None:
        """One ADD (received, or queued behind a session's segment) through the table."""
        rid = request.request_id
        before = self.phases.get(rid, Phase.NEW)
        phase = self._frontend_move(rid, Event.ADD_RESUMABLE if request.resumable
                                    else Event.ADD)
        if phase is None:
            return  # refused: a duplicate ADD of a live id
        if before is Phase.SEGMENT:  # the input waits for the running segment
            live = self.running.get(rid)
            if live is not None:  # (a segment without steps never ends on its own)
                live.queued.append((request, index))
        elif phase is Phase.FINISHED:  # the input closed a session between segments
            self._ended(rid, request.client_index)
        else:
            self._start(request, index, now)

    def _start(self, request: m.EngineCoreRequest, index: int, now: float) -> None:
        """Hold a request that just entered OPEN or SEGMENT and schedule its script."""
        rid = request.request_id
        self.held[rid] = request
        steps = self.script.steps_for(request, index)
        if request.abort_immediately:  # vLLM adds it, then aborts it (engine/core.py:559)
            self._abort(rid)
        elif steps:  # no steps: held, answered only by injected outputs, until aborted
            self.running[rid] = _RunningRequest(request, steps, 0, now + _delay(steps[0]), now)

    def _on_abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            if self.load is not None:
                self.load.abort(rid)
            else:
                self._abort(rid)

    def _abort(self, rid: str) -> None:
        if self._frontend_move(rid, Event.ABORT) is None:
            return  # refused: an ABORT of an ended or unknown id
        self.running.pop(rid, None)
        self._ended(rid, self.held[rid].client_index)

    def _frontend_move(self, rid: str, event: Event) -> Phase | None:
        """Move `rid` on what the frontend sent; None (kept in `refused`) if the table
        refuses it: the frontend's fault, recorded and otherwise ignored."""
        try:
            return self._move(rid, event)
        except LifecycleError as exc:
            self.refused.append(exc.with_traceback(None))  # evidence, not the stack
            return None

    def _move(self, rid: str, event: Event) -> Phase:
        """The one place a request's phase changes (LifecycleError: no such transition)."""
        phase = next_phase(self.phases.get(rid, Phase.NEW), event, rid, role=Role.ENGINE)
        self.phases[rid] = phase
        return phase

    def _ended(self, rid: str, client: int) -> None:
        """A held request reached FINISHED or ABORTED: release it, list it as finished."""
        del self.held[rid]
        self._note_finished(client, rid)
        self._went_idle()

    def _on_utility(self, call: m.UtilityRequest, now: float) -> None:
        reply = self.script.utility_reply(call.method)
        if reply.never:
            return
        if reply.failure is not None:
            output = m.UtilityOutput(call.call_id, reply.failure, None)
        else:
            output = m.UtilityOutput(call.call_id, None, m.UtilityResult(None, reply.value))
        self._reply_seq += 1
        heapq.heappush(self._replies, _PendingReply(now + reply.delay, self._reply_seq,
                                                    call.client_index, output))

    # ----------------------------------------------------------------- output

    def next_deadline(self) -> float | None:
        """The earliest time something becomes due (None: nothing scheduled)."""
        if self.dead:
            return None
        times = [r.due for r in self.running.values()]
        if self.load is not None:
            due = self.load.due()
            if due is not None:
                times.append(due)
        if self._replies:
            times.append(self._replies[0].due)
        if self._outbox or self._finished_for_client or (self._stats_only_due
                                                          and not self.running):
            return 0.0
        return min(times) if times else None

    def has_scripted_work(self) -> bool:
        """Anything for `poll` beyond load-mode steps (replies, injections, scripts)."""
        return bool(self.running or self._replies or self._outbox or self._finished_for_client
                    or self._stats_only_due)

    def poll(self, now: float) -> list[Outgoing]:
        """Everything due at `now`: utility replies, then one engine step."""
        out, self._outbox = self._outbox, []
        while self._replies and self._replies[0].due <= now and not self.dead:
            pending = heapq.heappop(self._replies)
            outputs = m.EngineCoreOutputs(self.rank, [], None, now,
                                          utility_output=pending.output)
            out.append(self._emit(now, pending.client_index, outputs))
        if not self.dead:
            out.extend(self._step(now))
        return out

    def _step(self, now: float) -> list[Outgoing]:
        per_client: dict[int, list[m.EngineCoreOutput]] = {}
        faults: list[Outgoing] = []
        for rid, live in list(self.running.items()):
            if live.due > now:
                continue
            step = live.steps[live.position]
            client = live.request.client_index
            if isinstance(step, Die):
                return [*faults, *self._die(now)]
            if isinstance(step, Garbage):
                frames = list(step.frames)
                self._record(now, "out", "fault", frames, note="scripted garbage frame")
                faults.append(Outgoing(client, frames))
                self._next_step(rid, live)
                continue
            if isinstance(step, FinishedOnly):
                self._retire_silently(rid, live)
                continue
            if isinstance(step, StatsOnly):
                faults.append(self._emit(now, client, m.EngineCoreOutputs(
                    self.rank, [], self._full_stats(), now,
                    weight_version=self.script.weight_version)))
                self._next_step(rid, live)
                continue
            per_client.setdefault(client, []).append(self._output_for(rid, live, step, now))
        out = faults
        stats = self._scheduler_stats() if per_client or self._stats_only_due else None
        for client, outputs in per_client.items():
            finished = self._finished_for_client.pop(client, None)
            msg = m.EngineCoreOutputs(self.rank, outputs, stats, now, finished_requests=finished,
                                      weight_version=self.script.weight_version)
            stats = None  # like vLLM: stats ride on one client's message per step
            out.append(self._emit(now, client, msg))
        if stats is not None and not self.running:
            self._stats_only_due = False
            msg = m.EngineCoreOutputs(self.rank, [], stats, now,
                                      weight_version=self.script.weight_version)
            out.append(self._emit(now, 0, msg))
        for client in list(self._finished_for_client):
            finished = self._finished_for_client.pop(client)
            msg = m.EngineCoreOutputs(self.rank, [], None, now, finished_requests=finished)
            out.append(self._emit(now, client, msg))
        return out

    def _retire_silently(self, rid: str, live: _RunningRequest) -> None:
        """FinishedOnly: drop the request and list it in finished_requests, no output."""
        del self.running[rid]
        self._move(rid, Event.RETIRE)
        del self.held[rid]
        self._finished_for_client.setdefault(live.request.client_index, []).append(rid)
        self._went_idle()

    def _output_for(self, rid: str, live: _RunningRequest, step: Emit | EmitArrays | Finish,
                    now: float) -> m.EngineCoreOutput:
        tokens = list(step.tokens)
        live.tokens_sent += len(tokens)
        first = live.outputs_sent == 0
        live.outputs_sent += 1
        prefill = self._prefill_stats(live) if first and self.script.prefill_stats else None
        events = ([m.EngineCoreEvent(m.EngineCoreEventType.QUEUED, live.added),
                   m.EngineCoreEvent(m.EngineCoreEventType.SCHEDULED, live.added)]
                  if first and self.script.log_stats else None)
        if not isinstance(step, Finish):
            self._move(rid, Event.OUTPUT)
        if isinstance(step, Emit):
            self._next_step(rid, live)
            return m.EngineCoreOutput(rid, tokens, events=events, prefill_stats=prefill)
        if isinstance(step, EmitArrays):
            self._next_step(rid, live)
            experts = m.WireArray("<i4", (len(tokens), step.experts),
                                  bytes(4 * len(tokens) * step.experts))
            return m.EngineCoreOutput(rid, tokens, events=events, prefill_stats=prefill,
                                      routed_experts=experts)
        self._final_output_sent(rid, live, step.reason, now)
        return m.EngineCoreOutput(rid, tokens, finish_reason=step.reason,
                                  stop_reason=step.stop_reason, events=events,
                                  kv_transfer_params=step.kv_transfer_params,
                                  prefill_stats=prefill, error=step.error)

    def _final_output_sent(self, rid: str, live: _RunningRequest, reason: m.FinishReason,
                           now: float) -> None:
        """A resumable request's stop or length ends a segment, not the session: the
        session then takes its next queued input, if one arrived (vLLM
        scheduler.add_request's streaming_queue); anything else ends the request."""
        del self.running[rid]
        segment_end = live.request.resumable and reason not in (m.FinishReason.ABORT,
                                                                m.FinishReason.ERROR)
        phase = self._move(rid, Event.SEGMENT_END if segment_end else Event.FINAL_OUTPUT)
        if phase is not Phase.AWAITING_INPUT:
            self._ended(rid, live.request.client_index)
        elif live.queued:
            request, index = live.queued.pop(0)
            self._take_input(request, index, now)
            if rid in self.running:
                self.running[rid].queued.extend(live.queued)

    @staticmethod
    def _prefill_stats(live: _RunningRequest) -> dict[str, int]:
        """vLLM's PrefillStats for a fully computed prompt (no cache hits)."""
        n = len(live.request.prompt_token_ids or [])
        return {"num_prompt_tokens": n, "num_computed_tokens": n, "num_cached_tokens": 0,
                "num_local_cached_tokens": 0, "num_external_cached_tokens": 0,
                "num_cache_creation_tokens": 0}

    def _went_idle(self) -> None:
        if self.script.log_stats and not self.running:
            self._stats_only_due = True

    def _scheduler_stats(self) -> dict[str, Any] | None:
        """A SchedulerStats map with vLLM 0.33.0's key structure (log_stats only)."""
        if not self.script.log_stats:
            return None
        return self._full_stats()

    def full_stats(self) -> dict[str, Any]:
        """One SchedulerStats map (the next step counter), e.g. for the coordinator path."""
        return self._full_stats()

    def _full_stats(self) -> dict[str, Any]:
        self._step_counter += 1
        return {
            "num_running_reqs": len(self.running) + self.script.reported_load[1],
            "num_waiting_reqs": self.script.reported_load[0],
            "num_skipped_waiting_reqs": 0,
            "num_kv_fetch_reqs_by_stage": {"waiting_to_start": 0, "in_progress": 0,
                                           "completed_waiting": 0},
            "step_counter": self._step_counter, "current_wave": 0, "kv_cache_usage": 0.0,
            "iteration_details": None,
            "prefix_cache_stats": {"reset": False, "requests": 0, "queries": 0, "hits": 0,
                                   "preempted_requests": 0, "preempted_queries": 0,
                                   "preempted_hits": 0, "hits_by_source": {}},
            "connector_prefix_cache_stats": None, "kv_cache_eviction_events": [],
            "spec_decoding_stats": None, "kv_connector_stats": None,
            "ec_connector_stats": None, "waiting_lora_adapters": {},
            "running_lora_adapters": {}, "cudagraph_stats": None, "perf_stats": None,
        }

    def _next_step(self, rid: str, live: _RunningRequest) -> None:
        live.position += 1
        if live.position >= len(live.steps):
            # A script that ends without Finish leaves the request open until aborted.
            live.due = float("inf")
        else:
            live.due += _delay(live.steps[live.position])

    def _note_finished(self, client: int, rid: str) -> None:
        if self.script.report_finished:
            self._finished_for_client.setdefault(client, []).append(rid)

    # ------------------------------------------------------------------ faults

    def _die(self, now: float) -> list[Outgoing]:
        """Its own death: every held request goes DEAD (held and scheduled as they were:
        a dead engine reads and sends nothing more)."""
        self.dead = True
        for rid in self.held:
            self._move(rid, Event.ENGINE_DEAD)
        frames = self.codec.encode_engine_dead()
        self._record(now, "out", "output", frames, note="ENGINE_CORE_DEAD")
        return [Outgoing(ALL_CLIENTS, frames)]

    def inject_dead(self, now: float) -> None:
        """Send ENGINE_CORE_DEAD to every client at the next poll and stop serving."""
        if not self.dead:
            self._outbox.extend(self._die(now))

    def inject_outputs(self, now: float, outputs: m.EngineCoreOutputs,
                       client_index: int = 0) -> None:
        """Send a hand-built (valid) message at the next poll: shapes no script produces
        (several requests' outputs reordered, duplicates, unknown ids)."""
        self._outbox.append(self._emit(now, client_index, outputs))

    def inject_garbage(self, now: float, frames: list[bytes], client_index: int = 0) -> None:
        self._record(now, "out", "fault", frames, note="injected garbage frame")
        self._outbox.append(Outgoing(client_index, frames))

    # ------------------------------------------------------------------ state

    def phase_of(self, request_id: str) -> Phase:
        """The ENGINE-role phase of one id (NEW if this engine never took its ADD)."""
        return self.phases.get(request_id, Phase.NEW)

    def ids_in(self, *phases: Phase) -> set[str]:
        """Every id this engine took an ADD for whose phase is one of `phases`."""
        return {rid for rid, phase in self.phases.items() if phase in phases}

    def counts(self) -> tuple[int, int]:
        """(waiting, running) as a DP coordinator would publish them."""
        waiting, running = scripted_load(self.script)
        return waiting, self.live_count() + running

    def live_count(self) -> int:
        """Requests this engine is running: state of the engine's own thread."""
        return len(self.running) + (self.load.running if self.load is not None else 0)

    def _emit(self, now: float, client: int, outputs: m.EngineCoreOutputs) -> Outgoing:
        frames = self.codec.encode_outputs(outputs)
        self.transcript.append_output(now, self.rank, tuple(frames))
        return Outgoing(client, frames)

    def _record(self, now: float, direction: Any, channel: Any, frames: list[bytes],
                message: Any = None, error: ProtocolError | None = None, note: str = "") -> None:
        self.transcript.append(Record(now, self.rank, direction, channel,
                                      tuple(bytes(f) for f in frames), message, error, note))


def scripted_load(script: EngineScript) -> tuple[int, int]:
    """(waiting, running) a script adds to what the engine runs (read from any thread: a
    case may change it while the engine runs)."""
    return (0, 0) if script.load_in_stats_only else script.reported_load


def _delay(step: Step) -> float:
    return step.delay


