"""The reference frontend core's bookkeeping records and the errors it raises.

They live apart from the core's rules (core.py) so the rule mixins (sessions.py,
utilities.py, handshake.py, stop_strings.py) can name them without importing the core,
and so the core module holds rules only. core.py re-exports every name, so importing
them from `harness.frontends.reference.core` keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.frontends.api import FrontendError, StreamHandle
from harness.frontends.reference.sessions import SessionState
from harness.protocol.lifecycle import Phase
from harness.protocol.wire import messages as m

# What the core sends: one message for one engine, (its identity, the frames after it).
ToEngine = tuple[bytes, list[bytes]]

__all__ = ["DuplicateRequestId", "EngineDeadError", "EngineState", "InvalidRequest",
           "RequestState", "ToEngine"]


class EngineDeadError(FrontendError):
    """An engine reported ENGINE_CORE_DEAD, broke the protocol, or went away."""


class DuplicateRequestId(FrontendError):
    """A client-chosen request id is already in flight; nothing was sent."""


class InvalidRequest(FrontendError):
    """A request no engine may be sent (empty prompt, prompt over max_model_len, min_tokens
    above max_tokens); refused before its ADD, nothing was sent."""


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
    # min_tokens: a stop string completing within the first min_tokens tokens is ignored;
    # stop_floor is the text length at that token (a match must end beyond it).
    min_tokens: int = 0
    stop_floor: int = 0
    session: SessionState | None = None  # a streaming-input (resumable) request
    phase: Phase = Phase.OPEN  # the truth about the request; moved by the core's _advance
