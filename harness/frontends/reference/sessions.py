"""Streaming-input sessions of the reference frontend (vLLM's `resumable` requests).

A session is ONE engine-side request fed in segments: the first ADD and every continuation
carry `resumable=True` and the same request id (vLLM 0.33.0 async_llm.py:649-666), the
engine finishes each segment with a finish reason that does NOT end the client's stream
(output_processor.py:844-876), and a final non-resumable ADD with the same id closes the
input (async_llm.py:680-686). An abort of a session goes to every engine, because a
continuation in flight may have re-created it anywhere (core_client.py:1887-1895).

The rules live in this mixin so each one is a small method a mutant can override; the
reference core (core.py) mixes it in and calls the hooks from its generic paths.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.frontends.api import GREEDY, FrontendError, Sampling, StreamHandle
from harness.protocol.lifecycle import Event
from harness.protocol.wire import WireCodec
from harness.protocol.wire import messages as m

if TYPE_CHECKING:
    from harness.frontends.reference.state import EngineState, RequestState, ToEngine

# The final ADD's prompt: the engine ignores the prompt of a non-resumable ADD for a live
# session (StreamingUpdate.from_request returns None), so any valid token list does.
CLOSING_PROMPT = (0,)


class SessionError(FrontendError):
    """A continuation or close for a request that has no open streaming-input session."""


@dataclass
class SessionState:
    """Where a session stands: segments sent and not yet finished, input closed or not."""

    segments_running: int = 1
    closing: bool = False
    last_reason: str | None = None  # the finish reason of the latest finished segment
    sampling: Sampling = GREEDY  # the client's, from open_session: every segment keeps it


class SessionRules:
    """Session rules of `ReferenceFrontendCore` (which provides the attributes below)."""

    engines: dict[int, EngineState]
    requests: dict[str, RequestState]
    codec: WireCodec
    client_index: int
    current_wave: int

    def _check_alive(self) -> None:
        raise NotImplementedError

    def request(self, rid: str) -> RequestState | None:
        raise NotImplementedError

    def _finish(self, rid: str, event: Event, reason: str | None,
                error: str | None = None) -> None:
        raise NotImplementedError

    def register_request(self, prompt: Sequence[int], max_tokens: int, *,
                         data_parallel_rank: int | None = None, resumable: bool = False,
                         sampling: Sampling = GREEDY) -> tuple[StreamHandle, ToEngine]:
        raise NotImplementedError

    def sampling_params(self, max_tokens: int, sampling: Sampling) -> m.SamplingParams:
        raise NotImplementedError

    # ------------------------------------------------------------ client surface

    def open_session(self, prompt: Sequence[int], max_tokens: int, *,
                     data_parallel_rank: int | None = None,
                     sampling: Sampling = GREEDY) -> tuple[StreamHandle, ToEngine]:
        """The first segment: an ordinary ADD, routed as usual, with resumable=True."""
        return self.register_request(prompt, max_tokens,
                                     data_parallel_rank=data_parallel_rank, resumable=True,
                                     sampling=sampling)

    def open_session_state(self, rid: str) -> SessionState:
        """The session of `rid`, or SessionError when none is open (Rust client:
        continuation_without_an_open_session_is_rejected, closing_session_rejects_later_
        continuations)."""
        state = self.requests.get(rid)
        if state is None or state.session is None:
            raise SessionError(f"request {rid!r} has no open streaming-input session")
        if state.session.closing:
            raise SessionError(f"the streaming-input session {rid!r} is closing")
        return state.session

    def continue_session(self, rid: str, prompt: Sequence[int], max_tokens: int
                         ) -> list[ToEngine]:
        """A continuation: the same id, resumable=True, to the engine that holds it."""
        self._check_alive()
        session = self.open_session_state(rid)
        session.segments_running += 1
        return [self.session_add(rid, prompt, max_tokens, resumable=True)]

    def close_session(self, rid: str) -> list[ToEngine]:
        """The final (non-resumable) ADD; with no segment running the stream ends now with
        the last segment's finish reason, else when the running segment finishes."""
        self._check_alive()
        session = self.open_session_state(rid)
        session.closing = True
        send = self.session_add(rid, CLOSING_PROMPT, 1, resumable=False)
        if session.segments_running == 0:  # its last segment's final output came already
            self._finish(rid, Event.FINAL_OUTPUT, session.last_reason or "stop")
        return [send]

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> ToEngine:
        """A continuation or the close: an ADD of the session's id to the engine holding it."""
        state = self.request(rid)
        if state is None:
            raise SessionError(f"request {rid!r} has no streaming-input session")
        sampling = state.session.sampling if state.session is not None else GREEDY
        request = self.session_request(rid, prompt, self.session_sampling(max_tokens, sampling),
                                       resumable=resumable)
        return self.engines[state.rank].identity, self.codec.encode_add(request)

    def session_sampling(self, max_tokens: int, sampling: Sampling) -> m.SamplingParams:
        """A session ADD's sampling: the first segment's (the client's `sampling`), with
        this segment's max_tokens."""
        return self.sampling_params(max_tokens, sampling)

    def session_request(self, rid: str, prompt: Sequence[int], sampling: m.SamplingParams,
                        *, resumable: bool) -> m.EngineCoreRequest:
        """A session ADD: the session's id (also as external_req_id), the latest wave."""
        return m.EngineCoreRequest(
            rid, list(prompt), None, sampling, None, time.time(), None, None, None,
            client_index=self.client_index, current_wave=self.current_wave,
            resumable=resumable, external_req_id=rid)

    # ------------------------------------------------------------ hooks of the core

    def segment_continues(self, state: RequestState, output: m.EngineCoreOutput) -> bool:
        """A finish of a session's segment: True when the client's stream goes on (a
        segment boundary), False when the finish ends the session (abort, error, or the
        last segment after the input was closed)."""
        session = state.session
        if session is None or output.finish_reason in (m.FinishReason.ABORT,
                                                       m.FinishReason.ERROR):
            return False
        session.segments_running = max(0, session.segments_running - 1)
        session.last_reason = str(output.finish_reason)
        return not (session.closing and session.segments_running == 0)

    def retired_by_engine(self, rid: str) -> bool:
        """finished_requests names `rid`: an open session is not retired by it (Rust
        client: finish_many_skips_resumable_requests)."""
        state = self.requests.get(rid)
        return state is not None and state.session is None

    def abort_ranks(self, state: RequestState) -> list[int]:
        """Engines an abort of this request goes to: every engine for a session."""
        if state.session is not None:
            return sorted(self.engines)
        return [state.rank]
