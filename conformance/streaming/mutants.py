"""The streaming area's mutants: reference frontends that each break one streaming rule.

Each is the reference frontend's core (harness/frontends/reference/core.py) with one method
overridden, and registers itself (harness/mutation/registry.py); the kill matrix and
`--frontend mutant:NAME` find it there. The rules they break are those of this folder's
cases: outputs and their routing, finish reasons, stop strings, the ADD's fields and input
tensors, request limits, streaming-input sessions, and the extras of output messages.
The `hist_*` mutants (history=True) replay bugs vLLM once shipped, each citing its PR or
issue (docs/mutation-history.md). `AddRewritten`, the base of the mutants that change one
field of the ADD, is shared with the abort and dp areas' mutants.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import msgspec

from harness.frontends.api import GREEDY, Sampling, StreamHandle
from harness.frontends.reference.core import (
    MAX_ABORT_BATCH,
    InvalidRequest,
    PendingUtility,
    ReferenceFrontendCore,
    RequestState,
    ToEngine,
)
from harness.frontends.reference.sessions import CLOSING_PROMPT, SessionError, SessionState
from harness.mutation import registry
from harness.mutation.registry import VLLM, mutant
from harness.protocol.lifecycle import Event
from harness.protocol.vocab import EOS_TOKEN_ID, detokenize
from harness.protocol.wire import ProtocolError, WireCodec
from harness.protocol.wire import messages as m
from harness.protocol.wire.codec import AddRequest


@mutant("abort_finished_ids", "finished ids aborted on drop")
class AbortFinishedIds(ReferenceFrontendCore):
    """Remembers ended requests (engine death included) and still aborts them when their
    stream is dropped, in a frame of their own after the drain pass's."""

    def drain_drops(self) -> list[ToEngine]:
        late: dict[int, list[str]] = {}
        for rid in self.pending_drops[:MAX_ABORT_BATCH]:
            state = self.request(rid)
            if state is not None and not state.phase.live:
                late.setdefault(state.rank, []).append(rid)
        return super().drain_drops() + self.abort_frames(late)


@mutant("stop_string_not_aborted", "stop-string match not aborted at the engine")
class StopStringNotAborted(ReferenceFrontendCore):
    """A stop-string match ends the stream as if the engine had finished it: no ABORT."""

    def end_at_stop(self, state: RequestState, engine_finished: bool) -> None:
        self._finish(state.request_id, Event.FINAL_OUTPUT, "stop")


@mutant("client_index_on_add_wrong", "ADDs carry client_index 1")
class ClientIndexOnAddOnly(ReferenceFrontendCore):
    """ADDs carry client_index 1 (a copy-pasted API-server index), utilities 0."""

    def add_request(self, prompt: Sequence[int], max_tokens: int,
                    **options: Any) -> tuple[StreamHandle, ToEngine]:
        self.client_index = 1
        try:
            return super().add_request(prompt, max_tokens, **options)
        finally:
            self.client_index = 0


@mutant("stop_found_by_truthiness", "a stop string at character 0 is not a match")
class StopFoundByTruthiness(ReferenceFrontendCore):
    """`if text.find(stop):` - a match at character 0 counts as 'not found'."""

    def find_stop(self, text: str, stop: str, floor: int = 0) -> int:
        pos = super().find_stop(text, stop, floor)
        return pos if pos > 0 else -1


@mutant("stop_found_last", "text truncated at the last occurrence of a stop string")
class StopFoundLast(ReferenceFrontendCore):
    """Truncates at the LAST occurrence of a stop string (rfind) instead of the first."""

    def find_stop(self, text: str, stop: str, floor: int = 0) -> int:
        pos = text.rfind(stop)
        return pos if pos + len(stop) > floor else -1


@mutant("stop_buffer_one_short", "stop-string hold-back one character too short")
class StopBufferOneShort(ReferenceFrontendCore):
    """Holds back len(stop) - 2 characters, one too few: a stop string's first character
    can be released before the token completing it arrives."""

    hold_back_extra = -1

    def hold_back(self, state: RequestState) -> int:
        return max(0, super().hold_back(state) + self.hold_back_extra)


@mutant("stop_buffer_one_long", "stop-string hold-back one character too long")
class StopBufferOneLong(StopBufferOneShort):
    """Holds back len(stop) characters, one too many: text reaches the client late."""

    hold_back_extra = 1


@mutant("final_chunk_released_early", "held text of a final output released at its "
        "first token")
class FinalChunkReleasedAtFirstToken(ReferenceFrontendCore):
    """On the engine's final output, releases all held text at the chunk's FIRST token (a
    port that checks `output.finished` instead of 'last token of the final output')."""

    def releases_held_text(self, output: m.EngineCoreOutput, index: int) -> bool:
        return output.finished


@mutant("unmatched_final_output_swallowed", "a final output without a stop match never "
        "ends the stream")
class UnmatchedFinalOutputSwallowed(ReferenceFrontendCore):
    """Treats every output that went through stop-string matching as consumed: a final
    output without a match never ends the stream."""

    def deliver_until_stop(self, state: RequestState, output: m.EngineCoreOutput) -> bool:
        super().deliver_until_stop(state, output)
        return True


@mutant("retired_stream_closed_silently", "a request retired without a final output ends "
        "with no reason and no error")
class RetiredStreamClosedSilently(ReferenceFrontendCore):
    """A request retired by finished_requests without a final output ends with no reason
    and no error: the client cannot tell it from a clean end."""

    def retired_without_output(self, rid: str) -> None:
        self._finish(rid, Event.FINAL_OUTPUT, None)


@mutant("session_max_tokens_dropped", "session ADDs carry a default max_tokens")
class SessionMaxTokensDropped(ReferenceFrontendCore):
    """Session ADDs (first segment and continuations) go out without the client's
    max_tokens: the engine applies its own default."""

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> ToEngine:
        identity, frames = super().session_add(rid, prompt, 16, resumable=resumable)
        return identity, frames

    def open_session(self, prompt: Sequence[int], max_tokens: int, *,
                     data_parallel_rank: int | None = None,
                     sampling: Sampling = GREEDY) -> tuple[StreamHandle, ToEngine]:
        return super().open_session(prompt, 16, data_parallel_rank=data_parallel_rank,
                                    sampling=sampling)


@mutant("session_rank_ignored", "a session's data_parallel_rank ignored")
class SessionRankIgnored(ReferenceFrontendCore):
    """A session's first segment is routed as usual, ignoring the client's
    data_parallel_rank."""

    def open_session(self, prompt: Sequence[int], max_tokens: int, *,
                     data_parallel_rank: int | None = None,
                     sampling: Sampling = GREEDY) -> tuple[StreamHandle, ToEngine]:
        return super().open_session(prompt, max_tokens, sampling=sampling)


@mutant("continuation_default_sampling", "continuations carry default sampling params")
class ContinuationDefaultSampling(ReferenceFrontendCore):
    """Continuations are built with a fresh SamplingParams carrying only max_tokens: the
    session's temperature and EOS/stop token ids are lost after the first segment."""

    def session_sampling(self, max_tokens: int, sampling: Sampling) -> m.SamplingParams:
        return m.SamplingParams(max_tokens=max_tokens)


@mutant("continuation_without_external_id", "continuations carry no external_req_id")
class ContinuationWithoutExternalId(ReferenceFrontendCore):
    """Continuations leave external_req_id unset (only the first ADD names it)."""

    def session_request(self, rid: str, prompt: Sequence[int], sampling: m.SamplingParams,
                        *, resumable: bool) -> m.EngineCoreRequest:
        request = super().session_request(rid, prompt, sampling, resumable=resumable)
        return msgspec.structs.replace(request, external_req_id=None)


@mutant("continuation_wave_unstamped", "continuations carry current_wave 0")
class ContinuationWaveUnstamped(ReferenceFrontendCore):
    """Continuations leave current_wave at its default: only fresh ADDs are stamped."""

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> ToEngine:
        wave, self.current_wave = self.current_wave, 0
        try:
            return super().session_add(rid, prompt, max_tokens, resumable=resumable)
        finally:
            self.current_wave = wave


@mutant("session_failure_is_segment_boundary", "an engine ABORT/ERROR of a session's "
        "segment keeps its stream open")
class SessionFailureIsSegmentBoundary(ReferenceFrontendCore):
    """Every finish of a session's segment is a boundary, engine ABORT and ERROR too: a
    failed session's stream waits for an input close that may never come."""

    def segment_continues(self, state: RequestState, output: m.EngineCoreOutput) -> bool:
        session: SessionState | None = state.session
        if session is not None and output.finish_reason in (m.FinishReason.ABORT,
                                                            m.FinishReason.ERROR):
            session.segments_running = max(0, session.segments_running - 1)
            return not (session.closing and session.segments_running == 0)
        return super().segment_continues(state, output)


@mutant("segments_in_flight_not_counted", "a session's running segments tracked as a "
        "flag, not a count")
class SegmentsInFlightNotCounted(ReferenceFrontendCore):
    """A continuation marks the session 'running' (a flag, not a count): with two segments
    in flight, the first finish makes a later close end the stream at once."""

    def continue_session(self, rid: str, prompt: Sequence[int], max_tokens: int
                         ) -> list[ToEngine]:
        sends = super().continue_session(rid, prompt, max_tokens)
        self.open_session_state(rid).segments_running = 1
        return sends


@mutant("continuation_after_close_sent", "a continuation after the input's close is "
        "sent")
class ContinuationAfterCloseSent(ReferenceFrontendCore):
    """Checks only that the id is a session, not that its input is still open: a
    continuation after the close goes out to the engine."""

    def continue_session(self, rid: str, prompt: Sequence[int], max_tokens: int
                         ) -> list[ToEngine]:
        state = self.requests.get(rid)
        if state is not None and state.session is not None and state.session.closing:
            state.session.segments_running += 1
            return [self.session_add(rid, prompt, max_tokens, resumable=True)]
        return super().continue_session(rid, prompt, max_tokens)


@mutant("continuation_of_any_live_request", "a continuation accepted for a plain "
        "request")
class ContinuationOfAnyLiveRequest(ReferenceFrontendCore):
    """Accepts a continuation for any live request id, session or not."""

    def continue_session(self, rid: str, prompt: Sequence[int], max_tokens: int
                         ) -> list[ToEngine]:
        state = self.requests.get(rid)
        if state is not None and state.session is None:
            return [self.session_add(rid, prompt, max_tokens, resumable=True)]
        return super().continue_session(rid, prompt, max_tokens)


@mutant("ended_session_still_continuable", "a continuation of an ended session is sent")
class EndedSessionStillContinuable(ReferenceFrontendCore):
    """Looks sessions up among ended requests too: a continuation of an ended session is
    sent to the engine it lived on."""

    def continue_session(self, rid: str, prompt: Sequence[int], max_tokens: int
                         ) -> list[ToEngine]:
        ended = self.request(rid)
        if rid not in self.requests and ended is not None and ended.session is not None:
            return [self.session_add(rid, prompt, max_tokens, resumable=True)]
        return super().continue_session(rid, prompt, max_tokens)


class AddRewritten(ReferenceFrontendCore):
    """Base: the ADD the reference builds, with one field changed by `rewrite`."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        raise NotImplementedError

    def register_request(self, prompt: Sequence[int], max_tokens: int, *,
                         data_parallel_rank: int | None = None,
                         stop: Sequence[str] | None = None, request_id: str | None = None,
                         params: Mapping[str, Any] | None = None, resumable: bool = False,
                         sampling: Sampling = GREEDY) -> tuple[StreamHandle, ToEngine]:
        handle, (identity, frames) = super().register_request(
            prompt, max_tokens, data_parallel_rank=data_parallel_rank, stop=stop,
            request_id=request_id, params=params, resumable=resumable, sampling=sampling)
        decoded = self.codec.decode_engine_input(frames)
        assert isinstance(decoded, AddRequest)
        return handle, (identity, self.codec.encode_add(self.rewrite(decoded.request)))


@mutant("add_without_eos", "ADDs carry no EOS token id")
class AddWithoutEos(AddRewritten):
    """The tokenizer's EOS id is never copied into SamplingParams: no _eos_token_id and
    no _all_stop_token_ids, so the engine cannot stop at end of sequence."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        assert request.sampling_params is not None
        sampling = msgspec.structs.replace(request.sampling_params, _eos_token_id=None,
                                           _all_stop_token_ids=set())
        return msgspec.structs.replace(request, sampling_params=sampling)


@mutant("add_default_temperature", "ADDs carry temperature 1.0 for a greedy request")
class AddDefaultTemperature(AddRewritten):
    """The client's temperature 0 is not copied: the struct default (1.0) goes out and
    the engine samples instead of decoding greedily."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        assert request.sampling_params is not None
        sampling = msgspec.structs.replace(request.sampling_params, temperature=1.0)
        return msgspec.structs.replace(request, sampling_params=sampling)


@mutant("add_without_external_id", "ADDs carry no external_req_id")
class AddWithoutExternalId(AddRewritten):
    """external_req_id is left unset: the engine never learns the user's request id."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        return msgspec.structs.replace(request, external_req_id=None)


@mutant("request_error_message_dropped", "an engine's RequestError message never "
        "reaches the client")
class RequestErrorMessageDropped(ReferenceFrontendCore):
    """The RequestError payload of an ERROR output is ignored: the client gets a generic
    failure instead of the engine's message for the user."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.error is not None:
            output = msgspec.structs.replace(output, error=None)
        super().on_request_output(output)


@mutant("embeds_copied_into_extra_args", "prompt_embeds also copied into extra_args")
class EmbedsCopiedIntoExtraArgs(ReferenceFrontendCore):
    """Every generate() param except cache_salt is copied into extra_args, prompt_embeds
    included: the tensor travels twice, once as a list of floats in SamplingParams."""

    def pass_through(self, params: Mapping[str, Any] | None
                     ) -> tuple[dict[str, Any] | None, str | None]:
        fields = dict(params or {})
        cache_salt = fields.pop("cache_salt", None)
        return (fields or None), cache_salt


@mutant("held_text_lost_at_finish", "stop-string hold-back text dropped when the "
        "engine ends the stream without a token")
class HeldTextLostAtFinish(ReferenceFrontendCore):
    """Text held back for a stop string is discarded when the stream ends any other way
    than through a token (an engine ABORT or ERROR without tokens, an abort)."""

    def _finish(self, rid: str, event: Event, reason: str | None,
                error: str | None = None) -> None:
        state = self.requests.get(rid)
        if state is not None:
            state.held_text = ""
        super()._finish(rid, event, reason, error)


@mutant("session_refusals_unexplained", "a refused continuation or close does not say "
        "why (no session vs. closing)")
class SessionRefusalsUnexplained(ReferenceFrontendCore):
    """Every refused continuation or close gets the same bare text: "no such session" and
    "input already closing" cannot be told apart."""

    def open_session_state(self, rid: str) -> SessionState:
        try:
            return super().open_session_state(rid)
        except SessionError:
            raise SessionError("request refused") from None


@mutant("hist_stop_first_listed",
        "of two stop strings completing in one token, the "
        "first listed wins, not the earliest in the text",
        source=VLLM + "pull/50200",
        history=True)
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
                    registry.fired("hist_stop_first_listed")
                return pos
        return -1


@mutant("hist_stop_at_token_end_only", "a stop string matches only where the text ends "
        "(aligned to a token end)", source=VLLM + "pull/3672", history=True)
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
                    registry.fired("hist_stop_at_token_end_only")
                return len(text) - len(stop)
        if first >= 0:
            registry.fired("hist_stop_at_token_end_only")
        return -1


@mutant("hist_stop_no_holdback", "no text held back for stop strings: the start of one "
        "spanning tokens is streamed", source=VLLM + "pull/3672", history=True)
class StopNoHoldback(ReferenceFrontendCore):
    """vLLM PR #3672 (second bug: "stop string not being excluded properly from output when
    it spans multiple tokens ... primarily a problem when streaming output"): no text was
    held back, so the first tokens of a stop string spanning several were already streamed
    when its last token completed it; only the last token's part was cut."""

    def hold_back(self, state: RequestState) -> int:
        if super().hold_back(state) > 0:
            registry.fired("hist_stop_no_holdback")  # the reference would hold characters back
        return 0


@mutant("hist_prompt_text_leaked", "the prompt's text leaks into the first streamed "
        "delta", source=VLLM + "issues/48853", history=True)
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
                registry.fired("hist_prompt_text_leaked")
                state.handle.text += leaked
        super().on_request_output(output)


@mutant("hist_kv_params_not_forwarded",
        "kv_transfer_params never reaches the ADD",
        source=VLLM + "pull/42644",
        history=True)
class KvParamsNotForwarded(ReferenceFrontendCore):
    """vLLM PR #42644 ("[Bugfix] Thread kv_transfer_params into engine for
    /inference/v1/generate (disagg)") and PR #38094: the request's kv_transfer_params was
    parsed but never put into SamplingParams.extra_args, so the engine never saw it (PD
    disaggregation silently re-prefilled); ec_transfer_params and cache_salt went through."""

    def pass_through(self, params: Mapping[str, Any] | None
                     ) -> tuple[dict[str, Any] | None, str | None]:
        fields = dict(params or {})
        if fields.pop("kv_transfer_params", None) is not None:
            registry.fired("hist_kv_params_not_forwarded")
        return super().pass_through(fields)


@mutant("hist_session_abort_is_boundary", "an engine ABORT of a session's segment is "
        "taken as a segment boundary", source=VLLM + "pull/53861", history=True)
class SessionAbortIsBoundary(ReferenceFrontendCore):
    """vLLM PR #53861 ("[Bugfix] Harden streaming-input session lifecycle", bug 2: "An
    engine-side ABORT/ERROR is treated like a normal chunk boundary ... Masking them leaves
    the consumer waiting forever"), as a port that fixed ERROR only: an engine ABORT of a
    session's segment is still taken as a segment boundary and the stream stays open."""

    def segment_continues(self, state: RequestState, output: m.EngineCoreOutput) -> bool:
        session = state.session
        if session is None or output.finish_reason is not m.FinishReason.ABORT:
            return super().segment_continues(state, output)
        registry.fired("hist_session_abort_is_boundary")
        session.segments_running = max(0, session.segments_running - 1)
        session.last_reason = str(output.finish_reason)
        return not (session.closing and session.segments_running == 0)


@mutant("hist_stop_within_min_tokens", "a stop string within the first min_tokens "
        "tokens ends the request", source=VLLM + "pull/22014", history=True)
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
                registry.fired("hist_stop_within_min_tokens")
        return True


@mutant("hist_empty_prompt_sent",
        "an empty prompt is sent to the engine",
        source=VLLM + "pull/7746",
        history=True)
class EmptyPromptSent(ReferenceFrontendCore):
    """vLLM issue #7632 / PR #7746 ("[BugFix] Fix server crash on empty prompt"): an empty
    prompt reached the engine (`assert num_new_tokens > 0`) and took the whole engine down;
    the frontends now refuse it at submission (Python's input processor, vllm-rs
    `EmptyPromptTokenIds`, whose HTTP mapping PR #45035 fixed). Here: it is sent."""

    def check_request(self, prompt: Sequence[int], max_tokens: int,
                      sampling: Sampling) -> None:
        if not prompt:
            registry.fired("hist_empty_prompt_sent")
            return
        super().check_request(prompt, max_tokens, sampling)


@mutant("hist_prompt_over_context_sent", "a prompt longer than max_model_len is sent "
        "to the engine", source=VLLM + "pull/45035", history=True)
class PromptOverContextSent(ReferenceFrontendCore):
    """vLLM PR #45035 ("[Bugfix][Rust Frontend] Return 400 for empty or over-length
    completion prompts") and the prompt-length check of Python's input processor: a prompt
    longer than the model's max_model_len must be refused before the engine sees it. Here:
    the length is never compared with max_model_len."""

    def check_request(self, prompt: Sequence[int], max_tokens: int,
                      sampling: Sampling) -> None:
        limit = self.config.max_model_len
        if limit is not None and len(prompt) >= limit:
            registry.fired("hist_prompt_over_context_sent")
            prompt = prompt[:limit - 1]  # what the reference's own check then lets through
        super().check_request(prompt, max_tokens, sampling)


@mutant("hist_min_tokens_over_max_sent", "a request with min_tokens above max_tokens is "
        "sent to the engine", source=VLLM + "issues/4365", history=True)
class MinTokensOverMaxSent(ReferenceFrontendCore):
    """vLLM issue #4365 ("When I specify max-tokens and min-tokens at the same time, the
    service reports an error in _apply_min_tokens_penalty"): a request whose min_tokens
    exceeds max_tokens reached the sampler and failed there; SamplingParams now refuses it
    (and vllm-rs `MinTokensExceedsMaxTokens`). Here: it is sent."""

    def check_request(self, prompt: Sequence[int], max_tokens: int,
                      sampling: Sampling) -> None:
        if sampling.min_tokens > max_tokens:
            registry.fired("hist_min_tokens_over_max_sent")
            sampling = dataclasses.replace(sampling, min_tokens=max_tokens)
        super().check_request(prompt, max_tokens, sampling)


@mutant("segment_finish_ends_session", "a segment's finish ends the session's stream")
class SegmentFinishEndsSession(ReferenceFrontendCore):
    """Every finish ends the stream: segment boundaries are taken for the request's end."""

    def segment_continues(self, state: RequestState, output: m.EngineCoreOutput) -> bool:
        return False


@mutant("continuation_new_id", "a continuation goes out under a fresh request id")
class ContinuationNewId(ReferenceFrontendCore):
    """A continuation goes out under a fresh request id (treated as a new request)."""

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> ToEngine:
        identity, frames = super().session_add(rid, prompt, max_tokens, resumable=resumable)
        message = self.codec.decode_engine_input(frames)
        if not resumable or not isinstance(message, AddRequest):
            return identity, frames
        renamed = msgspec.structs.replace(message.request, request_id=f"{rid}-cont")
        return identity, self.codec.encode_add(renamed)


@mutant("continuation_not_resumable", "continuations are not marked resumable")
class ContinuationNotResumable(ReferenceFrontendCore):
    """Only the first ADD is marked resumable; continuations go out as plain ADDs."""

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> ToEngine:
        continuation = tuple(prompt) != CLOSING_PROMPT
        return super().session_add(rid, prompt, max_tokens,
                                   resumable=resumable and not continuation)


@mutant("continuation_routed_fresh", "a continuation is routed away from its session")
class ContinuationRoutedFresh(ReferenceFrontendCore):
    """A continuation is load-balanced like a new request instead of following the
    engine that holds the session."""

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> ToEngine:
        state = self.requests[rid]
        owner = state.rank
        state.rank = next(r for r in sorted(self.engines, key=lambda r: (r == owner, r)))
        try:
            return super().session_add(rid, prompt, max_tokens, resumable=resumable)
        finally:
            state.rank = owner


@mutant("close_ends_at_once", "closing the input ends the stream before the running "
        "segment finishes")
class CloseEndsAtOnce(ReferenceFrontendCore):
    """Closing the input ends the stream at once, even while a segment still runs."""

    def close_session(self, rid: str) -> list[ToEngine]:
        sends = super().close_session(rid)
        if rid in self.requests:
            self._finish(rid, Event.FINAL_OUTPUT, "stop")
        return sends


def _codec_with_threshold(codec: WireCodec, threshold: int) -> WireCodec:
    """The driver's codec with another zero-copy threshold (the one rule these break)."""
    return WireCodec(dataclasses.replace(codec.profile, zero_copy_threshold=threshold))


@mutant("tensors_inline", "large input tensors inlined (no aux frame)")
class TensorsInline(ReferenceFrontendCore):
    """No aux frames on the way in: every tensor is inlined as ext(3), however large."""

    def __init__(self, ranks: Sequence[int], *, codec: WireCodec) -> None:
        super().__init__(ranks, codec=_codec_with_threshold(codec, 1 << 40))


@mutant("tensors_always_aux", "small input tensors sent as aux frames")
class TensorsAlwaysAux(ReferenceFrontendCore):
    """Every tensor goes out as an aux frame, even below the zero-copy threshold."""

    def __init__(self, ranks: Sequence[int], *, codec: WireCodec) -> None:
        super().__init__(ranks, codec=_codec_with_threshold(codec, 0))


@mutant("sampling_values_dropped", "top_p, top_k, min_p and seed never reach the ADD")
class SamplingValuesDropped(ReferenceFrontendCore):
    """A port grown from greedy requests copies only what those needed (temperature, the
    EOS rule, max_tokens): top_p, top_k, min_p and seed stay at the struct's defaults."""

    def sampling_params(self, max_tokens: int, sampling: Sampling,
                        extra_args: dict[str, Any] | None = None) -> m.SamplingParams:
        kept = replace(GREEDY, temperature=sampling.temperature,
                       ignore_eos=sampling.ignore_eos, min_tokens=sampling.min_tokens,
                       stop_token_ids=sampling.stop_token_ids)
        return super().sampling_params(max_tokens, kept, extra_args)


@mutant("seed_zero_dropped", "a seed of 0 sent as no seed")
class SeedZeroDropped(ReferenceFrontendCore):
    """`seed = asked.seed or None`: a seed of 0 is taken for "no seed" and the engine
    samples unseeded (a truthiness test on an optional int)."""

    def sampling_params(self, max_tokens: int, sampling: Sampling,
                        extra_args: dict[str, Any] | None = None) -> m.SamplingParams:
        return super().sampling_params(max_tokens, replace(sampling, seed=sampling.seed or None),
                                       extra_args)


@mutant("sampling_of_first_request", "every non-greedy request carries the first one's "
        "sampling")
class SamplingOfFirstRequest(ReferenceFrontendCore):
    """The SamplingParams of the first non-greedy request is built once and shared: every
    later non-greedy request goes out with the first one's values."""

    first: Sampling | None = None

    def sampling_params(self, max_tokens: int, sampling: Sampling,
                        extra_args: dict[str, Any] | None = None) -> m.SamplingParams:
        if sampling != GREEDY:
            self.first = self.first or sampling
            sampling = self.first
        return super().sampling_params(max_tokens, sampling, extra_args)


@mutant("ignore_eos_still_stops", "ignore_eos requests still carry the EOS id")
class IgnoreEosStillStops(ReferenceFrontendCore):
    """ignore_eos is copied, but the model's EOS id is set as _eos_token_id all the same:
    the engine still stops at end of sequence."""

    def sampling_params(self, max_tokens: int, sampling: Sampling,
                        extra_args: dict[str, Any] | None = None) -> m.SamplingParams:
        built = super().sampling_params(max_tokens, sampling, extra_args)
        return msgspec.structs.replace(built, _eos_token_id=EOS_TOKEN_ID)


@mutant("stop_ids_not_among_all_stop", "the client's stop token ids left out of "
        "_all_stop_token_ids")
class StopIdsNotAmongAllStop(ReferenceFrontendCore):
    """The client's stop token ids go into stop_token_ids only, not _all_stop_token_ids:
    the engine's min_tokens rule then lets them through before min_tokens."""

    def sampling_params(self, max_tokens: int, sampling: Sampling,
                        extra_args: dict[str, Any] | None = None) -> m.SamplingParams:
        built = super().sampling_params(max_tokens, sampling, extra_args)
        return msgspec.structs.replace(built, _all_stop_token_ids={EOS_TOKEN_ID})


@mutant("min_tokens_dropped", "min_tokens never reaches the ADD")
class MinTokensDropped(ReferenceFrontendCore):
    """min_tokens never reaches the ADD (0): the engine may stop before it."""

    def sampling_params(self, max_tokens: int, sampling: Sampling,
                        extra_args: dict[str, Any] | None = None) -> m.SamplingParams:
        return super().sampling_params(max_tokens, replace(sampling, min_tokens=0), extra_args)


@mutant("continuation_greedy", "continuations built greedy whatever the session asked")
class ContinuationGreedy(ReferenceFrontendCore):
    """A session's continuations are built greedy (with the EOS rule right), whatever the
    client asked when it opened the session."""

    def session_sampling(self, max_tokens: int, sampling: Sampling) -> m.SamplingParams:
        return self.sampling_params(max_tokens, GREEDY)


@mutant("plain_adds_resumable", "every ADD marked resumable")
class PlainAddsResumable(AddRewritten):
    """Every ADD is marked resumable (a port that always sets the flag its streaming-input
    path needs): a real engine keeps each finished request waiting for more input."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        return msgspec.structs.replace(request, resumable=True)


@mutant("arrival_time_milliseconds", "arrival_time in milliseconds")
class ArrivalTimeMilliseconds(AddRewritten):
    """arrival_time in milliseconds (a JavaScript-style clock): the scheduler's
    (priority, arrival_time) order puts this frontend's requests behind every other's."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        return msgspec.structs.replace(request, arrival_time=request.arrival_time * 1000)


@mutant("arrival_time_monotonic", "arrival_time from the monotonic clock")
class ArrivalTimeMonotonic(AddRewritten):
    """arrival_time from the monotonic clock (seconds since boot), not Unix time."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        return msgspec.structs.replace(request, arrival_time=time.monotonic())


@mutant("stop_token_text_shown", "the stop token of an engine STOP shown in the text")
class StopTokenTextShown(ReferenceFrontendCore):
    """Every token's text is shown, the stop token of an engine STOP too (the text is
    the tokens' texts joined, with no exception for the terminal stop token)."""

    def token_text(self, output: m.EngineCoreOutput, index: int) -> str:
        return detokenize([output.new_token_ids[index]])


@mutant("continuation_first_max_tokens", "continuations carry the session's first "
        "max_tokens")
class ContinuationFirstMaxTokens(ReferenceFrontendCore):
    """Every continuation carries the max_tokens the session was opened with, not its own
    (a port that builds a session's SamplingParams once)."""

    def __init__(self, ranks: Sequence[int], *, codec: WireCodec, client_index: int = 0
                 ) -> None:
        super().__init__(ranks, codec=codec, client_index=client_index)
        self.first_max_tokens: dict[str, int] = {}

    def open_session(self, prompt: Sequence[int], max_tokens: int, *,
                     data_parallel_rank: int | None = None,
                     sampling: Sampling = GREEDY) -> tuple[StreamHandle, ToEngine]:
        handle, send = super().open_session(prompt, max_tokens,
                                            data_parallel_rank=data_parallel_rank,
                                            sampling=sampling)
        if handle.request_id is not None:
            self.first_max_tokens[handle.request_id] = max_tokens
        return handle, send

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> ToEngine:
        first = self.first_max_tokens.get(rid, max_tokens) if resumable else max_tokens
        return super().session_add(rid, prompt, first, resumable=resumable)


@mutant("stop_min_tokens_by_match_start", "with min_tokens, a stop string must start "
        "after the first min_tokens tokens")
class StopMinTokensByMatchStart(ReferenceFrontendCore):
    """min_tokens read as "a stop string must START after the first min_tokens tokens":
    a match that begins inside them and completes later is missed (vLLM checks where the
    match ENDS, detokenizer.py:136-139)."""

    def find_stop(self, text: str, stop: str, floor: int = 0) -> int:
        return text.find(stop, floor)


@mutant("stop_min_tokens_off_by_one", "stop strings checked from token min_tokens, not "
        "min_tokens + 1")
class StopMinTokensOffByOne(ReferenceFrontendCore):
    """Stop strings checked from token min_tokens on instead of min_tokens + 1 (`>=` for
    `>`): the last token of the client's minimum can end the request."""

    def stop_checked(self, state: RequestState) -> bool:
        count = len(state.handle.tokens) + 1
        if count + 1 == state.min_tokens:
            state.stop_floor = len(state.handle.text) + len(state.held_text)
        return count >= state.min_tokens


@mutant("prompt_limit_of_largest_engine", "a prompt checked against the largest "
        "max_model_len, not the agreed minimum")
class PromptLimitOfLargestEngine(ReferenceFrontendCore):
    """A prompt's length checked against the largest max_model_len an engine reported,
    not the agreed minimum: a prompt only the larger engines could hold is sent."""

    def check_request(self, prompt: Sequence[int], max_tokens: int,
                      sampling: Sampling) -> None:
        largest = max((e.ready.max_model_len for e in self.engines.values()
                       if e.ready is not None), default=None)
        agreed, self.config.max_model_len = self.config.max_model_len, largest
        try:
            super().check_request(prompt, max_tokens, sampling)
        finally:
            self.config.max_model_len = agreed


@mutant("prompt_filling_context_sent", "a prompt exactly max_model_len long is sent "
        "(no room left for one output token)")
class PromptFillingContextSent(ReferenceFrontendCore):
    """A prompt exactly max_model_len long sent (`>` for `>=`): it leaves no room for the
    one token a generate request must produce (corewire's own reference had this bug)."""

    def check_request(self, prompt: Sequence[int], max_tokens: int,
                      sampling: Sampling) -> None:
        limit = self.config.max_model_len
        if limit is not None and len(prompt) == limit:
            prompt = prompt[:-1]  # checked as if one token shorter
        super().check_request(prompt, max_tokens, sampling)


@mutant("min_tokens_equal_max_refused", "min_tokens equal to max_tokens refused")
class MinTokensEqualMaxRefused(ReferenceFrontendCore):
    """min_tokens equal to max_tokens refused as if it were above it (`>=` for `>`)."""

    def check_request(self, prompt: Sequence[int], max_tokens: int,
                      sampling: Sampling) -> None:
        if sampling.min_tokens and sampling.min_tokens >= max_tokens:
            raise InvalidRequest(f"min_tokens {sampling.min_tokens} not below max_tokens "
                                 f"{max_tokens}")
        super().check_request(prompt, max_tokens, sampling)


F = m.FinishReason


@mutant("final_tokens_dropped", "tokens of a final output dropped")
class FinalTokensDropped(ReferenceFrontendCore):
    """Ends the stream on a final output before appending the tokens it carries."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finished and output.new_token_ids:
            output.new_token_ids = []
        super().on_request_output(output)


@mutant("engine_abort_ignored", "engine-side ABORT leaves the stream open")
class EngineAbortIgnored(ReferenceFrontendCore):
    """Treats FinishReason.ABORT as 'the client aborted, nothing to do': stream stays open."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is F.ABORT:
            output.finish_reason = None
        super().on_request_output(output)


@mutant("error_without_payload_is_abort", "ERROR without a RequestError reported as abort")
class ErrorWithoutPayloadIsAbort(ReferenceFrontendCore):
    """Reports ERROR as an error only when a RequestError payload comes with it."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is F.ERROR and output.error is None:
            output.finish_reason = F.ABORT
        super().on_request_output(output)


@mutant("eos_reported_as_length", "STOP without stop_reason (EOS) reported as length")
class EosReportedAsLength(ReferenceFrontendCore):
    """Maps STOP to 'stop' only when a stop_reason is set (EOS has none)."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is F.STOP and output.stop_reason is None:
            output.finish_reason = F.LENGTH
        super().on_request_output(output)


@mutant("stop_token_hidden", "the stop token id removed from the stream")
class StopTokenHidden(ReferenceFrontendCore):
    """Drops the matched stop token id from the stream (vLLM keeps it in token_ids)."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is F.STOP and isinstance(output.stop_reason, int):
            output.new_token_ids = [t for t in output.new_token_ids if t != output.stop_reason]
        super().on_request_output(output)


@mutant("stop_string_per_chunk", "stop strings searched per chunk, not across chunks")
class StopStringPerChunk(ReferenceFrontendCore):
    """Looks for stop strings in each output's own text only, never across chunks."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        state = self.requests.get(output.request_id)
        if state is not None:
            self.__dict__["chunk_start"] = len(state.handle.text) + len(state.held_text)
        super().on_request_output(output)

    def find_stop(self, text: str, stop: str, floor: int = 0) -> int:
        start: int = self.__dict__.get("chunk_start", 0)
        return text.find(stop, max(start, floor - len(stop) + 1))


@mutant("stop_tokens_not_trimmed", "tokens after a stop string in the same chunk delivered")
class StopTokensNotTrimmed(ReferenceFrontendCore):
    """Cuts the text at a stop string but still delivers the rest of the chunk's tokens."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        state = self.requests.get(output.request_id)
        self.__dict__["chunk"] = list(output.new_token_ids)
        self.__dict__["before"] = len(state.handle.tokens) if state is not None else 0
        super().on_request_output(output)

    def end_at_stop(self, state: RequestState, engine_finished: bool) -> None:
        chunk: list[int] = self.__dict__.get("chunk", [])
        delivered = len(state.handle.tokens) - self.__dict__.get("before", 0)
        state.handle.tokens.extend(chunk[delivered:])
        super().end_at_stop(state, engine_finished)


@mutant("stop_unchecked_on_final_output", "no stop-string check on a final output")
class StopUncheckedOnFinalOutput(ReferenceFrontendCore):
    """Skips the stop-string check on an output that finishes the request anyway."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        state = self.requests.get(output.request_id)
        if state is not None and output.finished and state.stop:
            state.stop = ()
        super().on_request_output(output)


@mutant("stop_unchecked_on_first_output", "no stop-string check on the first output")
class StopUncheckedOnFirstOutput(ReferenceFrontendCore):
    """Checks stop strings only once the stream already has output (first one skipped)."""

    def stop_position(self, state: RequestState) -> int:
        if state.handle.chunks == 0:
            return -1
        return super().stop_position(state)


@mutant("unknown_id_ends_batch", "an unknown id ends the reading of a batched message")
class UnknownIdEndsBatch(ReferenceFrontendCore):
    """Stops reading a batched message at the first output for an unknown id."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        try:
            message = self.codec.decode_outputs(frames)
        except ProtocolError:
            return super().on_output(frames)
        if isinstance(message, m.EngineCoreOutputs) and message.utility_output is None:
            for i, output in enumerate(message.outputs):
                if output.request_id not in self.requests:
                    message.outputs = message.outputs[:i]
                    frames = self.codec.encode_outputs(message)
                    break
        return super().on_output(frames)


@mutant("late_outputs_appended", "outputs after a final one appended to the ended stream")
class LateOutputsAppended(ReferenceFrontendCore):
    """Keeps ended streams routable: tokens of a repeated final output are appended again."""

    def on_ended_output(self, output: m.EngineCoreOutput) -> None:
        state = self.request(output.request_id)
        if state is not None:
            state.handle.tokens.extend(output.new_token_ids)
        super().on_ended_output(output)


@mutant("empty_outputs_skipped", "outputs without tokens skipped, final ones too")
class EmptyOutputsSkipped(ReferenceFrontendCore):
    """Skips outputs without new tokens, final ones included."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.new_token_ids:
            super().on_request_output(output)


@mutant("finished_requests_ignored", "finished_requests never read")
class FinishedRequestsIgnored(ReferenceFrontendCore):
    """Never reads finished_requests: a request retired without a final output hangs."""

    def on_finished_requests(self, request_ids: Iterable[str]) -> None:
        pass


@mutant("finished_requests_before_outputs", "finished_requests applied before the outputs")
class FinishedRequestsBeforeOutputs(ReferenceFrontendCore):
    """Applies finished_requests before the outputs of the same message."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        try:
            message = self.codec.decode_outputs(frames)
        except ProtocolError:
            return super().on_output(frames)
        if isinstance(message, m.EngineCoreOutputs) and message.finished_requests:
            self.on_finished_requests(message.finished_requests)
        return super().on_output(frames)


@mutant("aux_frames_dropped", "only the first frame of a message decoded")
class AuxFramesDropped(ReferenceFrontendCore):
    """Reads only the first frame of each message (aux frames never reach the decoder)."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        return super().on_output(list(frames)[:1])


@mutant("stats_only_is_protocol_error", "a message without outputs is fatal")
class StatsOnlyIsProtocolError(ReferenceFrontendCore):
    """Takes a message without outputs for a utility reply, so stats-only ones are fatal."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        try:
            message = self.codec.decode_outputs(frames)
        except ProtocolError:
            return super().on_output(frames)
        if (isinstance(message, m.EngineCoreOutputs) and not message.outputs
                and message.utility_output is None and not message.finished_requests):
            self.mark_dead("message without outputs has no utility reply")
            return []
        return super().on_output(frames)


@mutant("error_kills_all", "a per-request ERROR ends every stream")
class ErrorKillsAllStreams(ReferenceFrontendCore):
    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is m.FinishReason.ERROR:
            for rid in list(self.requests):
                self._finish(rid, Event.FINAL_OUTPUT, "error", "request failed")
            return
        super().on_request_output(output)


@mutant("unknown_output_fatal", "an output for an unknown id kills the client")
class UnknownOutputFatal(ReferenceFrontendCore):
    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.request_id not in self.requests:
            self.mark_dead(f"output for unknown request {output.request_id}")
            return
        super().on_request_output(output)


@mutant("tokens_reordered", "tokens within a chunk reordered")
class TokensReordered(ReferenceFrontendCore):
    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        output.new_token_ids.reverse()
        super().on_request_output(output)


@mutant("finish_reasons_conflated", "every finish reported as length")
class FinishReasonsConflated(ReferenceFrontendCore):
    """Reports every non-error finish as 'length'."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is not None and output.finish_reason is not m.FinishReason.ERROR:
            output.finish_reason = m.FinishReason.LENGTH
        super().on_request_output(output)


@mutant("error_after_tokens_is_success", "ERROR after some tokens reported as length")
class ErrorAfterTokensIsSuccess(ReferenceFrontendCore):
    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        state = self.requests.get(output.request_id)
        if (state is not None and state.handle.tokens
                and output.finish_reason is m.FinishReason.ERROR):
            output.finish_reason = m.FinishReason.LENGTH
        super().on_request_output(output)


@mutant("first_output_only", "only the first output of a batched message is read")
class FirstOutputOnly(ReferenceFrontendCore):
    """Reads only the first request output of each engine message."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        message = self.codec.decode_outputs(frames)
        if isinstance(message, m.EngineCoreOutputs) and len(message.outputs) > 1:
            message.outputs = message.outputs[:1]
            frames = self.codec.encode_outputs(message)
        return super().on_output(frames)


@mutant("empty_delta_finishes", "an output without tokens ends the stream")
class EmptyDeltaFinishes(ReferenceFrontendCore):
    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if not output.new_token_ids and output.finish_reason is None:
            output.finish_reason = m.FinishReason.LENGTH
        super().on_request_output(output)


@mutant("length_reported_as_stop", "LENGTH reported as stop")
class LengthReportedAsStop(ReferenceFrontendCore):
    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is m.FinishReason.LENGTH:
            output.finish_reason = m.FinishReason.STOP
        super().on_request_output(output)


@mutant("no_text", "no detokenized text")
class NoText(ReferenceFrontendCore):
    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        state = self.requests.get(output.request_id)
        super().on_request_output(output)
        if state is not None:
            state.handle.text = ""


@mutant("retired_request_dropped", "a request retired without a final output is "
        "dropped and aborted")
class RetiredRequestDropped(ReferenceFrontendCore):
    """A request the engine retired without a final output is handled like a client drop:
    its stream is closed and an ABORT goes out for an id the engine no longer has."""

    def retired_without_output(self, rid: str) -> None:
        self.queue_drop([rid])


@mutant("output_id_matched_by_prefix", "an output's id matched to a live request by "
        "prefix")
class OutputIdMatchedByPrefix(ReferenceFrontendCore):
    """An output's request id is matched loosely (the first live request whose id starts
    with it, or that it starts with): outputs of an unrelated id reach a live stream."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.request_id not in self.requests:
            for rid in self.requests:
                if rid.startswith(output.request_id) or output.request_id.startswith(rid):
                    output = msgspec.structs.replace(output, request_id=rid)
                    break
        super().on_request_output(output)
