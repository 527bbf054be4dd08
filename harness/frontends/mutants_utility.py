"""Mutant cores for the utility, request-id and pass-through rules (registered in
mutants.py's utility section). Each overrides one rule the way a port author gets it wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.frontends.reference.core import (
    DuplicateRequestId,
    PendingUtility,
    ReferenceFrontendCore,
)
from harness.frontends.reference.utilities import UTILITY_AGGREGATION, Aggregation
from harness.wire import messages as m


def _table(**changes: Aggregation) -> dict[str, Aggregation]:
    return {**UTILITY_AGGREGATION, **changes}


class BoolAnswersFromEngineZero(ReferenceFrontendCore):
    """add_lora / remove_lora / pin_lora / wake_up answered by engine 0 (Python DPLB's
    call_utility_async) instead of ANDed."""

    aggregation = _table(add_lora=Aggregation.FIRST, remove_lora=Aggregation.FIRST,
                         pin_lora=Aggregation.FIRST, wake_up=Aggregation.FIRST)


class ConsensusFromEngineZero(ReferenceFrontendCore):
    """is_scheduler_paused / get_weight_version take engine 0's answer, unchecked."""

    aggregation = _table(is_scheduler_paused=Aggregation.FIRST,
                         get_weight_version=Aggregation.FIRST)


class CollectiveRpcEngineZero(ReferenceFrontendCore):
    """collective_rpc returns engine 0's worker results only."""

    aggregation = _table(collective_rpc=Aggregation.FIRST)


class ResultsInArrivalOrder(ReferenceFrontendCore):
    """Per-engine results kept in the order the replies arrived, not engine order."""

    def utility_values(self, call: PendingUtility) -> list[Any]:
        super().utility_values(call)  # failures still raise
        return list(call.results.values())


class FailureIgnoredWhenOthersAnswer(ReferenceFrontendCore):
    """An engine's failure is dropped as long as some engine answered."""

    def utility_values(self, call: PendingUtility) -> list[Any]:
        if call.results:
            return [call.results[r] for r in sorted(call.results)]
        return super().utility_values(call)


class NegativeCallIdFatal(ReferenceFrontendCore):
    """A negative call id (EEP -1, FT status -2) is treated as a protocol violation."""

    def on_utility_output(self, engine_index: int, out: m.UtilityOutput
                          ) -> PendingUtility | None:
        if out.call_id < 0:
            self.mark_dead(f"utility reply with negative call id {out.call_id}")
            return None
        return super().on_utility_output(engine_index, out)


class DuplicateIdNotChecked(ReferenceFrontendCore):
    """A client-chosen id is sent as is, live duplicate or not."""

    def assign_request_id(self, request_id: str | None) -> str:
        return super().assign_request_id(None) if request_id is None else request_id


class RequestIdNeverReusable(ReferenceFrontendCore):
    """Every client id ever used is remembered and refused, finished or not."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.used_ids: set[str] = set()

    def assign_request_id(self, request_id: str | None) -> str:
        if request_id is not None and request_id in self.used_ids:
            raise DuplicateRequestId(f"request id {request_id!r} was used before")
        rid = super().assign_request_id(request_id)
        self.used_ids.add(rid)
        return rid


class PassThroughKvOnly(ReferenceFrontendCore):
    """Only kv_transfer_params is forwarded; ec_transfer_params and cache_salt are dropped."""

    def pass_through(self, params: Mapping[str, Any] | None
                     ) -> tuple[dict[str, Any] | None, str | None]:
        extra, _salt = super().pass_through(params)
        kept = {k: v for k, v in (extra or {}).items() if k == "kv_transfer_params"}
        return (kept or None), None


class KvParamsFalsyDropped(ReferenceFrontendCore):
    """kv_transfer_params re-serialised without its false / empty values."""

    def pass_through(self, params: Mapping[str, Any] | None
                     ) -> tuple[dict[str, Any] | None, str | None]:
        extra, salt = super().pass_through(params)
        if extra and isinstance(extra.get("kv_transfer_params"), dict):
            extra["kv_transfer_params"] = {k: v for k, v in
                                           extra["kv_transfer_params"].items() if v}
        return extra, salt
