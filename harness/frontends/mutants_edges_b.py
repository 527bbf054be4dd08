"""Mutant reference cores for the edge cases of group B (stop-string edges, explicit abort
lists, session ADDs): one realistic port bug each, mirroring a mutmut survivor's blind spot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from harness.frontends.api import GREEDY, Sampling, StreamHandle
from harness.frontends.reference.core import ReferenceFrontendCore, RequestState, Send
from harness.frontends.reference.sessions import SessionState
from harness.protocol.lifecycle import Event
from harness.protocol.wire import messages as m

# ----------------------------------------------------------------- stop-string edges


class StopFoundByTruthiness(ReferenceFrontendCore):
    """`if text.find(stop):` - a match at character 0 counts as 'not found'."""

    def find_stop(self, text: str, stop: str, floor: int = 0) -> int:
        pos = super().find_stop(text, stop, floor)
        return pos if pos > 0 else -1


class StopFoundLast(ReferenceFrontendCore):
    """Truncates at the LAST occurrence of a stop string (rfind) instead of the first."""

    def find_stop(self, text: str, stop: str, floor: int = 0) -> int:
        pos = text.rfind(stop)
        return pos if pos + len(stop) > floor else -1


class StopBufferOneShort(ReferenceFrontendCore):
    """Holds back len(stop) - 2 characters, one too few: a stop string's first character
    can be released before the token completing it arrives."""

    hold_back_extra = -1

    def hold_back(self, state: RequestState) -> int:
        return max(0, super().hold_back(state) + self.hold_back_extra)


class StopBufferOneLong(StopBufferOneShort):
    """Holds back len(stop) characters, one too many: text reaches the client late."""

    hold_back_extra = 1


class FinalChunkReleasedAtFirstToken(ReferenceFrontendCore):
    """On the engine's final output, releases all held text at the chunk's FIRST token (a
    port that checks `output.finished` instead of 'last token of the final output')."""

    def releases_held_text(self, output: m.EngineCoreOutput, index: int) -> bool:
        return output.finished


class UnmatchedFinalOutputSwallowed(ReferenceFrontendCore):
    """Treats every output that went through stop-string matching as consumed: a final
    output without a match never ends the stream."""

    def deliver_until_stop(self, state: RequestState, output: m.EngineCoreOutput) -> bool:
        super().deliver_until_stop(state, output)
        return True


class RetiredStreamClosedSilently(ReferenceFrontendCore):
    """A request retired by finished_requests without a final output ends with no reason
    and no error: the client cannot tell it from a clean end."""

    def retired_without_output(self, rid: str) -> None:
        self._finish(rid, Event.FINAL_OUTPUT, None)


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

    def explicit_abort_batch(self, request_ids: Sequence[str]) -> dict[int, list[str]]:
        live = [rid for rid in request_ids if rid in self.requests]
        first_rank = self.requests[live[0]].rank if live else None
        per_engine = super().explicit_abort_batch(request_ids)
        if first_rank is not None:
            per_engine.setdefault(first_rank, []).extend(
                rid for rid in request_ids if rid not in live)
        return per_engine


class ExplicitAbortEndsWithoutReason(ReferenceFrontendCore):
    """Ends explicitly aborted streams with no finish reason (the port treats the abort as
    'the client knows already')."""

    def _finish(self, rid: str, event: Event, reason: str | None,
                error: str | None = None) -> None:
        state = self.requests.get(rid)
        if reason == "abort" and state is not None and not state.handle.dropped:
            reason = None
        super()._finish(rid, event, reason, error)


# ----------------------------------------------------------------- session ADDs


class SessionMaxTokensDropped(ReferenceFrontendCore):
    """Session ADDs (first segment and continuations) go out without the client's
    max_tokens: the engine applies its own default."""

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> Send:
        identity, frames = super().session_add(rid, prompt, 16, resumable=resumable)
        return identity, frames

    def open_session(self, prompt: Sequence[int], max_tokens: int, *,
                     data_parallel_rank: int | None = None,
                     sampling: Sampling = GREEDY) -> tuple[StreamHandle, Send]:
        return super().open_session(prompt, 16, data_parallel_rank=data_parallel_rank,
                                    sampling=sampling)


class SessionRankIgnored(ReferenceFrontendCore):
    """A session's first segment is routed as usual, ignoring the client's
    data_parallel_rank."""

    def open_session(self, prompt: Sequence[int], max_tokens: int, *,
                     data_parallel_rank: int | None = None,
                     sampling: Sampling = GREEDY) -> tuple[StreamHandle, Send]:
        return super().open_session(prompt, max_tokens, sampling=sampling)


class ContinuationDefaultSampling(ReferenceFrontendCore):
    """Continuations are built with a fresh SamplingParams carrying only max_tokens: the
    session's temperature and EOS/stop token ids are lost after the first segment."""

    def session_sampling(self, max_tokens: int, sampling: Sampling) -> m.SamplingParams:
        return m.SamplingParams(max_tokens=max_tokens)


class ContinuationWithoutExternalId(ReferenceFrontendCore):
    """Continuations leave external_req_id unset (only the first ADD names it)."""

    def session_request(self, rid: str, prompt: Sequence[int], sampling: m.SamplingParams,
                        *, resumable: bool) -> m.EngineCoreRequest:
        request = super().session_request(rid, prompt, sampling, resumable=resumable)
        return msgspec.structs.replace(request, external_req_id=None)


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
    """Looks sessions up among ended requests too: a continuation of an ended session is
    sent to the engine it lived on."""

    def continue_session(self, rid: str, prompt: Sequence[int], max_tokens: int
                         ) -> list[Send]:
        ended = self.request(rid)
        if rid not in self.requests and ended is not None and ended.session is not None:
            return [self.session_add(rid, prompt, max_tokens, resumable=True)]
        return super().continue_session(rid, prompt, max_tokens)
