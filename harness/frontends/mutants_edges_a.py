"""Mutant cores for the utility / handshake / DP edges that mutmut's survivors exposed
(registered in mutants.py under `-- mutation survivors A --`). Each overrides one rule the
way a port author gets it wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.frontends.reference.core import (
    InconsistentResults,
    PendingUtility,
    ReferenceFrontendCore,
    Send,
    UtilityFailed,
)
from harness.frontends.reference.utilities import UTILITY_AGGREGATION, Aggregation


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
