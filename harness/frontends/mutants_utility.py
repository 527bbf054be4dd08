"""Mutant cores for the utility, request-id and pass-through rules (registered in
mutants.py's utility section). Each overrides one rule the way a port author gets it wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.frontends.reference.core import (
    DuplicateRequestId,
    PendingUtility,
    ReferenceFrontendCore,
    Send,
)
from harness.frontends.reference.utilities import UTILITY_AGGREGATION, Aggregation
from harness.protocol.wire import messages as m


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


class DuplicateRefusalAbortsFirst(ReferenceFrontendCore):
    """Refusing a live duplicate id cleans up "that id": the live request with it is
    dropped and aborted (a failed stream's drop guard that aborts by id)."""

    def assign_request_id(self, request_id: str | None) -> str:
        try:
            return super().assign_request_id(request_id)
        except DuplicateRequestId:
            self.queue_drop([request_id] if request_id is not None else [])
            raise


class WakeUpTagsDropped(ReferenceFrontendCore):
    """wake_up always goes out as wake_up(None): the caller's tags never reach the engines."""

    def start_utility(self, method: str, args: Sequence[Any]
                      ) -> tuple[PendingUtility, list[Send]]:
        return super().start_utility(method, [None] if method == "wake_up" else args)


_KEEP = object()  # a required argument: the caller's value goes out
# What a client that never forwards optional arguments sends: each one's default.
_OPTIONAL_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "sleep": (1, "abort"), "pause_generation": ("abort", True),
    "collective_rpc": (_KEEP, None, _KEEP, {})}


class OptionalUtilityArgsDefaulted(ReferenceFrontendCore):
    """sleep's level and mode, pause_generation's mode and clear_cache, collective_rpc's
    timeout and kwargs go out as their defaults whatever the caller asked."""

    def start_utility(self, method: str, args: Sequence[Any]
                      ) -> tuple[PendingUtility, list[Send]]:
        defaults = _OPTIONAL_DEFAULTS.get(method)
        if defaults is not None:
            args = [a if d is _KEEP else d for a, d in zip(args, defaults, strict=False)]
        return super().start_utility(method, args)


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


# ----------------- utility aggregation and pairing (the first mutants)


class SleepingFirstEngine(ReferenceFrontendCore):
    def aggregate_is_sleeping(self, values: list[Any]) -> bool:
        return bool(values[0])


class ResetPrefixCacheOr(ReferenceFrontendCore):
    def aggregate_reset_prefix_cache(self, values: list[Any]) -> bool:
        return any(bool(v) for v in values)


class UtilityFirstReplyWins(ReferenceFrontendCore):
    """Pairs results by arrival instead of by call id: the first reply answers for all."""

    def on_utility_output(self, engine_index: int, out: m.UtilityOutput
                          ) -> PendingUtility | None:
        call = self.utilities.get(out.call_id)
        done = super().on_utility_output(engine_index, out)
        if call is None or done is not None:
            return done
        value = out.result.value if out.result is not None else None
        for rank in call.call_ids.values():
            call.results.setdefault(rank, value)
        self.forget_utility(call)
        return call


class SleepingAlwaysFalse(ReferenceFrontendCore):
    def aggregate_is_sleeping(self, values: list[Any]) -> bool:
        super().aggregate_is_sleeping(values)
        return False


class SleepingAlwaysTrue(ReferenceFrontendCore):
    def aggregate_is_sleeping(self, values: list[Any]) -> bool:
        super().aggregate_is_sleeping(values)
        return True


class ResetAlwaysTrue(ReferenceFrontendCore):
    def aggregate_reset_prefix_cache(self, values: list[Any]) -> bool:
        return True


class ResetAlwaysFalse(ReferenceFrontendCore):
    def aggregate_reset_prefix_cache(self, values: list[Any]) -> bool:
        return False


class UtilityEngineZeroOnly(ReferenceFrontendCore):
    """Sends utilities to the first engine only (what vLLM's offline SyncMPClient does)."""

    def start_utility(self, method: str, args: Sequence[Any]) -> tuple[PendingUtility,
                                                                       list[Send]]:
        call, sends = super().start_utility(method, args)
        first = min(call.call_ids, key=lambda cid: call.call_ids[cid])
        for cid in [c for c in call.call_ids if c != first]:
            del call.call_ids[cid]
            self.utilities.pop(cid, None)
        return call, sends[:1]


class UnsolicitedReplyFatal(ReferenceFrontendCore):
    def on_utility_output(self, engine_index: int, out: m.UtilityOutput
                          ) -> PendingUtility | None:
        if out.call_id not in self.utilities:
            self.mark_dead(f"reply to unknown utility call {out.call_id}")
            return None
        return super().on_utility_output(engine_index, out)


class UtilityReplyToLatestCall(ReferenceFrontendCore):
    """Hands every reply to the most recently started call of that engine."""

    def on_utility_output(self, engine_index: int, out: m.UtilityOutput
                          ) -> PendingUtility | None:
        owner = self.utilities.get(out.call_id)
        if owner is not None:
            rank = owner.call_ids[out.call_id]
            latest = max(cid for cid, call in self.utilities.items()
                         if call.call_ids.get(cid) == rank)
            out = m.UtilityOutput(latest, out.failure_message, out.result)
        return super().on_utility_output(engine_index, out)


class UtilityExtraArg(ReferenceFrontendCore):
    def start_utility(self, method: str, args: Sequence[Any]) -> tuple[PendingUtility,
                                                                       list[Send]]:
        return super().start_utility(method, [*args, self.client_index])


# ----------------- utility results: values changed on their way to the caller


def _strip_nulls(value: Any) -> Any:
    """A serialiser that skips null fields (serde skip_serializing_if, Go omitempty)."""
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


def _as_double(value: Any) -> Any:
    """Every number decoded into a float64 (a dynamic-language port's JSON-like value)."""
    if isinstance(value, dict):
        return {k: _as_double(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_double(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


class FlattenDropsNulls(ReferenceFrontendCore):
    """collective_rpc / compute_weight_checksums skip null worker results while flattening
    (filter_map over Option values)."""

    def aggregate(self, method: str, values: list[Any]) -> Any:
        result = super().aggregate(method, values)
        if self.aggregation.get(method) is Aggregation.FLATTEN:
            return [v for v in result if v is not None]
        return result


class FlattenRecursive(ReferenceFrontendCore):
    """Flattening goes all the way down: a worker's own list result is spliced in too."""

    def aggregate(self, method: str, values: list[Any]) -> Any:
        if self.aggregation.get(method) is not Aggregation.FLATTEN:
            return super().aggregate(method, values)
        flat: list[Any] = []
        pending = list(reversed(values))
        while pending:
            item = pending.pop()
            if isinstance(item, list):
                pending.extend(reversed(item))
            else:
                flat.append(item)
        return flat


class UtilityMapNullsOmitted(ReferenceFrontendCore):
    """Map entries whose value is null vanish from utility results."""

    def aggregate(self, method: str, values: list[Any]) -> Any:
        return _strip_nulls(super().aggregate(method, values))


class UtilityNumbersAsDouble(ReferenceFrontendCore):
    """Integers in utility results come back as floats (1 -> 1.0, 2**53 + 1 rounded)."""

    def aggregate(self, method: str, values: list[Any]) -> Any:
        return _as_double(super().aggregate(method, values))


class WeightChecksumsEngineZero(ReferenceFrontendCore):
    """compute_weight_checksums answered with engine 0's workers only (call_utility_async
    instead of call_utility_all_async)."""

    aggregation = _table(compute_weight_checksums=Aggregation.FIRST)
