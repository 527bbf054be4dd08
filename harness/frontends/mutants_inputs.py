"""Mutant reference cores for streaming-input sessions and tensor inputs.

Each one breaks one rule a port author plausibly gets wrong: the session broadcast on
abort, segment boundaries, continuation ids / flags / routing, closing while a segment
runs, and the aux-frame threshold for tensors on the ADD.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import msgspec

from harness.frontends.reference.core import ReferenceFrontendCore, RequestState, Send
from harness.frontends.reference.sessions import CLOSING_PROMPT
from harness.protocol.lifecycle import Event
from harness.protocol.wire import WireCodec
from harness.protocol.wire import messages as m
from harness.protocol.wire.codec import AddRequest


class SessionAbortOwnerOnly(ReferenceFrontendCore):
    """A session is aborted at its owner only, like any request (no broadcast)."""

    def abort_ranks(self, state: RequestState) -> list[int]:
        return [state.rank]


class SegmentFinishEndsSession(ReferenceFrontendCore):
    """Every finish ends the stream: segment boundaries are taken for the request's end."""

    def segment_continues(self, state: RequestState, output: m.EngineCoreOutput) -> bool:
        return False


class ContinuationNewId(ReferenceFrontendCore):
    """A continuation goes out under a fresh request id (treated as a new request)."""

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> Send:
        identity, frames = super().session_add(rid, prompt, max_tokens, resumable=resumable)
        message = self.codec.decode_engine_input(frames)
        if not resumable or not isinstance(message, AddRequest):
            return identity, frames
        renamed = msgspec.structs.replace(message.request, request_id=f"{rid}-cont")
        return identity, self.codec.encode_add(renamed)


class ContinuationNotResumable(ReferenceFrontendCore):
    """Only the first ADD is marked resumable; continuations go out as plain ADDs."""

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> Send:
        continuation = tuple(prompt) != CLOSING_PROMPT
        return super().session_add(rid, prompt, max_tokens,
                                   resumable=resumable and not continuation)


class ContinuationRoutedFresh(ReferenceFrontendCore):
    """A continuation is load-balanced like a new request instead of following the
    engine that holds the session."""

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> Send:
        state = self.requests[rid]
        owner = state.rank
        state.rank = next(r for r in sorted(self.engines, key=lambda r: (r == owner, r)))
        try:
            return super().session_add(rid, prompt, max_tokens, resumable=resumable)
        finally:
            state.rank = owner


class CloseEndsAtOnce(ReferenceFrontendCore):
    """Closing the input ends the stream at once, even while a segment still runs."""

    def close_session(self, rid: str) -> list[Send]:
        sends = super().close_session(rid)
        if rid in self.requests:
            self._finish(rid, Event.FINAL_OUTPUT, "stop")
        return sends


def _codec_with_threshold(codec: WireCodec, threshold: int) -> WireCodec:
    """The driver's codec with another zero-copy threshold (the one rule these break)."""
    return WireCodec(dataclasses.replace(codec.profile, zero_copy_threshold=threshold))


class TensorsInline(ReferenceFrontendCore):
    """No aux frames on the way in: every tensor is inlined as ext(3), however large."""

    def __init__(self, ranks: Sequence[int], *, codec: WireCodec) -> None:
        super().__init__(ranks, codec=_codec_with_threshold(codec, 1 << 40))


class TensorsAlwaysAux(ReferenceFrontendCore):
    """Every tensor goes out as an aux frame, even below the zero-copy threshold."""

    def __init__(self, ranks: Sequence[int], *, codec: WireCodec) -> None:
        super().__init__(ranks, codec=_codec_with_threshold(codec, 0))


class SessionDropLeftToEngine(ReferenceFrontendCore):
    """A dropped session gets no ABORT: the port leaves it to the engine to retire."""

    def abort_ranks(self, state: RequestState) -> list[int]:
        return [] if state.session is not None else [state.rank]
