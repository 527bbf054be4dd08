"""History mutants: bug classes taken from vLLM's own issues and pull requests, each written
as a reference core (or I/O layer) that breaks one rule the way that vLLM change shows a
frontend did (or nearly did).

These are the measurement half of "suite power round 3" (docs/mutation-history.md): they
are registered in `mutants.HISTORY_MUTANTS`, runnable as `--frontend mutant:NAME` like any
hand mutant, but kept out of the kill matrix (`mutants.MUTANTS`) until a case catches each
one. Every class names its vLLM source in its docstring.

`fired(name)` marks the moment a mutant's broken branch changes what the reference would
have done; it does nothing here. The firing check (`-p harness.mutation.history_fired
--fired-log FILE`, run by scripts/history_matrix.py) replaces it to record which mutants
acted during a run: a mutant that never fires proves nothing either way.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from harness.frontends.api import GREEDY, FrontendError, Sampling, StreamHandle
from harness.frontends.mutants_edges_d import AddRewritten
from harness.frontends.reference.coordinator import (
    TRANSITIONS,
    CoordinatorCore,
    Effect,
    Signal,
    Transition,
    WaveState,
)
from harness.frontends.reference.core import (
    DuplicateRequestId,
    EngineDeadError,
    PendingUtility,
    ReferenceFrontendCore,
    RequestState,
    Send,
)
from harness.frontends.reference.frontend import ReferenceFrontend
from harness.frontends.reference.utilities import InconsistentResults
from harness.protocol.lifecycle import Event
from harness.protocol.transport.sockets import engine_identity
from harness.protocol.vocab import detokenize
from harness.protocol.wire import messages as m
from harness.protocol.wire.codec import AddRequest


def fired(mutant: str) -> None:
    """Hook: `mutant`'s broken branch just acted (a no-op; the firing check patches it)."""


# ----------------------------------------------------------------- DP load balancing


class FirstEngineUntilStats(ReferenceFrontendCore):
    """vLLM PR #22910 ("[BugFix] Fix initial DP request load imbalance"): DPLBAsyncMPClient
    sent every unpinned request to the first rank until the first stats update arrived
    from the DP coordinator, so a burst right after startup piled onto engine 0."""

    stats_seen = False

    def on_load_report(self, rank: int, waiting: int, running: int) -> None:
        self.stats_seen = True
        super().on_load_report(rank, waiting, running)

    def route(self, data_parallel_rank: int | None) -> int:
        if data_parallel_rank is not None or self.stats_seen:
            return super().route(data_parallel_rank)
        would = super().route(None)
        first = min(self.engines)
        if would != first:
            fired("hist_lb_first_engine_until_stats")
        return first


class FixedTieBreak(ReferenceFrontendCore):
    """vLLM PR #47420 ("[Core][DP] Rotate load-balancer tie-break to avoid systematic engine
    bias"): the least-loaded scan started at a fixed index with a strict `<`, so every tie
    (equal load, e.g. an idle group between requests) went to the same engine."""

    def route(self, data_parallel_rank: int | None) -> int:
        if data_parallel_rank is not None:
            return super().route(data_parallel_rank)
        would = super().route(None)  # the reference's choice (it also turns the rotation)
        chosen = min(self.engines, key=lambda r: (self.load_score(r), r))
        if chosen != would:
            fired("hist_lb_fixed_tie_break")
        return chosen


# ----------------------------------------------------------------- stop strings


class StopFirstListed(ReferenceFrontendCore):
    """vLLM PR #50200 ("[Bugfix][Rust Frontend] Select earliest-completing stop string"):
    the Rust frontend's matches_stop_string took the first stop string in list order that
    matched in the window, not the one that completes earliest in the text; with two stops
    completing in one token (stop=["lo", "ell"], token "hello") it cut at the wrong one.
    Here: of the stop strings the text holds, the first listed wins."""

    def stop_position(self, state: RequestState) -> int:
        text = state.handle.text + state.held_text
        for stop in state.stop:
            pos = text.find(stop)
            if pos >= 0:
                if pos != super().stop_position(state):
                    fired("hist_stop_first_listed")
                return pos
        return -1


class StopAtTokenEndOnly(ReferenceFrontendCore):
    """vLLM PR #3672 ("[BugFix] Fix handling of stop strings and stop token ids", first
    bug: "stop strings ends having to align with token boundaries"): the check was
    `output_text.endswith(stop_str)` after each token, so a stop string followed by more
    characters of the same token was never matched and generation ran on."""

    def stop_position(self, state: RequestState) -> int:
        text = state.handle.text + state.held_text
        first = super().stop_position(state)
        for stop in state.stop:
            if text.endswith(stop):
                if len(text) - len(stop) != first:  # an earlier occurrence was passed over
                    fired("hist_stop_at_token_end_only")
                return len(text) - len(stop)
        if first >= 0:
            fired("hist_stop_at_token_end_only")
        return -1


class StopNoHoldback(ReferenceFrontendCore):
    """vLLM PR #3672 (second bug: "stop string not being excluded properly from output when
    it spans multiple tokens ... primarily a problem when streaming output"): no text was
    held back, so the first tokens of a stop string spanning several were already streamed
    when its last token completed it; only the last token's part was cut."""

    def hold_back(self, state: RequestState) -> int:
        if super().hold_back(state) > 0:
            fired("hist_stop_no_holdback")  # the reference would hold characters back
        return 0


# ----------------------------------------------------------------- aborts and request ids


class IdFreedBeforeAbort(ReferenceFrontendCore):
    """vLLM issue #23697 / PR #24382 ("[Bugfix] request_id abort-reuse race fix"; also PR
    #15326): the output processor freed a request id as soon as the request was aborted,
    before the ABORT reached EngineCore, so a new request reusing the id was accepted and
    its ADD overtook the ABORT, which then aborted the new request. Here a dropped stream's
    id is freed at drop time; the drain pass sends the ABORT by id afterwards."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.freed: dict[str, list[int]] = {}  # id -> engines its late ABORT goes to

    def queue_drop(self, request_ids: Iterable[str]) -> None:
        ids = list(request_ids)
        for rid in ids:
            state = self.requests.get(rid)
            if state is not None:
                state.handle.dropped = True
                self.freed[rid] = self.abort_ranks(state)
                self._finish(rid, Event.ABORT, "abort")  # the id is free from now on
        super().queue_drop(ids)

    def drain_ranks(self, rid: str) -> list[int]:
        ranks = self.freed.pop(rid, None)
        if ranks is None:
            return super().drain_ranks(rid)
        if rid in self.requests:
            fired("hist_id_freed_before_abort")  # the ABORT now names the new request
        return ranks


class AbortByExternalId(AddRewritten):
    """vLLM PR #27987 ("[Core] Add a random suffix to frontend-provided request IDs"; its
    review on abort_requests' internal vs external ids), PR #45137 ("[Rust Frontend] Add
    external->internal request-id map for abort()") and the downstream symptom in
    NovaSky-AI/SkyRL#1250: engine-side ids carry a random suffix, but the ABORT is sent
    with the external (client) id, which the engine does not hold: nothing is aborted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.external: dict[str, str] = {}  # engine-side id -> the client's id

    def assign_request_id(self, request_id: str | None) -> str:
        if request_id is not None and any(self.external.get(r) == request_id
                                          for r in self.requests):
            raise DuplicateRequestId(f"request id {request_id!r} is already in flight")
        base = super().assign_request_id(request_id)
        internal = f"{base}-{uuid.uuid4().hex[:8]}"
        self.external[internal] = base
        return internal

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        return msgspec.structs.replace(
            request, external_req_id=self.external.get(request.request_id))

    def session_request(self, rid: str, prompt: Sequence[int], sampling: m.SamplingParams,
                        *, resumable: bool) -> m.EngineCoreRequest:
        request = super().session_request(rid, prompt, sampling, resumable=resumable)
        return msgspec.structs.replace(request, external_req_id=self.external.get(rid, rid))

    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[Send]:
        external = {rank: [self.external.get(rid, rid) for rid in ids]
                    for rank, ids in per_engine.items()}
        if external != per_engine:
            fired("hist_abort_by_external_id")
        return super().abort_frames(external)


class AbortBeforeTrackedLost(ReferenceFrontendCore):
    """vLLM PR #47173 (review of the Rust /abort_requests: "Llm::generate() adds the guard
    after self.client.call(...).await ... if /abort_requests arrives while a request is
    still waiting on that await ... [the abort] will leave that request running") and PR
    #57062 ("Abort partially-registered requests when add_request is cancelled"): the index
    an abort resolves ids in is filled later than the request is live at its engine. Here
    a request becomes abortable by id only once its first output arrived (the window
    widened from a send to the first output, so a client call can reach it); an explicit
    abort before that is dropped and the request runs on."""

    def explicit_abort_ranks(self, rid: str) -> list[int]:
        state = self.request(rid)
        if (state is not None and state.phase.live
                and not state.handle.first_output.is_set()):
            fired("hist_abort_before_tracked_lost")
            return []
        return super().explicit_abort_ranks(rid)


# ----------------------------------------------------------------- DP ranks and waves


class RankCheckedAgainstCount(ReferenceFrontendCore):
    """vLLM PR #51178 ("[Rust Frontend][gRPC] Add explicit data-parallel rank routing";
    InvalidDataParallelRank "rank {rank} is out of range for {num_engines} engine(s)" became
    "not connected to this frontend; connected ranks", reviewed as "something missed when
    adding hybrid/external DPLB"): a pinned rank is checked against the engine count and
    sent to EngineId::from_engine_index(rank). With engines [2, 3] (start index 2) a pin to
    rank 2 is refused and a pin to rank 0 goes to an identity no engine has."""

    def register_request(self, prompt: Sequence[int], max_tokens: int, *,
                         data_parallel_rank: int | None = None,
                         stop: Sequence[str] | None = None, request_id: str | None = None,
                         params: Mapping[str, Any] | None = None, resumable: bool = False,
                         sampling: Sampling = GREEDY) -> tuple[StreamHandle, Send]:
        rank = data_parallel_rank
        options: dict[str, Any] = {"stop": stop, "request_id": request_id,
                                   "params": params, "resumable": resumable,
                                   "sampling": sampling}
        if rank is None or (rank in self.engines and rank < len(self.engines)):
            return super().register_request(prompt, max_tokens,
                                             data_parallel_rank=rank, **options)
        if not 0 <= rank < len(self.engines):
            if rank in self.engines:
                fired("hist_rank_checked_against_count")  # a connected engine refused
            raise FrontendError(f"data parallel rank {rank} is out of range for "
                                f"{len(self.engines)} engine(s)")
        fired("hist_rank_checked_against_count")  # in range, but not an engine of ours
        self._check_alive()
        handle, (_identity, frames) = super().register_request(
            prompt, max_tokens, data_parallel_rank=None, **options)
        decoded = self.codec.decode_engine_input(frames)
        assert isinstance(decoded, AddRequest)
        request = msgspec.structs.replace(decoded.request, data_parallel_rank=rank)
        return handle, (engine_identity(rank), self.codec.encode_add(request))


def _start_wave_rewinds() -> tuple[Transition, ...]:
    """The reference's transitions with START_WAVE applied whenever the engines are paused,
    whatever its wave (a stale one too)."""
    out = []
    for t in TRANSITIONS:
        if t.signal is Signal.START_WAVE:
            t = Transition(t.signal,
                           lambda s, w: w > s.current_wave or not s.engines_running,
                           lambda s, w: WaveState(w, True), True,
                           "start_wave(w) applied whenever paused (a stale w rewinds)")
        out.append(t)
    return tuple(out)


class _RewindingCoordinator(CoordinatorCore):
    transitions = _start_wave_rewinds()

    def apply(self, signal: Signal, wave: int, sender: int) -> list[Effect]:
        if (signal is Signal.START_WAVE and wave < self.state.current_wave
                and not self.state.engines_running):
            fired("hist_stale_start_wave_rewinds")
        return super().apply(signal, wave, sender)


class StaleStartWaveRewinds(ReferenceFrontendCore):
    """vLLM PR #46833 ("[Rust Frontend] Start current wave for a stale DP FirstRequest"):
    the in-process DP coordinator applied a stale start request for wave W unconditionally
    after WaveComplete(W) had moved current_wave to W + 1, "rewinding current_wave back to
    W and broadcasting a superseded wave". Here the frontend-owned coordinator takes an
    engine's stale start_wave(W) while paused: current_wave rewinds to W, START_DP_WAVE(W)
    is published and later ADDs carry W."""

    coordinator_class = _RewindingCoordinator


# ----------------------------------------------------------------- utilities


class UtilityEngineZeroAnswer(ReferenceFrontendCore):
    """vLLM PR #13923 (DPLBAsyncMPClient.call_utility_async: "Only the result from the
    first engine is returned"), which the Rust frontend mirrored until PR #43429 ("[rust]
    fix: aggregate `is_sleeping` and `reset_prefix_cache` across DP engines"): every
    utility fans out, and the answer is engine 0's whatever the others said."""

    def _first(self, method: str, values: list[Any], reference: Any) -> Any:
        answer = values[0] if values else None
        try:
            agreed = reference() == answer
        except InconsistentResults:
            agreed = False
        if not agreed:
            fired("hist_utility_engine_zero_answer")
        return answer

    def aggregate(self, method: str, values: list[Any]) -> Any:
        return self._first(method, values, lambda: super(
            UtilityEngineZeroAnswer, self).aggregate(method, values))

    def aggregate_is_sleeping(self, values: list[Any]) -> bool:
        return bool(self._first("is_sleeping", values, lambda: super(
            UtilityEngineZeroAnswer, self).aggregate_is_sleeping(values)))

    def aggregate_reset_prefix_cache(self, values: list[Any]) -> bool:
        return bool(self._first("reset_prefix_cache", values, lambda: super(
            UtilityEngineZeroAnswer, self).aggregate_reset_prefix_cache(values)))


class CallsPendingAfterReceiverStop(ReferenceFrontend):
    """vLLM PR #56416 ("[Bugfix][V1] Fail pending utility RPCs when the output receiver
    stops"): "If EngineCore dies before replying to a utility call, operations such as
    pause, reset, or sleep can remain blocked after the output receiver has stopped":
    receiver errors reached the output queue, not the futures of pending calls. Here only
    an explicit ENGINE_CORE_DEAD fails pending calls; an undecodable message, a lost
    connection or a coordinator-path failure leaves them to the utility timeout."""

    def _fail_waiters(self, error: EngineDeadError) -> None:
        if not self._closed and "ENGINE_CORE_DEAD" not in str(error):
            if len(self._waiters):
                fired("hist_calls_pending_after_receiver_stop")
            return
        super()._fail_waiters(error)


class LateReplyAfterCancelFatal(ReferenceFrontendCore):
    """vLLM PR #56416 (same PR, "tolerate late responses"): a utility reply arriving after
    its call was cancelled or timed out hit `utility_results.pop(call_id)` for an id no
    longer there; the KeyError killed the output handler, i.e. the whole client."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.forgotten: set[int] = set()  # call ids given up while still unanswered

    def forget_utility(self, call: PendingUtility) -> None:
        self.forgotten.update(cid for cid in call.call_ids if cid in self.utilities)
        super().forget_utility(call)

    def on_utility_output(self, engine_index: int, out: m.UtilityOutput
                          ) -> PendingUtility | None:
        if out.call_id in self.forgotten:
            fired("hist_late_reply_after_cancel_fatal")
            self.mark_dead(f"output handler died: KeyError({out.call_id}) (a reply to a "
                           f"call no longer pending)")
            return None
        return super().on_utility_output(engine_index, out)


class PromptTextLeaked(ReferenceFrontendCore):
    """vLLM issue #48853 ("FastIncrementalDetokenizer leaks full prompt text into streamed
    output when prompt ends with an incomplete UTF-8 token", introduced by PR #34217): the
    detokenizer, primed with the prompt ids, re-emitted the prompt's text in the first
    streamed delta. The trigger (a prompt ending mid-character) has no counterpart in the
    fixture vocabulary of whole words, so here the leak happens on every stream without
    stop strings: its first delta starts with the prompt's text."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        state = self.requests.get(output.request_id)
        if (state is not None and not state.stop and state.handle.chunks == 0
                and output.new_token_ids):
            leaked = detokenize(state.handle.prompt_token_ids)
            if leaked:
                fired("hist_prompt_text_leaked")
                state.handle.text += leaked
        super().on_request_output(output)


# ----------------------------------------------------------------- death, inputs, sessions


class ConnectionLossNotDeath(ReferenceFrontendCore):
    """vLLM PR #21728 ("[Bugfix] check health for engine core process exiting
    unexpectedly"): only an ENGINE_CORE_DEAD message counted as engine death; an engine
    process that went away without sending one (its connection lost) left the client
    serving, its requests and calls waiting."""

    def mark_dead(self, reason: str) -> None:
        if reason.startswith("engine connection lost"):
            if self.dead is None:
                fired("hist_connection_loss_not_death")
            return
        super().mark_dead(reason)


class KvParamsNotForwarded(ReferenceFrontendCore):
    """vLLM PR #42644 ("[Bugfix] Thread kv_transfer_params into engine for
    /inference/v1/generate (disagg)") and PR #38094: the request's kv_transfer_params was
    parsed but never put into SamplingParams.extra_args, so the engine never saw it (PD
    disaggregation silently re-prefilled); ec_transfer_params and cache_salt went through."""

    def pass_through(self, params: Mapping[str, Any] | None
                     ) -> tuple[dict[str, Any] | None, str | None]:
        fields = dict(params or {})
        if fields.pop("kv_transfer_params", None) is not None:
            fired("hist_kv_params_not_forwarded")
        return super().pass_through(fields)


class SessionAbortIsBoundary(ReferenceFrontendCore):
    """vLLM PR #53861 ("[Bugfix] Harden streaming-input session lifecycle", bug 2: "An
    engine-side ABORT/ERROR is treated like a normal chunk boundary ... Masking them leaves
    the consumer waiting forever"), as a port that fixed ERROR only: an engine ABORT of a
    session's segment is still taken as a segment boundary and the stream stays open."""

    def segment_continues(self, state: RequestState, output: m.EngineCoreOutput) -> bool:
        session = state.session
        if session is None or output.finish_reason is not m.FinishReason.ABORT:
            return super().segment_continues(state, output)
        fired("hist_session_abort_is_boundary")
        session.segments_running = max(0, session.segments_running - 1)
        session.last_reason = str(output.finish_reason)
        return not (session.closing and session.segments_running == 0)


__all__ = [
    "AbortBeforeTrackedLost", "AbortByExternalId", "CallsPendingAfterReceiverStop",
    "ConnectionLossNotDeath", "FirstEngineUntilStats", "FixedTieBreak", "IdFreedBeforeAbort",
    "KvParamsNotForwarded", "LateReplyAfterCancelFatal", "PromptTextLeaked",
    "RankCheckedAgainstCount",
    "SessionAbortIsBoundary", "StaleStartWaveRewinds", "StopAtTokenEndOnly",
    "StopFirstListed", "StopNoHoldback", "UtilityEngineZeroAnswer", "fired",
]


# ---------------------------------------------------------------- round 3 (2026-11-27)
# Written, and measured against the suite (docs/mutation-history.md, "Round 3"), before
# any case looked at them.


class StopWithinMinTokens(ReferenceFrontendCore):
    """vLLM issue #21987 / PR #22014 ("[V1] support min_tokens for detokenizer"): the V1
    detokenizer checked stop strings from the first token, so a stop string inside the
    first min_tokens tokens ended the request early, shorter than the client's minimum.
    Here: stop strings are checked at every token, min_tokens ignored."""

    def stop_checked(self, state: RequestState) -> bool:
        checked = super().stop_checked(state)  # may set the floor
        floor, state.stop_floor = state.stop_floor, 0
        found = self.stop_position(state)
        if found >= 0:
            state.stop_floor = floor
            kept = self.stop_position(state) if checked else -1
            state.stop_floor = 0
            if kept != found:
                fired("hist_stop_within_min_tokens")
        return True


class EmptyPromptSent(ReferenceFrontendCore):
    """vLLM issue #7632 / PR #7746 ("[BugFix] Fix server crash on empty prompt"): an empty
    prompt reached the engine (`assert num_new_tokens > 0`) and took the whole engine down;
    the frontends now refuse it at submission (Python's input processor, vllm-rs
    `EmptyPromptTokenIds`, whose HTTP mapping PR #45035 fixed). Here: it is sent."""

    def check_request(self, prompt: Sequence[int], max_tokens: int,
                      sampling: Sampling) -> None:
        if not prompt:
            fired("hist_empty_prompt_sent")
            return
        super().check_request(prompt, max_tokens, sampling)


class PromptOverContextSent(ReferenceFrontendCore):
    """vLLM PR #45035 ("[Bugfix][Rust Frontend] Return 400 for empty or over-length
    completion prompts") and the prompt-length check of Python's input processor: a prompt
    longer than the model's max_model_len must be refused before the engine sees it. Here:
    the length is never compared with max_model_len."""

    def check_request(self, prompt: Sequence[int], max_tokens: int,
                      sampling: Sampling) -> None:
        limit = self.config.max_model_len
        if limit is not None and len(prompt) >= limit:
            fired("hist_prompt_over_context_sent")
            prompt = prompt[:limit - 1]  # what the reference's own check then lets through
        super().check_request(prompt, max_tokens, sampling)


class MinTokensOverMaxSent(ReferenceFrontendCore):
    """vLLM issue #4365 ("When I specify max-tokens and min-tokens at the same time, the
    service reports an error in _apply_min_tokens_penalty"): a request whose min_tokens
    exceeds max_tokens reached the sampler and failed there; SamplingParams now refuses it
    (and vllm-rs `MinTokensExceedsMaxTokens`). Here: it is sent."""

    def check_request(self, prompt: Sequence[int], max_tokens: int,
                      sampling: Sampling) -> None:
        if sampling.min_tokens > max_tokens:
            fired("hist_min_tokens_over_max_sent")
            sampling = dataclasses.replace(sampling, min_tokens=max_tokens)
        super().check_request(prompt, max_tokens, sampling)
