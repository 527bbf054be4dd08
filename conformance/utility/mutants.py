"""The utility area's mutants: reference frontends that each break one utility rule.

Each registers itself (harness/mutation/registry.py); the kill matrix and
`--frontend mutant:NAME` find it there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.frontends.reference.core import (
    DuplicateRequestId,
    EngineDeadError,
    PendingUtility,
    ReferenceFrontendCore,
    ToEngine,
    UtilityFailed,
)
from harness.frontends.reference.frontend import ReferenceFrontend
from harness.frontends.reference.utilities import (
    UTILITY_AGGREGATION,
    Aggregation,
    InconsistentResults,
)
from harness.mutation import registry
from harness.mutation.registry import VLLM, Mutant, mutant, register
from harness.protocol.wire import messages as m


@mutant("reset_connector_flag_dropped", "reset_prefix_cache always sends "
        "reset_connector=false")
class ResetConnectorFlagDropped(ReferenceFrontendCore):
    """reset_prefix_cache forwards reset_running_requests but always sends
    reset_connector=false (the flag added later, PR #43429, never wired through)."""

    def start_utility(self, method: str, args: Sequence[Any]
                      ) -> tuple[PendingUtility, list[ToEngine]]:
        if method == "reset_prefix_cache" and len(args) == 2:
            args = [args[0], False]
        return super().start_utility(method, args)


@mutant("reset_flags_swapped", "reset_prefix_cache sends its two flags in the wrong "
        "order")
class ResetFlagsSwapped(ReferenceFrontendCore):
    """reset_prefix_cache's two flags sent in the wrong order ([reset_connector,
    reset_running_requests]): both are booleans, so nothing type-checks the order."""

    def start_utility(self, method: str, args: Sequence[Any]
                      ) -> tuple[PendingUtility, list[ToEngine]]:
        if method == "reset_prefix_cache" and len(args) == 2:
            args = [args[1], args[0]]
        return super().start_utility(method, args)


@mutant("consensus_answers_agreement", "consensus methods answer 'engines agree' (true) "
        "instead of the value")
class ConsensusAnswersAgreement(ReferenceFrontendCore):
    """Consensus methods answer whether the engines agree (true) instead of the value they
    agree on."""

    def aggregate(self, method: str, values: list[Any]) -> Any:
        if self.aggregation.get(method) is Aggregation.CONSENSUS and method != "is_sleeping":
            return super().aggregate(method, values) is not None
        return super().aggregate(method, values)


@mutant("disagreement_unexplained", "a consensus disagreement error shows no values")
class DisagreementUnexplained(ReferenceFrontendCore):
    """Engines that disagree on a consensus method fail the call without saying on what."""

    def aggregate(self, method: str, values: list[Any]) -> Any:
        if self.aggregation.get(method) is Aggregation.CONSENSUS and \
                any(v != values[0] for v in values):
            raise InconsistentResults(f"{method}: engines disagree")
        return super().aggregate(method, values)


@mutant("unlisted_method_unit", "a utility method without a folding rule answers None")
class UnlistedMethodUnit(ReferenceFrontendCore):
    """A method missing from the folding table answers None (as if it were a unit call)."""

    def aggregate(self, method: str, values: list[Any]) -> Any:
        if method not in self.aggregation and method not in ("is_sleeping",
                                                             "reset_prefix_cache"):
            return None
        return super().aggregate(method, values)


@mutant("bool_answers_as_unit", "add_lora/wake_up answer None instead of the engines' "
        "true")
class BoolAnswersAsUnit(ReferenceFrontendCore):
    """add_lora / wake_up treated like the unit methods: the engines' true is lost (None)."""

    aggregation = {**UTILITY_AGGREGATION, "add_lora": Aggregation.UNIT,
                   "wake_up": Aggregation.UNIT}


@mutant("list_loras_as_unit", "list_loras answers None")
class ListLorasAsUnit(ReferenceFrontendCore):
    """list_loras folded like a unit method: the adapters listed by engine 0 are lost."""

    aggregation = {**UTILITY_AGGREGATION, "list_loras": Aggregation.UNIT}


@mutant("consensus_against_engine_one", "consensus compares with engine 1's answer "
        "(fails with one engine)")
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


@mutant("utility_timeout_names_every_engine", "a utility timeout names every engine, "
        "not just the silent one")
class UtilityTimeoutNamesEveryEngine(ReferenceFrontendCore):
    """A utility timeout names every engine of the call, not just the silent ones (the
    answered set is never consulted)."""

    def start_utility(self, method: str, args: Sequence[Any]
                      ) -> tuple[PendingUtility, list[ToEngine]]:
        call, sends = super().start_utility(method, args)
        mutant = _EveryRankMissing(call.method, call.call_ids)
        for call_id in call.call_ids:
            self.utilities[call_id] = mutant
        return mutant, sends


@mutant("utility_failure_message_dropped", "a failed utility call's error drops the "
        "engine's message")
class FailureMessageDropped(ReferenceFrontendCore):
    """A failed utility call raises naming the failing engines only; the engine's own
    failure message (what went wrong) is dropped."""

    def utility_values(self, call: PendingUtility) -> list[Any]:
        if call.failures:
            raise UtilityFailed(f"utility {call.method} failed on engines "
                                f"{sorted(call.failures)}")
        return super().utility_values(call)


@mutant("is_sleeping_untyped", "is_sleeping passes on a non-boolean answer")
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


@mutant("later_calls_refused_vaguely", "after engine death later calls are refused "
        "without the cause")
class LaterCallsRefusedVaguely(ReferenceFrontendCore):
    """Once dead, later calls are refused with a fixed text: the recorded cause is never
    shown (a port that keeps a `healthy` flag instead of the first error)."""

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise EngineDeadError("frontend is not available")


@mutant("utility_failure_without_method", "a failed utility call's error does not name "
        "the method")
class UtilityFailureWithoutMethod(ReferenceFrontendCore):
    """A failed utility call raises the engines' messages alone, as Python's client does:
    which method failed is not said."""

    def utility_values(self, call: PendingUtility) -> list[Any]:
        if call.failures:
            raise UtilityFailed("; ".join(msg for _r, msg in sorted(call.failures.items())))
        return super().utility_values(call)


@mutant("hist_utility_engine_zero_answer", "every utility answered with engine 0's "
        "result", source=VLLM + "pull/43429", history=True)
class UtilityEngineZeroAnswer(ReferenceFrontendCore):
    """vLLM PR #13923 (DPLBAsyncMPClient.call_utility_async: "Only the result from the
    first engine is returned"), which the Rust frontend mirrored until PR #43429 ("[rust]
    fix: aggregate `is_sleeping` and `reset_prefix_cache` across DP engines"): every
    utility fans out, and the answer is engine 0's whatever the others said."""

    def _first(self, method: str, values: list[Any], reference: Any) -> Any:
        answer = values[0] if values else None
        try:
            agreed = reference() == answer
        except InconsistentResults:
            agreed = False
        if not agreed:
            registry.fired("hist_utility_engine_zero_answer")
        return answer

    def aggregate(self, method: str, values: list[Any]) -> Any:
        return self._first(method, values, lambda: super(
            UtilityEngineZeroAnswer, self).aggregate(method, values))

    def aggregate_is_sleeping(self, values: list[Any]) -> bool:
        return bool(self._first("is_sleeping", values, lambda: super(
            UtilityEngineZeroAnswer, self).aggregate_is_sleeping(values)))

    def aggregate_reset_prefix_cache(self, values: list[Any]) -> bool:
        return bool(self._first("reset_prefix_cache", values, lambda: super(
            UtilityEngineZeroAnswer, self).aggregate_reset_prefix_cache(values)))


@mutant("hist_calls_pending_after_receiver_stop",
        "pending utility calls fail only on "
        "ENGINE_CORE_DEAD, not when the output path breaks otherwise",
        source=VLLM + "pull/56416",
        history=True)
class CallsPendingAfterReceiverStop(ReferenceFrontend):
    """vLLM PR #56416 ("[Bugfix][V1] Fail pending utility RPCs when the output receiver
    stops"): "If EngineCore dies before replying to a utility call, operations such as
    pause, reset, or sleep can remain blocked after the output receiver has stopped":
    receiver errors reached the output queue, not the futures of pending calls. Here only
    an explicit ENGINE_CORE_DEAD fails pending calls; an undecodable message, a lost
    connection or a coordinator-path failure leaves them to the utility timeout."""

    def _fail_waiters(self, error: EngineDeadError) -> None:
        if not self._closed and "ENGINE_CORE_DEAD" not in str(error):
            if len(self._waiters):
                registry.fired("hist_calls_pending_after_receiver_stop")
            return
        super()._fail_waiters(error)


@mutant("hist_late_reply_after_cancel_fatal", "a reply to a cancelled or timed-out "
        "utility call kills the client", source=VLLM + "pull/56416", history=True)
class LateReplyAfterCancelFatal(ReferenceFrontendCore):
    """vLLM PR #56416 (same PR, "tolerate late responses"): a utility reply arriving after
    its call was cancelled or timed out hit `utility_results.pop(call_id)` for an id no
    longer there; the KeyError killed the output handler, i.e. the whole client."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.forgotten: set[int] = set()  # call ids given up while still unanswered

    def forget_utility(self, call: PendingUtility) -> None:
        self.forgotten.update(cid for cid in call.call_ids if cid in self.utilities)
        super().forget_utility(call)

    def on_utility_output(self, engine_index: int, out: m.UtilityOutput
                          ) -> PendingUtility | None:
        if out.call_id in self.forgotten:
            registry.fired("hist_late_reply_after_cancel_fatal")
            self.mark_dead(f"output handler died: KeyError({out.call_id}) (a reply to a "
                           f"call no longer pending)")
            return None
        return super().on_utility_output(engine_index, out)


def _table(**changes: Aggregation) -> dict[str, Aggregation]:
    return {**UTILITY_AGGREGATION, **changes}


@mutant("utility_bool_from_engine_zero", "add_lora/remove_lora/pin_lora/wake_up answered "
        "by engine 0, not ANDed")
class BoolAnswersFromEngineZero(ReferenceFrontendCore):
    """add_lora / remove_lora / pin_lora / wake_up answered by engine 0 (Python DPLB's
    call_utility_async) instead of ANDed."""

    aggregation = _table(add_lora=Aggregation.FIRST, remove_lora=Aggregation.FIRST,
                         pin_lora=Aggregation.FIRST, wake_up=Aggregation.FIRST)


@mutant("utility_consensus_from_engine_zero", "is_scheduler_paused/get_weight_version "
        "taken from engine 0 unchecked")
class ConsensusFromEngineZero(ReferenceFrontendCore):
    """is_scheduler_paused / get_weight_version take engine 0's answer, unchecked."""

    aggregation = _table(is_scheduler_paused=Aggregation.FIRST,
                         get_weight_version=Aggregation.FIRST)


@mutant("collective_rpc_engine_zero", "collective_rpc returns engine 0's results only")
class CollectiveRpcEngineZero(ReferenceFrontendCore):
    """collective_rpc returns engine 0's worker results only."""

    aggregation = _table(collective_rpc=Aggregation.FIRST)


@mutant("utility_results_arrival_order", "per-engine results in reply arrival order")
class ResultsInArrivalOrder(ReferenceFrontendCore):
    """Per-engine results kept in the order the replies arrived, not engine order."""

    def utility_values(self, call: PendingUtility) -> list[Any]:
        super().utility_values(call)  # failures still raise
        return list(call.results.values())


@mutant("utility_failure_ignored", "an engine's failure ignored when others answered")
class FailureIgnoredWhenOthersAnswer(ReferenceFrontendCore):
    """An engine's failure is dropped as long as some engine answered."""

    def utility_values(self, call: PendingUtility) -> list[Any]:
        if call.results:
            return [call.results[r] for r in sorted(call.results)]
        return super().utility_values(call)


@mutant("negative_call_id_fatal", "utility replies with call id -1/-2 kill the client")
class NegativeCallIdFatal(ReferenceFrontendCore):
    """A negative call id (EEP -1, FT status -2) is treated as a protocol violation."""

    def on_utility_output(self, engine_index: int, out: m.UtilityOutput
                          ) -> PendingUtility | None:
        if out.call_id < 0:
            self.mark_dead(f"utility reply with negative call id {out.call_id}")
            return None
        return super().on_utility_output(engine_index, out)


@mutant("duplicate_refusal_aborts_first", "refusing a live duplicate id aborts the "
        "live request with that id")
class DuplicateRefusalAbortsFirst(ReferenceFrontendCore):
    """Refusing a live duplicate id cleans up "that id": the live request with it is
    dropped and aborted (a failed stream's drop guard that aborts by id)."""

    def assign_request_id(self, request_id: str | None) -> str:
        try:
            return super().assign_request_id(request_id)
        except DuplicateRequestId:
            self.queue_drop([request_id] if request_id is not None else [])
            raise


@mutant("wake_up_tags_dropped", "wake_up's tags never reach the engines")
class WakeUpTagsDropped(ReferenceFrontendCore):
    """wake_up always goes out as wake_up(None): the caller's tags never reach the engines."""

    def start_utility(self, method: str, args: Sequence[Any]
                      ) -> tuple[PendingUtility, list[ToEngine]]:
        return super().start_utility(method, [None] if method == "wake_up" else args)


_KEEP = object()  # a required argument: the caller's value goes out


# What a client that never forwards optional arguments sends: each one's default.
_OPTIONAL_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "sleep": (1, "abort"), "pause_generation": ("abort", True),
    "collective_rpc": (_KEEP, None, _KEEP, {})}


@mutant("optional_utility_args_defaulted", "optional utility arguments sent as their "
        "defaults")
class OptionalUtilityArgsDefaulted(ReferenceFrontendCore):
    """sleep's level and mode, pause_generation's mode and clear_cache, collective_rpc's
    timeout and kwargs go out as their defaults whatever the caller asked."""

    def start_utility(self, method: str, args: Sequence[Any]
                      ) -> tuple[PendingUtility, list[ToEngine]]:
        defaults = _OPTIONAL_DEFAULTS.get(method)
        if defaults is not None:
            args = [a if d is _KEEP else d for a, d in zip(args, defaults, strict=False)]
        return super().start_utility(method, args)


@mutant("request_id_never_reusable", "a finished request's client id is refused")
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


@mutant("pass_through_kv_only", "ec_transfer_params and cache_salt not forwarded")
class PassThroughKvOnly(ReferenceFrontendCore):
    """Only kv_transfer_params is forwarded; ec_transfer_params and cache_salt are dropped."""

    def pass_through(self, params: Mapping[str, Any] | None
                     ) -> tuple[dict[str, Any] | None, str | None]:
        extra, _salt = super().pass_through(params)
        kept = {k: v for k, v in (extra or {}).items() if k == "kv_transfer_params"}
        return (kept or None), None


@mutant("kv_params_falsy_dropped", "kv_transfer_params loses its false/empty values")
class KvParamsFalsyDropped(ReferenceFrontendCore):
    """kv_transfer_params re-serialised without its false / empty values."""

    def pass_through(self, params: Mapping[str, Any] | None
                     ) -> tuple[dict[str, Any] | None, str | None]:
        extra, salt = super().pass_through(params)
        if extra and isinstance(extra.get("kv_transfer_params"), dict):
            extra["kv_transfer_params"] = {k: v for k, v in
                                           extra["kv_transfer_params"].items() if v}
        return extra, salt


@mutant("reset_or", "reset_prefix_cache ORed instead of ANDed")
class ResetPrefixCacheOr(ReferenceFrontendCore):
    def aggregate_reset_prefix_cache(self, values: list[Any]) -> bool:
        return any(bool(v) for v in values)


@mutant("utility_first_reply_wins", "utility results paired by arrival, not call id")
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


@mutant("sleeping_always_false", "is_sleeping always false")
class SleepingAlwaysFalse(ReferenceFrontendCore):
    def aggregate_is_sleeping(self, values: list[Any]) -> bool:
        super().aggregate_is_sleeping(values)
        return False


@mutant("sleeping_always_true", "is_sleeping always true")
class SleepingAlwaysTrue(ReferenceFrontendCore):
    def aggregate_is_sleeping(self, values: list[Any]) -> bool:
        super().aggregate_is_sleeping(values)
        return True


@mutant("reset_always_true", "reset_prefix_cache always true")
class ResetAlwaysTrue(ReferenceFrontendCore):
    def aggregate_reset_prefix_cache(self, values: list[Any]) -> bool:
        return True


@mutant("utility_engine_zero_only", "utilities sent to the first engine only")
class UtilityEngineZeroOnly(ReferenceFrontendCore):
    """Sends utilities to the first engine only (what vLLM's offline SyncMPClient does)."""

    def start_utility(self, method: str, args: Sequence[Any]) -> tuple[PendingUtility,
                                                                       list[ToEngine]]:
        call, sends = super().start_utility(method, args)
        first = min(call.call_ids, key=lambda cid: call.call_ids[cid])
        for cid in [c for c in call.call_ids if c != first]:
            del call.call_ids[cid]
            self.utilities.pop(cid, None)
        return call, sends[:1]


@mutant("unsolicited_reply_fatal", "a reply with an unknown call id kills the client")
class UnsolicitedReplyFatal(ReferenceFrontendCore):
    def on_utility_output(self, engine_index: int, out: m.UtilityOutput
                          ) -> PendingUtility | None:
        if out.call_id not in self.utilities:
            self.mark_dead(f"reply to unknown utility call {out.call_id}")
            return None
        return super().on_utility_output(engine_index, out)


@mutant("utility_reply_to_latest_call", "replies handed to the newest call")
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


@mutant("utility_extra_arg", "utility args carry an extra element")
class UtilityExtraArg(ReferenceFrontendCore):
    def start_utility(self, method: str, args: Sequence[Any]) -> tuple[PendingUtility,
                                                                       list[ToEngine]]:
        return super().start_utility(method, [*args, self.client_index])


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


@mutant("flatten_drops_nulls", "null worker results skipped while flattening")
class FlattenDropsNulls(ReferenceFrontendCore):
    """collective_rpc / compute_weight_checksums skip null worker results while flattening
    (filter_map over Option values)."""

    def aggregate(self, method: str, values: list[Any]) -> Any:
        result = super().aggregate(method, values)
        if self.aggregation.get(method) is Aggregation.FLATTEN:
            return [v for v in result if v is not None]
        return result


@mutant("flatten_recursive", "a worker's own list result spliced into the flat list")
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


@mutant("utility_map_nulls_omitted", "null-valued map entries dropped from results")
class UtilityMapNullsOmitted(ReferenceFrontendCore):
    """Map entries whose value is null vanish from utility results."""

    def aggregate(self, method: str, values: list[Any]) -> Any:
        return _strip_nulls(super().aggregate(method, values))


@mutant("utility_numbers_as_double", "integers in utility results turned into floats")
class UtilityNumbersAsDouble(ReferenceFrontendCore):
    """Integers in utility results come back as floats (1 -> 1.0, 2**53 + 1 rounded)."""

    def aggregate(self, method: str, values: list[Any]) -> Any:
        return _as_double(super().aggregate(method, values))


@mutant("weight_checksums_engine_zero", "compute_weight_checksums from engine 0 only")
class WeightChecksumsEngineZero(ReferenceFrontendCore):
    """compute_weight_checksums answered with engine 0's workers only (call_utility_async
    instead of call_utility_all_async)."""

    aggregation = _table(compute_weight_checksums=Aggregation.FIRST)


register(Mutant("utility_timeout_too_short",
                "utility calls time out after 0.2 s",
                ReferenceFrontendCore,
                {"utility_timeout": 0.2}))
