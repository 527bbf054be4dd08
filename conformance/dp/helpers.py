"""What the dp area's case files share: the vLLM 0.33.0 files their grounds cite, the
routing-score lines both frontends stand on, and two small probes.

Not a test module (pytest does not collect it); the case files import from it.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.cases.authoring import (
    Capability,
    EngineGroup,
    EngineScript,
    any_request,
    hold,
    py,
    request_for,
    rs,
)

CC = "vllm/v1/engine/core_client.py"
IP = "vllm/v1/engine/input_processor.py"
CORE = "vllm/v1/engine/core.py"
SCHED = "vllm/v1/core/sched/scheduler.py"
RC = "rust/src/engine-core-client/src/client.rs"
RS = "rust/src/engine-core-client/src/client/state.rs"
RT = "rust/src/engine-core-client/src/tests/client.rs"
EXT = "rust/src/engine-core-client/src/coordinator/external.rs"

# How both frontends score an engine for an unpinned request: their own in-flight count,
# floored under (or raised by) the load the engines report.
PY_INFLIGHT = py(f"{CC}:1786",
                 "score: float = max(self.client_count * inflight, waiting + running)")
RS_SCORE = rs(f"{RS}:92", "self.inflight.max(stats.running + stats.waiting")
RS_MIN = rs(f"{RS}:219", ".min_by_key(|(_, state)| state.routing_score())")

PINNED = [Capability.GENERATE, Capability.DP_RANK]


def holding_engines(count: int) -> list[EngineScript]:
    """`count` engines that answer every request with a first token and then keep it open
    (no finish) until it is aborted."""
    return [EngineScript(rules=[any_request(hold())]) for _ in range(count)]


def engine_of(group: EngineGroup, prompt_ids: Sequence[int]) -> int | None:
    """The engine that got the ADD carrying this prompt (None: it reached no engine)."""
    found = request_for(group, prompt_ids)
    return found[0] if found else None
