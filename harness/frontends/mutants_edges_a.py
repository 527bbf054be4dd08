"""Mutant cores for the utility / handshake / DP edges that mutmut's survivors exposed
(registered in mutants.py under `-- mutation survivors A --`). Each overrides one rule the
way a port author gets it wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.frontends.api import StartupError
from harness.frontends.reference.core import (
    EngineState,
    InconsistentResults,
    PendingUtility,
    ReferenceFrontendCore,
    Send,
    UtilityFailed,
)
from harness.frontends.reference.utilities import UTILITY_AGGREGATION, Aggregation
from harness.protocol.lifecycle import Event
from harness.protocol.wire import ProtocolError
from harness.protocol.wire import messages as m


class ResetConnectorFlagDropped(ReferenceFrontendCore):
    """reset_prefix_cache forwards reset_running_requests but always sends
    reset_connector=false (the flag added later, PR #43429, never wired through)."""

    def start_utility(self, method: str, args: Sequence[Any]
                      ) -> tuple[PendingUtility, list[Send]]:
        if method == "reset_prefix_cache" and len(args) == 2:
            args = [args[0], False]
        return super().start_utility(method, args)


class ResetFlagsSwapped(ReferenceFrontendCore):
    """reset_prefix_cache's two flags sent in the wrong order ([reset_connector,
    reset_running_requests]): both are booleans, so nothing type-checks the order."""

    def start_utility(self, method: str, args: Sequence[Any]
                      ) -> tuple[PendingUtility, list[Send]]:
        if method == "reset_prefix_cache" and len(args) == 2:
            args = [args[1], args[0]]
        return super().start_utility(method, args)


class ConsensusAnswersAgreement(ReferenceFrontendCore):
    """Consensus methods answer whether the engines agree (true) instead of the value they
    agree on."""

    def aggregate(self, method: str, values: list[Any]) -> Any:
        if self.aggregation.get(method) is Aggregation.CONSENSUS and method != "is_sleeping":
            return super().aggregate(method, values) is not None
        return super().aggregate(method, values)


class DisagreementUnexplained(ReferenceFrontendCore):
    """Engines that disagree on a consensus method fail the call without saying on what."""

    def aggregate(self, method: str, values: list[Any]) -> Any:
        if self.aggregation.get(method) is Aggregation.CONSENSUS and \
                any(v != values[0] for v in values):
            raise InconsistentResults(f"{method}: engines disagree")
        return super().aggregate(method, values)


class UnlistedMethodUnit(ReferenceFrontendCore):
    """A method missing from the folding table answers None (as if it were a unit call)."""

    def aggregate(self, method: str, values: list[Any]) -> Any:
        if method not in self.aggregation and method not in ("is_sleeping",
                                                             "reset_prefix_cache"):
            return None
        return super().aggregate(method, values)


class BoolAnswersAsUnit(ReferenceFrontendCore):
    """add_lora / wake_up treated like the unit methods: the engines' true is lost (None)."""

    aggregation = {**UTILITY_AGGREGATION, "add_lora": Aggregation.UNIT,
                   "wake_up": Aggregation.UNIT}


class ListLorasAsUnit(ReferenceFrontendCore):
    """list_loras folded like a unit method: the adapters listed by engine 0 are lost."""

    aggregation = {**UTILITY_AGGREGATION, "list_loras": Aggregation.UNIT}


class ConsensusAgainstEngineOne(ReferenceFrontendCore):
    """Consensus compares every answer with engine 1's (an index off by one): a single
    engine's answer can never be checked, so the call fails."""

    def aggregate(self, method: str, values: list[Any]) -> Any:
        if self.aggregation.get(method) is Aggregation.CONSENSUS and method != "is_sleeping":
            if len(values) < 2 or any(v != values[1] for v in values):
                raise InconsistentResults(f"{method} returned inconsistent results across "
                                          f"engines: {values}")
            return values[1]
        return super().aggregate(method, values)


class _EveryRankMissing(PendingUtility):
    def missing_ranks(self) -> list[int]:
        return sorted(self.call_ids.values())


class UtilityTimeoutNamesEveryEngine(ReferenceFrontendCore):
    """A utility timeout names every engine of the call, not just the silent ones (the
    answered set is never consulted)."""

    def start_utility(self, method: str, args: Sequence[Any]
                      ) -> tuple[PendingUtility, list[Send]]:
        call, sends = super().start_utility(method, args)
        mutant = _EveryRankMissing(call.method, call.call_ids)
        for call_id in call.call_ids:
            self.utilities[call_id] = mutant
        return mutant, sends


class FailureMessageDropped(ReferenceFrontendCore):
    """A failed utility call raises naming the failing engines only; the engine's own
    failure message (what went wrong) is dropped."""

    def utility_values(self, call: PendingUtility) -> list[Any]:
        if call.failures:
            raise UtilityFailed(f"utility {call.method} failed on engines "
                                f"{sorted(call.failures)}")
        return super().utility_values(call)


class IsSleepingUntyped(ReferenceFrontendCore):
    """is_sleeping checks only that the engines agree, not that they answered a boolean."""

    def aggregate_is_sleeping(self, values: list[Any]) -> bool:
        if len(set(values)) != 1:
            raise InconsistentResults(f"is_sleeping returned inconsistent results across "
                                      f"engines: {values}")
        return values[0]  # type: ignore[no-any-return]

    def aggregate(self, method: str, values: list[Any]) -> Any:
        if method == "is_sleeping":
            return self.aggregate_is_sleeping(values)
        return super().aggregate(method, values)


# ---------------------------------------------------------------- handshake


class HelloTwiceAnswered(ReferenceFrontendCore):
    """A repeated HELLO is answered with another INIT instead of refused (the engine's
    state is not tracked per stage)."""

    def on_handshake(self, identity: bytes, payload: bytes, inputs: Sequence[str],
                     outputs: Sequence[str]) -> bytes | None:
        engine = self._handshake_engine(identity, "handshake message")
        if self._handshake_status(engine, payload) == "HELLO":
            self.hello_seen.add(engine.rank)
            return self.init_message(engine.rank, inputs, outputs)
        return super().on_handshake(identity, payload, inputs, outputs)


class ReadyOrderUnchecked(ReferenceFrontendCore):
    """READY is recorded whenever it comes: before the engine's HELLO, or twice."""

    def on_handshake(self, identity: bytes, payload: bytes, inputs: Sequence[str],
                     outputs: Sequence[str]) -> bytes | None:
        engine = self._handshake_engine(identity, "handshake message")
        if self._handshake_status(engine, payload) == "READY":
            self.handshake_ready_seen.add(engine.rank)
            return None
        return super().on_handshake(identity, payload, inputs, outputs)


class UndecodableHandshakeSkipped(ReferenceFrontendCore):
    """An undecodable handshake message is dropped and the frontend waits for a valid one
    (startup then fails only at the bound, for the wrong reason)."""

    def on_handshake(self, identity: bytes, payload: bytes, inputs: Sequence[str],
                     outputs: Sequence[str]) -> bytes | None:
        try:
            self.codec.decode_handshake_status(payload)
        except ProtocolError:
            return None
        return super().on_handshake(identity, payload, inputs, outputs)


class UnexpectedIdentityVague(ReferenceFrontendCore):
    """A handshake message from an unknown identity is refused without saying which."""

    def _handshake_engine(self, identity: bytes, stage: str) -> EngineState:
        if bytes(identity) not in self._by_identity:
            raise StartupError("handshake message from an unexpected engine")
        return super()._handshake_engine(identity, stage)


class HandshakeTimeoutUnnamed(ReferenceFrontendCore):
    """A handshake timeout says only that it timed out: no engine, no stage."""

    def handshake_timeout(self, timeout: float) -> StartupError:
        return StartupError(f"handshake timed out after {timeout:.1f}s")


# ---------------------------------------------------------------- DP load


class CoordinatorCountsIgnored(ReferenceFrontendCore):
    """The coordinator's publications update the wave only; load comes from
    scheduler_stats alone."""

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        self.current_wave = update.current_wave


class FirstPublicationKept(ReferenceFrontendCore):
    """Load counts are taken from the first publication only (cached, never refreshed)."""

    _counts_seen = False

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        if self._counts_seen and update.counts:
            self.current_wave = update.current_wave
            return
        self._counts_seen = self._counts_seen or bool(update.counts)
        super().on_dp_stats(update)


# ---------------------------------------------------------------- death


class DeathErrorTextDropped(ReferenceFrontendCore):
    """Engine death ends the open streams with a bare "error" finish: the why is lost."""

    def mark_dead(self, reason: str) -> None:
        if self.dead is None:
            for rid in list(self.requests):
                self._finish(rid, Event.ENGINE_DEAD, "error")
        super().mark_dead(reason)
