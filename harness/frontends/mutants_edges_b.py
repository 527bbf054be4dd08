"""Mutant reference cores for the edge cases of group B (stop-string edges, explicit abort
lists, session ADDs): one realistic port bug each, mirroring a mutmut survivor's blind spot.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from harness.frontends.driver import StreamHandle
from harness.frontends.reference.core import ReferenceFrontendCore, RequestState, Send
from harness.frontends.reference.sessions import SessionState
from harness.vocab import EOS_TOKEN_ID, detokenize
from harness.wire import messages as m

# ----------------------------------------------------------------- stop-string edges


class StopFoundByTruthiness(ReferenceFrontendCore):
    """`if text.find(stop):` - a match at character 0 counts as 'not found'."""

    def stop_position(self, state: RequestState) -> int:
        text = state.handle.text + state.held_text
        found = [pos for pos in (text.find(stop) for stop in state.stop) if pos > 0]
        return min(found) if found else -1


class StopFoundLast(ReferenceFrontendCore):
    """Truncates at the LAST occurrence of a stop string (rfind) instead of the first."""

    def stop_position(self, state: RequestState) -> int:
        text = state.handle.text + state.held_text
        found = [pos for pos in (text.rfind(stop) for stop in state.stop) if pos >= 0]
        return min(found) if found else -1


class StopBufferOneShort(ReferenceFrontendCore):
    """Holds back len(stop) - 2 characters, one too few: a stop string's first character
    can be released before the token completing it arrives."""

    hold_back_extra = -1

    def deliver_until_stop(self, state: RequestState, output: m.EngineCoreOutput) -> bool:
        handle = state.handle
        keep = max(0, max(len(s) for s in state.stop) - 1 + self.hold_back_extra)
        tokens = output.new_token_ids
        for i, token in enumerate(tokens):
            state.held_text += detokenize([token])
            pos = self.stop_position(state)
            if pos >= 0:
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


class StopBufferOneLong(StopBufferOneShort):
    """Holds back len(stop) characters, one too many: text reaches the client late."""

    hold_back_extra = 1


class FinalChunkReleasedAtFirstToken(ReferenceFrontendCore):
    """On the engine's final output, releases all held text at the chunk's FIRST token (a
    port that checks `output.finished` instead of 'last token of the final output')."""

    def deliver_until_stop(self, state: RequestState, output: m.EngineCoreOutput) -> bool:
        handle = state.handle
        keep = max(len(s) for s in state.stop) - 1
        for token in output.new_token_ids:
            state.held_text += detokenize([token])
            pos = self.stop_position(state)
            if pos >= 0:
                text = (handle.text + state.held_text)[len(handle.text):pos]
                state.held_text = ""
                handle.add_tokens([token], text)
                self.end_at_stop(state, engine_finished=output.finished)
                return True
            cut = len(state.held_text) if output.finished else max(
                0, len(state.held_text) - keep)
            text, state.held_text = state.held_text[:cut], state.held_text[cut:]
            handle.add_tokens([token], text)
        return False


class UnmatchedFinalOutputSwallowed(ReferenceFrontendCore):
    """Treats every output that went through stop-string matching as consumed: a final
    output without a match never ends the stream."""

    def deliver_until_stop(self, state: RequestState, output: m.EngineCoreOutput) -> bool:
        super().deliver_until_stop(state, output)
        return True


class RetiredStreamClosedSilently(ReferenceFrontendCore):
    """A request retired by finished_requests without a final output ends with no reason
    and no error: the client cannot tell it from a clean end."""

    def on_finished_requests(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self.stop_aborts.pop(rid, None)
            if self.retired_by_engine(rid):
                self._finish(rid, None)


# ----------------------------------------------------------------- explicit abort lists


class AbortStopsAtUnknownId(ReferenceFrontendCore):
    """Explicit abort stops at the first id it does not know (`break` for `continue`):
    live ids after a finished or unknown one are never aborted."""

    def abort(self, request_ids: Iterable[str]) -> list[Send]:
        ids = list(dict.fromkeys(request_ids))
        known = []
        for rid in ids:
            if rid not in self.requests:
                break
            known.append(rid)
        return super().abort(known)


class AbortListForwardedWhole(ReferenceFrontendCore):
    """Forwards the ids it does not know along with the live ones, to the engine owning
    the first live id (a port that filters only for routing, not for the frame)."""

    def abort(self, request_ids: Iterable[str]) -> list[Send]:
        self._check_alive()
        ids = list(dict.fromkeys(request_ids))
        live = [rid for rid in ids if rid in self.requests]
        if not live:
            return []
        first_rank = self.requests[live[0]].rank
        per_engine: dict[int, list[str]] = {}
        for rid in live:
            for rank in self.abort_ranks(self.requests[rid]):
                per_engine.setdefault(rank, []).append(rid)
            self._finish(rid, "abort")
        per_engine.setdefault(first_rank, []).extend(r for r in ids if r not in live)
        return self.abort_frames(per_engine)


class ExplicitAbortEndsWithoutReason(ReferenceFrontendCore):
    """Ends explicitly aborted streams with no finish reason (the port treats the abort as
    'the client knows already')."""

    def _finish(self, rid: str, reason: str | None, error: str | None = None) -> None:
        state = self.requests.get(rid)
        if reason == "abort" and state is not None and not state.handle.dropped:
            reason = None
        super()._finish(rid, reason, error)


# ----------------------------------------------------------------- session ADDs


class SessionMaxTokensDropped(ReferenceFrontendCore):
    """Session ADDs (first segment and continuations) go out without the client's
    max_tokens: the engine applies its own default."""

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> Send:
        identity, frames = super().session_add(rid, prompt, 16, resumable=resumable)
        return identity, frames

    def open_session(self, prompt: Sequence[int], max_tokens: int, *,
                     data_parallel_rank: int | None = None) -> tuple[StreamHandle, Send]:
        return super().open_session(prompt, 16, data_parallel_rank=data_parallel_rank)


class SessionRankIgnored(ReferenceFrontendCore):
    """A session's first segment is routed as usual, ignoring the client's
    data_parallel_rank."""

    def open_session(self, prompt: Sequence[int], max_tokens: int, *,
                     data_parallel_rank: int | None = None) -> tuple[StreamHandle, Send]:
        return super().open_session(prompt, max_tokens)


class ContinuationDefaultSampling(ReferenceFrontendCore):
    """Continuations are built with a fresh SamplingParams carrying only max_tokens: the
    session's temperature and EOS/stop token ids are lost after the first segment."""

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> Send:
        state = self.requests[rid]
        request = m.EngineCoreRequest(
            rid, list(prompt), None, m.SamplingParams(max_tokens=max_tokens), None,
            time.time(), None, None, None, client_index=self.client_index,
            current_wave=self.current_wave, resumable=resumable, external_req_id=rid)
        return self.engines[state.rank].identity, self.codec.encode_add(request)


class ContinuationWithoutExternalId(ReferenceFrontendCore):
    """Continuations leave external_req_id unset (only the first ADD names it)."""

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> Send:
        state = self.requests[rid]
        sampling = m.SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                    _eos_token_id=EOS_TOKEN_ID,
                                    _all_stop_token_ids={EOS_TOKEN_ID})
        request = m.EngineCoreRequest(
            rid, list(prompt), None, sampling, None, time.time(), None, None, None,
            client_index=self.client_index, current_wave=self.current_wave,
            resumable=resumable)
        return self.engines[state.rank].identity, self.codec.encode_add(request)


class ContinuationWaveUnstamped(ReferenceFrontendCore):
    """Continuations leave current_wave at its default: only fresh ADDs are stamped."""

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> Send:
        wave, self.current_wave = self.current_wave, 0
        try:
            return super().session_add(rid, prompt, max_tokens, resumable=resumable)
        finally:
            self.current_wave = wave


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


class SegmentsInFlightNotCounted(ReferenceFrontendCore):
    """A continuation marks the session 'running' (a flag, not a count): with two segments
    in flight, the first finish makes a later close end the stream at once."""

    def continue_session(self, rid: str, prompt: Sequence[int], max_tokens: int
                         ) -> list[Send]:
        sends = super().continue_session(rid, prompt, max_tokens)
        self.open_session_state(rid).segments_running = 1
        return sends


class ContinuationAfterCloseSent(ReferenceFrontendCore):
    """Checks only that the id is a session, not that its input is still open: a
    continuation after the close goes out to the engine."""

    def continue_session(self, rid: str, prompt: Sequence[int], max_tokens: int
                         ) -> list[Send]:
        state = self.requests.get(rid)
        if state is not None and state.session is not None and state.session.closing:
            state.session.segments_running += 1
            return [self.session_add(rid, prompt, max_tokens, resumable=True)]
        return super().continue_session(rid, prompt, max_tokens)


class ContinuationOfAnyLiveRequest(ReferenceFrontendCore):
    """Accepts a continuation for any live request id, session or not."""

    def continue_session(self, rid: str, prompt: Sequence[int], max_tokens: int
                         ) -> list[Send]:
        state = self.requests.get(rid)
        if state is not None and state.session is None:
            return [self.session_add(rid, prompt, max_tokens, resumable=True)]
        return super().continue_session(rid, prompt, max_tokens)


class EndedSessionStillContinuable(ReferenceFrontendCore):
    """Keeps its own table of sessions that is never cleaned when a session's stream ends:
    a continuation of an ended session is sent to the engine it lived on."""

    def open_session(self, prompt: Sequence[int], max_tokens: int, *,
                     data_parallel_rank: int | None = None) -> tuple[StreamHandle, Send]:
        handle, send = super().open_session(prompt, max_tokens,
                                            data_parallel_rank=data_parallel_rank)
        assert handle.request_id is not None
        self.__dict__.setdefault("_session_ranks", {})[handle.request_id] = \
            self.requests[handle.request_id].rank
        return handle, send

    def continue_session(self, rid: str, prompt: Sequence[int], max_tokens: int
                         ) -> list[Send]:
        ranks: dict[str, int] = self.__dict__.get("_session_ranks", {})
        if rid not in self.requests and rid in ranks:
            sampling = m.SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                        _eos_token_id=EOS_TOKEN_ID,
                                        _all_stop_token_ids={EOS_TOKEN_ID})
            request = m.EngineCoreRequest(
                rid, list(prompt), None, sampling, None, time.time(), None, None, None,
                client_index=self.client_index, current_wave=self.current_wave,
                resumable=True, external_req_id=rid)
            return [(self.engines[ranks[rid]].identity, self.codec.encode_add(request))]
        return super().continue_session(rid, prompt, max_tokens)
