"""Mutant reference cores for the edge cases of group E (utility calls after a failure,
handshake refusals, streaming-input sessions): one realistic port bug each, mirroring a
mutmut survivor's blind spot.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from harness.frontends.api import StartupError
from harness.frontends.reference.coordinator import CoordinatorCore, CoordinatorError, Effect
from harness.frontends.reference.core import (
    EngineDeadError,
    PendingUtility,
    ReferenceFrontendCore,
    UtilityFailed,
)
from harness.frontends.reference.sessions import SessionError, SessionState
from harness.protocol.timing import scaled
from harness.protocol.wire import WireCodec

# ----------------------------------------------------------------- after a failure


class LaterCallsRefusedVaguely(ReferenceFrontendCore):
    """Once dead, later calls are refused with a fixed text: the recorded cause is never
    shown (a port that keeps a `healthy` flag instead of the first error)."""

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise EngineDeadError("frontend is not available")


class DeathCauseNotRecorded(ReferenceFrontendCore):
    """Every failure is recorded as the same generic death: an undecodable frame or a lost
    connection reads like ENGINE_CORE_DEAD (the reason string is dropped)."""

    def mark_dead(self, reason: str) -> None:
        super().mark_dead("engine core died")


class UtilityFailureWithoutMethod(ReferenceFrontendCore):
    """A failed utility call raises the engines' messages alone, as Python's client does:
    which method failed is not said."""

    def utility_values(self, call: PendingUtility) -> list[Any]:
        if call.failures:
            raise UtilityFailed("; ".join(msg for _r, msg in sorted(call.failures.items())))
        return super().utility_values(call)


# ----------------------------------------------------------------- startup refusals


class BlockSizeDisagreementUnexplained(ReferenceFrontendCore):
    """Refuses engines that disagree on block_size without showing the values."""

    def check_block_sizes(self) -> None:
        if len(set(self._block_sizes.values())) > 1:
            raise StartupError("engines disagree on block_size")


class RegistrationRefusalsUnnamed(ReferenceFrontendCore):
    """Any unusable registration is refused with one generic text: which engine sent it
    (and what was wrong with it) is lost."""

    def on_ready(self, identity: bytes, payload: bytes) -> None:
        try:
            super().on_ready(identity, payload)
        except StartupError:
            raise StartupError("an engine sent an unusable registration") from None


class ReadyBoundHardCoded(ReferenceFrontendCore):
    """Ignores the configured startup bound: a registration is accepted only within a fixed
    4.5 s (scaled) of the frontend's creation, a constant where the configured ready
    timeout belongs."""

    HARD_BOUND = 4.5

    def __init__(self, ranks: Sequence[int], *, codec: WireCodec) -> None:
        super().__init__(ranks, codec=codec)
        self.created = time.monotonic()

    def on_ready(self, identity: bytes, payload: bytes) -> None:
        if time.monotonic() - self.created > scaled(self.HARD_BOUND):
            raise self.registration_timeout(scaled(self.HARD_BOUND))
        super().on_ready(identity, payload)


class _LenientCoordinator(CoordinatorCore):
    """Skips an engine message it cannot use, as the stats reader skips an undecodable
    publication."""

    def on_engine_output(self, frames: Sequence[bytes]) -> list[Effect]:
        try:
            return super().on_engine_output(frames)
        except CoordinatorError:
            return []


class CoordinatorPathMisuseIgnored(ReferenceFrontendCore):
    """The frontend's DP coordinator drops request outputs / utility replies that a
    miswired engine sends on the coordinator path, and the client serves on."""

    coordinator_class = _LenientCoordinator



# ----------------------------------------------------------------- session refusals


class SessionRefusalsUnexplained(ReferenceFrontendCore):
    """Every refused continuation or close gets the same bare text: "no such session" and
    "input already closing" cannot be told apart."""

    def open_session_state(self, rid: str) -> SessionState:
        try:
            return super().open_session_state(rid)
        except SessionError:
            raise SessionError("request refused") from None


class DeathSparesUnstarted(ReferenceFrontendCore):
    """Engine death fails only the streams that already had output (a port that fails
    streams from its output-handling path, which a stream without output never reached):
    a stream still waiting for its first token waits forever."""

    def mark_dead(self, reason: str) -> None:
        if self.dead is not None:
            return
        waiting = [rid for rid, state in self.requests.items()
                   if not state.handle.first_output.is_set()]
        held = {rid: self.requests.pop(rid) for rid in waiting}
        super().mark_dead(reason)
        self.requests.update(held)
