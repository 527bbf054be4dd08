"""How the reference frontend folds per-engine utility answers into one, per method, as data.

Every utility call fans out to every engine exactly once (vLLM 0.33.0: Python
`call_utility_all_async`, core_client.py:1305-1312, used by DPLB for every method at
:1814-1816; Rust `call_utility`, rust-client.md §1.7). Where the two frontends fold the
answers differently, the reference takes the stricter observable rule; the comments name
both sides, and the conformance case for that rule is SHOULD with the difference in the
baseline.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


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
