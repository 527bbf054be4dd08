"""How the reference frontend folds per-engine utility answers into one, per method, as data.

Every utility call fans out to every engine exactly once (vLLM 0.33.0: Python
`call_utility_all_async`, core_client.py:1305-1312, used by DPLB for every method at
:1814-1816; Rust `call_utility`, rust-client.md §1.7). Where the two frontends fold the
answers differently, the reference takes the stricter observable rule; the comments name
both sides, and the conformance case for that rule is SHOULD with the difference in the
baseline. The rules that apply the table (fan-out, pairing replies by call id, folding)
are the `UtilityRules` mixin of the reference core, one small method each.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.frontends.api import FrontendError
from harness.protocol.wire import WireCodec
from harness.protocol.wire import messages as m

if TYPE_CHECKING:
    from harness.frontends.reference.state import EngineState, ToEngine


class Aggregation(enum.Enum):
    """One rule for turning the per-engine answers (in engine order) into the call's answer."""

    CONSENSUS = "consensus"  # every engine answers the same value, else an error
    ALL = "all"  # AND over the engines' boolean answers
    FLATTEN = "flatten"  # the engines' list answers concatenated in engine order
    FIRST = "first"  # engine 0's answer (every engine must still succeed)
    UNIT = "unit"  # no value (None); every engine must succeed


UTILITY_AGGREGATION: Mapping[str, Aggregation] = {
    # Both frontends: consensus (Python :1314-1320 via :1362/:1406/:1415; Rust
    # call_utility_consensus for is_sleeping and is_scheduler_paused).
    "is_sleeping": Aggregation.CONSENSUS,
    "is_scheduler_paused": Aggregation.CONSENSUS,
    "get_weight_version": Aggregation.CONSENSUS,  # Python only exposes it (:1414-1415)
    # Both: AND (Python all(...) :1384-1390; Rust reset_prefix_cache ANDs).
    "reset_prefix_cache": Aggregation.ALL,
    # Python all(...) :1402-1403; Rust returns unit (stored client.rs) or a bool (newest).
    "wake_up": Aggregation.ALL,
    # Rust ANDs add_lora / remove_lora; Python DPLB returns engine 0's answer (:1814-1816)
    # and a non-DP client asks engine 0 only (:1302-1303).
    "add_lora": Aggregation.ALL,
    "remove_lora": Aggregation.ALL,
    "pin_lora": Aggregation.ALL,
    # Rust flattens every engine's list; Python DPLB returns engine 0's list only.
    "collective_rpc": Aggregation.FLATTEN,
    "compute_weight_checksums": Aggregation.FLATTEN,  # Python flattens (:1445-1447)
    # Engine 0's answer in Python; the engines hold the same adapters by construction.
    "list_loras": Aggregation.FIRST,
    "get_supported_tasks": Aggregation.FIRST,
    # Unit in both frontends: the answer carries no value, a failure still fails the call.
    "sleep": Aggregation.UNIT,
    "pause_scheduler": Aggregation.UNIT,
    "pause_generation": Aggregation.UNIT,
    "resume_scheduler": Aggregation.UNIT,
    "reset_mm_cache": Aggregation.UNIT,
    "reset_encoder_cache": Aggregation.UNIT,
    "profile": Aggregation.UNIT,
    "set_weight_version": Aggregation.UNIT,
    "execute_dummy_batch": Aggregation.UNIT,
    "release_kv_cache_memory": Aggregation.UNIT,
    "save_sharded_state": Aggregation.UNIT,
}
DEFAULT_AGGREGATION = Aggregation.FIRST  # an unlisted method: engine 0's answer (DPLB)


class UtilityFailed(FrontendError):
    """An engine answered a utility call with a failure message."""


class InconsistentResults(FrontendError):
    """Engines answered a consensus utility differently; the message names the values."""


@dataclass
class PendingUtility:
    """One fanned-out utility call: a call id per engine, results in engine order."""

    method: str
    call_ids: dict[int, int]  # call_id -> rank
    results: dict[int, Any] = field(default_factory=dict)  # rank -> value
    failures: dict[int, str] = field(default_factory=dict)  # rank -> failure message

    @property
    def complete(self) -> bool:
        return len(self.results) + len(self.failures) == len(self.call_ids)

    def missing_ranks(self) -> list[int]:
        answered = set(self.results) | set(self.failures)
        return sorted(r for r in self.call_ids.values() if r not in answered)


class UtilityRules:
    """Utility rules of `ReferenceFrontendCore` (fan-out, pairing by call id, folding):
    each one a small method a mutant overrides. The core provides the attributes below."""

    engines: dict[int, EngineState]
    codec: WireCodec
    client_index: int
    utilities: dict[int, PendingUtility]  # call_id -> call
    _call_ids: Iterator[int]

    def _check_alive(self) -> None:
        raise NotImplementedError

    def start_utility(self, method: str, args: Sequence[Any]
                      ) -> tuple[PendingUtility, list[ToEngine]]:
        """Fan a utility call out to every engine, each with its own call id."""
        self._check_alive()
        call = PendingUtility(method, {})
        sends: list[ToEngine] = []
        for rank in sorted(self.engines):
            call_id = next(self._call_ids)
            call.call_ids[call_id] = rank
            self.utilities[call_id] = call
            sends.append((self.engines[rank].identity,
                          self.codec.encode_utility(self.client_index, call_id, method, args)))
        return call, sends

    def on_utility_output(self, engine_index: int, out: m.UtilityOutput
                          ) -> PendingUtility | None:
        call = self.utilities.pop(out.call_id, None)
        if call is None:
            return None  # unknown or already-answered call id: dropped
        rank = call.call_ids[out.call_id]
        if out.failure_message is not None:
            call.failures[rank] = out.failure_message
        else:
            call.results[rank] = out.result.value if out.result is not None else None
        return call if call.complete else None

    def forget_utility(self, call: PendingUtility) -> None:
        for call_id in call.call_ids:
            self.utilities.pop(call_id, None)

    def utility_values(self, call: PendingUtility) -> list[Any]:
        """Results in engine order, or UtilityFailed naming every failing engine."""
        if call.failures:
            detail = "; ".join(f"engine {r}: {msg}" for r, msg in sorted(call.failures.items()))
            raise UtilityFailed(f"utility {call.method} failed: {detail}")
        return [call.results[r] for r in sorted(call.results)]

    aggregation: Mapping[str, Aggregation] = UTILITY_AGGREGATION

    def aggregate(self, method: str, values: list[Any]) -> Any:
        """The call's answer from the engines' answers (engine order), by the method's rule."""
        if method == "is_sleeping":
            return self.aggregate_is_sleeping(values)
        if method == "reset_prefix_cache":
            return self.aggregate_reset_prefix_cache(values)
        rule = self.aggregation.get(method, DEFAULT_AGGREGATION)
        if rule is Aggregation.CONSENSUS:
            if any(v != values[0] for v in values):
                raise InconsistentResults(f"{method} returned inconsistent results across "
                                          f"engines: {values}")
            return values[0]
        if rule is Aggregation.ALL:
            return all(bool(v) for v in values)
        if rule is Aggregation.FLATTEN:
            flat: list[Any] = []
            for value in values:
                flat.extend(value if isinstance(value, list) else [value])
            return flat
        if rule is Aggregation.FIRST:
            return values[0]
        return None

    def aggregate_is_sleeping(self, values: list[Any]) -> bool:
        """Consensus: every engine must agree, else an error that names the values."""
        if len(set(values)) != 1 or not isinstance(values[0], bool):
            raise InconsistentResults(f"is_sleeping returned inconsistent results across "
                                      f"engines: {values}")
        return values[0]

    def aggregate_reset_prefix_cache(self, values: list[Any]) -> bool:
        """AND over every engine's answer."""
        return all(bool(v) for v in values)
