"""What the utility area's case files share: source paths, grounds cited by several files,
the method table, engine scripts for a utility call, and the checks around one.

Not collected by pytest (no `test_` prefix); the case files import from here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

from harness.artefacts.vllm_dist import tiny_lora_dir
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineGroup,
    EngineScript,
    FrontendError,
    UnsupportedOperation,
    UtilityReply,
    both,
    default_ready,
    prompt,
    py,
    rs,
)

# Where the grounds' citations point (vLLM 0.33.0 sdist paths).
CC = "vllm/v1/engine/core_client.py"
AL = "vllm/v1/engine/async_llm.py"
CORE = "vllm/v1/engine/core.py"
ECC = "rust/src/engine-core-client/src"
CLIENT = f"{ECC}/client.rs"
IMP = f"{ECC}/client/imp.rs"
STATE = f"{ECC}/client/state.rs"
UTIL = f"{ECC}/protocol/utility.rs"
TESTS = f"{ECC}/tests/client.rs"
ROUTES = "rust/src/server/src/routes"

# Python's DPLB client answers with engine 0's result.
ENGINE_ZERO = py(f"{CC}:1816", "return (await self.call_utility_all_async(method, *args))[0]")
# Rust flattens every engine's collective_rpc list in engine order.
RS_FLATTEN = rs(f"{CLIENT}:810", "rmpv::Value::Array(results) => results,")

# is_sleeping / is_scheduler_paused / get_weight_version: every engine asked, all must agree.
CONSENSUS = both(
    py(f"{CC}:1315", "results = await self.call_utility_all_async(method, *args)"),
    py(f"{CC}:1316", "if any(result != results[0] for result in results):"),
    py(f"{CC}:1362", 'return await self.call_utility_consensus_async("is_scheduler_paused")'),
    py(f"{CC}:1415", 'return await self.call_utility_consensus_async("get_weight_version")'),
    rs(f"{CLIENT}:775", "let results: Vec<T> = self.call_utility(method, args).await?;"),
    rs(f"{CLIENT}:777", "if results.iter().all_equal() {"),
    rs(f"{CLIENT}:990", 'self.call_utility_consensus("is_scheduler_paused", ()).await'),
    rs(f"{CLIENT}:896", 'self.call_utility_consensus("get_weight_version", ()).await'),
    rs(f"{TESTS}:2570", "async fn is_sleeping_returns_error_when_engines_disagree()"),
)
# reset_prefix_cache is the AND over engines.
RESET_AND = both(
    py(f"{CC}:1389", '"reset_prefix_cache", reset_running_requests, reset_connector'),
    py(f"{CC}:1388", "await self.call_utility_all_async("),
    rs(f"{CLIENT}:932", ".all(|reset| reset))"),
    rs(f"{TESTS}:2706", "async fn reset_prefix_cache_returns_false_when_any_engine_fails()"),
)

CALL = [Capability.CALL_UTILITY]
# A wire LoRARequest [lora_name, lora_int_id, path]: the checked-in adapter fixture and id 1,
# the first id a frontend that numbers adapters itself (vllm-rs) hands out.
LORA = ["cw-lora", 1, str(tiny_lora_dir())]
LORA_METHODS = ("add_lora", "remove_lora", "list_loras", "pin_lora")
# Methods that act on a loaded adapter: the case loads LORA first (engines answer true).
LOADED_FIRST = {"remove_lora"}

# method -> (wire args the client's call must produce, what each engine answers)
METHODS: dict[str, tuple[list[Any], Any]] = {
    "is_sleeping": ([], False),
    "is_scheduler_paused": ([], False),
    "get_weight_version": ([], "v1"),
    "reset_prefix_cache": ([False, False], True),
    "wake_up": ([None], True),
    "sleep": ([1, "abort"], None),
    "pause_generation": (["abort", True], None),
    "resume_scheduler": ([], None),
    "collective_rpc": (["echo", None, [1], {}], ["w"]),
    "add_lora": ([LORA], True),
    "remove_lora": ([1], True),
    "list_loras": ([], [1]),
    "pin_lora": ([1], True),
    "reset_mm_cache": ([], None),
    "reset_encoder_cache": ([], None),
    "set_weight_version": (["cw-v2"], None),
    "release_kv_cache_memory": ([], None),
}


def utility_engines(method: str, *replies: UtilityReply) -> list[EngineScript]:
    """One engine per reply; for a LoRA method the engines report LoRA support (a frontend
    may refuse LoRA calls otherwise, vllm-rs does) and accept the preparatory add_lora."""
    if method not in LORA_METHODS:
        return [EngineScript(utilities={method: r}) for r in replies]
    return [EngineScript(ready=default_ready(rank, len(replies), supports_lora=True,
                                             max_loras=4),
                         utilities={"add_lora": UtilityReply(True), method: r})
            for rank, r in enumerate(replies)]


async def prepare(ctx: CaseContext, method: str) -> None:
    """Load the adapter a LOADED_FIRST method acts on."""
    if method in LOADED_FIRST:
        await ctx.driver.call_utility("add_lora", [LORA])


async def answer(ctx: CaseContext, method: str, values: Sequence[Any],
                 delays: Sequence[float] | None = None) -> Any:
    """`method` with its METHODS wire args over len(values) engines, engine r answering
    values[r] after delays[r]: the client's answer."""
    delays = delays or [0.0] * len(values)
    await ctx.start(utility_engines(method, *[UtilityReply(v, delay=d)
                                              for v, d in zip(values, delays, strict=True)]))
    await prepare(ctx, method)
    return await ctx.driver.call_utility(method, METHODS[method][0])


async def refused(ctx: CaseContext, call: Awaitable[Any], expected: str) -> str:
    """The FrontendError the call must raise (UnsupportedOperation passes through)."""
    try:
        value = await call
    except UnsupportedOperation:
        raise
    except FrontendError as exc:
        return str(exc)
    ctx.fail(expected=expected, observed=f"answered {value!r}")


def call_counts(group: EngineGroup, method: str) -> dict[int, int]:
    """Per engine, how many `method` calls it got so far."""
    return {e.rank: len(group.transcript.utility_calls(method, rank=e.rank))
            for e in group.engines}


def calls_since(group: EngineGroup, method: str, before: dict[int, int]
                ) -> dict[int, list[Any]]:
    """Per engine, the args of the `method` calls after the `before` counts (startup's
    own calls, e.g. AsyncLLM's reset_mm_cache, are not the client's)."""
    return {e.rank: [c.message.args for c in
                     group.transcript.utility_calls(method, rank=e.rank)[before[e.rank]:]]
            for e in group.engines}


async def still_serves(ctx: CaseContext, what: str) -> None:
    """After a disturbance the client still answers a utility call and runs a stream."""
    try:
        sleeping = await asyncio.wait_for(ctx.driver.call_utility("is_sleeping", []),
                                          ctx.t(3.0))
        handle = await ctx.driver.generate(prompt(1), 3)
        await handle.wait(ctx.t(5.0))
    except UnsupportedOperation:
        raise
    except FrontendError as exc:
        ctx.fail(expected=f"the client still serves after {what}",
                 observed=f"{type(exc).__name__}: {exc}")
    except asyncio.TimeoutError:  # a hang is this rule's failure, graded by its level
        ctx.fail(expected=f"the client still serves after {what}",
                 observed="is_sleeping still pending after 3 s")
    ctx.require(sleeping is False and handle.error is None and len(handle.tokens) == 3,
                expected=f"after {what}: is_sleeping false and a 3-token stream",
                observed=f"is_sleeping {sleeping!r}, stream tokens {handle.tokens} "
                         f"error {handle.error!r}")

