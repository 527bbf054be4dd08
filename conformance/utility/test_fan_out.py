"""Every utility method reaches every engine once, and one engine's failure fails the call.

call_utility(method, wire args) drives each method through the frontend's own user
surface; the engines' transcripts show what reached them. Fan-out: Python DPLB
call_utility_all_async (core_client.py:1305-1312, :1814-1816), Rust call_utility
(rust-client.md §1.7) both call every engine once. A failure reply from any engine becomes
the caller's error (Python gathers every engine's future, Rust collects every outcome).
"""

from __future__ import annotations

from typing import Any

from conformance.utility.helpers import (
    CALL,
    CC,
    CLIENT,
    CORE,
    ENGINE_ZERO,
    METHODS,
    TESTS,
    UTIL,
    call_counts,
    calls_since,
    prepare,
    refused,
    utility_engines,
)
from harness.cases.authoring import CaseContext, Level, UtilityReply, both, case, engine, py, rs

# Every utility call reaches every engine once (Python DPLB fans out and keeps engine 0's
# answer; Rust call_utility sends one call per engine).
FANOUT = both(
    ENGINE_ZERO,
    py(f"{CC}:1309", "self._call_utility_async(method, *args, engine=engine)"),
    py(f"{CC}:1310", "for engine in self.core_engines"),
    rs(f"{CLIENT}:743", "for engine in &self.engines {"),
    rs(f"{CLIENT}:744", "let (call_id, rx) = self.inner.allocate_and_register_utility_call()?;"),
    rs(f"{TESTS}:2166",
       "async fn multi_engine_abort_is_grouped_and_utility_fans_out_to_all_engines()"),
)
# One engine's failure reply fails the whole call.
ONE_FAILS = both(
    py(f"{CC}:941", "future.set_exception(Exception(failure_message))"),
    py(f"{CC}:1307", "return await asyncio.gather("),
    rs(f"{UTIL}:245", "return Err(Error::UtilityCallFailed {"),
    rs(f"{CLIENT}:765", "outcomes.into_iter().collect()"),
    rs(f"{TESTS}:1490", "async fn call_utility_waits_for_all_engines_before_returning_error()"),
    engine(f"{CORE}:1850", 'output.failure_message = f"Call to {name} method failed: {str(e)}"'),
)
# One case per method of METHODS (its wire args shown in the requirement).
EVERY_METHOD = [{"method": method, "args": args} for method, (args, _value) in METHODS.items()]


def _same_args(method: str, seen: list[Any], expected: list[Any]) -> bool:
    """Wire args equal; a LoRARequest may carry its trailing default fields (vLLM's does)."""
    if method == "add_lora" and len(seen) == 1 and isinstance(seen[0], list):
        head, tail = seen[0][:3], seen[0][3:]
        return head == expected[0] and all(v in (None, False, "") for v in tail)
    return seen == expected


@case("utility.{method}.fan_out_once", Level.MUST,
      "A {method} call reaches every engine (3) exactly once, with the wire args {args}.",
      grounds=FANOUT, needs=CALL, params=EVERY_METHOD)
async def fan_out(ctx: CaseContext, method: str) -> None:
    args, value = METHODS[method]
    group = await ctx.start(utility_engines(method, *[UtilityReply(value)] * 3))
    await prepare(ctx, method)
    before = call_counts(group, method)
    await ctx.driver.call_utility(method, args)
    per_engine = calls_since(group, method, before)
    ctx.require(all(len(calls) == 1 and _same_args(method, calls[0], args)
                    for calls in per_engine.values()),
                expected=f"each of 3 engines: one {method} call with args {args}",
                observed=per_engine)


@case("utility.{method}.one_engine_fails", Level.MUST,
      "When one engine of 3 (the last) fails {method}, the call fails instead of "
      "answering from the others.", grounds=ONE_FAILS, needs=CALL, params=EVERY_METHOD)
async def one_engine_fails(ctx: CaseContext, method: str) -> None:
    args, value = METHODS[method]
    group = await ctx.start(utility_engines(method, *[UtilityReply(value)] * 3))
    await prepare(ctx, method)
    # Failing only from now on: a frontend may call the method while starting up.
    group.engines[2].script.utilities[method] = UtilityReply(
        failure=f"{method} failed on engine 2")
    await refused(ctx, ctx.driver.call_utility(method, args),
                  f"an error: engine 2 of 3 failed {method}")
