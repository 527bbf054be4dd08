"""DP aggregation of utilities and request routing (seed PR #43429, core_client.py DPLB).

is_sleeping must agree across engines (consensus), reset_prefix_cache is the AND of every
engine's answer, utility calls fan out to each engine exactly once, and an explicit
data_parallel_rank is honoured.
"""

from __future__ import annotations

import asyncio
import time

from harness.case_context import CaseContext
from harness.casekit import hold, prompt, requests_for
from harness.frontends.driver import Capability, FrontendError
from harness.verdicts import Level, case
from mock_engines.script import EngineScript, UtilityReply, any_request

PR = "PR #43429"
DPLB = "vllm/v1/engine/core_client.py DPLBAsyncMPClient (0.33.0)"
SLEEP = [Capability.IS_SLEEPING]
RESET = [Capability.RESET_PREFIX_CACHE]


def _answers(method: str, *values: object) -> list[EngineScript]:
    return [EngineScript(utilities={method: UtilityReply(v)}) for v in values]


async def _is_sleeping_value(ctx: CaseContext, *values: bool) -> None:
    await ctx.start(_answers("is_sleeping", *values))
    result = await ctx.driver.is_sleeping()
    ctx.require(result is values[0], expected=f"is_sleeping {values[0]}", observed=result)


@case("dp.is_sleeping.all_true", Level.MUST,
      "When every engine reports sleeping, is_sleeping is true.", source=PR, needs=SLEEP)
async def sleeping_all_true(ctx: CaseContext) -> None:
    await _is_sleeping_value(ctx, True, True)


@case("dp.is_sleeping.all_false", Level.MUST,
      "When no engine reports sleeping, is_sleeping is false.", source=PR, needs=SLEEP)
async def sleeping_all_false(ctx: CaseContext) -> None:
    await _is_sleeping_value(ctx, False, False)


@case("dp.is_sleeping.single_engine", Level.MUST,
      "With one engine its is_sleeping answer passes straight through.", source=PR,
      needs=SLEEP)
async def sleeping_single(ctx: CaseContext) -> None:
    await _is_sleeping_value(ctx, True)


async def _expect_disagreement(ctx: CaseContext, values: tuple[bool, bool]) -> str:
    await ctx.start(_answers("is_sleeping", *values))
    try:
        result = await ctx.driver.is_sleeping()
    except FrontendError as exc:
        return str(exc)
    ctx.require(False, expected=f"an error: engines disagree {list(values)}",
                observed=f"is_sleeping returned {result}")
    return ""


@case("dp.is_sleeping.disagree", Level.MUST,
      "When engines disagree ([true, false]) is_sleeping fails instead of picking a value.",
      source=PR, needs=SLEEP)
async def sleeping_disagree(ctx: CaseContext) -> None:
    await _expect_disagreement(ctx, (True, False))


@case("dp.is_sleeping.disagree_reversed", Level.MUST,
      "When engines disagree ([false, true]) is_sleeping fails instead of picking a value.",
      source=PR, needs=SLEEP)
async def sleeping_disagree_reversed(ctx: CaseContext) -> None:
    await _expect_disagreement(ctx, (False, True))


@case("dp.is_sleeping.disagree_names_values", Level.SHOULD,
      "The disagreement error should name the values the engines returned.", source=PR,
      needs=SLEEP)
async def sleeping_names_values(ctx: CaseContext) -> None:
    message = await _expect_disagreement(ctx, (True, False))
    text = message.lower()
    ctx.require("true" in text and "false" in text,
                expected="error text naming both true and false", observed=message)


async def _reset_value(ctx: CaseContext, values: tuple[bool, ...], want: bool) -> None:
    await ctx.start(_answers("reset_prefix_cache", *values))
    result = await ctx.driver.reset_prefix_cache()
    ctx.require(result is want, expected=f"reset_prefix_cache {want} (AND of {list(values)})",
                observed=result)


@case("dp.reset_prefix_cache.all_true", Level.MUST,
      "reset_prefix_cache is true when every engine succeeded.", source=PR, needs=RESET)
async def reset_all_true(ctx: CaseContext) -> None:
    await _reset_value(ctx, (True, True), True)


@case("dp.reset_prefix_cache.one_false", Level.MUST,
      "reset_prefix_cache is false (not an error) when any engine failed to reset.",
      source=PR, needs=RESET)
async def reset_one_false(ctx: CaseContext) -> None:
    await _reset_value(ctx, (True, False), False)


@case("dp.reset_prefix_cache.first_false", Level.MUST,
      "reset_prefix_cache is false when the first engine failed and the other succeeded.",
      source=PR, needs=RESET)
async def reset_first_false(ctx: CaseContext) -> None:
    await _reset_value(ctx, (False, True), False)


@case("dp.reset_prefix_cache.all_false", Level.MUST,
      "reset_prefix_cache is false when every engine failed to reset.", source=PR,
      needs=RESET)
async def reset_all_false(ctx: CaseContext) -> None:
    await _reset_value(ctx, (False, False), False)


@case("dp.utility.fan_out_once", Level.MUST,
      "A utility call reaches every engine exactly once, each with its own call id, "
      "as [client_index, call_id, method, args].", source=PR, needs=SLEEP)
async def fan_out_once(ctx: CaseContext) -> None:
    group = await ctx.start(3)
    await ctx.driver.is_sleeping()
    await ctx.quiet(0.1)
    calls = group.transcript.utility_calls("is_sleeping")
    per_engine = sorted(r.rank for r in calls)
    ctx.require(per_engine == [0, 1, 2], expected="one is_sleeping frame per engine [0, 1, 2]",
                observed=per_engine)
    ids = [r.message.call_id for r in calls]
    ctx.require(len(set(ids)) == len(ids), expected="distinct call ids", observed=ids)
    ctx.require(all(r.message.args == [] for r in calls), expected="args []",
                observed=[r.message.args for r in calls])


@case("dp.utility.failure_surfaces", Level.MUST,
      "A failure_message from one engine makes the aggregated call fail.", source=PR,
      needs=SLEEP)
async def failure_surfaces(ctx: CaseContext) -> None:
    scripts = [EngineScript(), EngineScript(utilities={
        "is_sleeping": UtilityReply(failure="Call to is_sleeping method failed: boom")})]
    await ctx.start(scripts)
    try:
        result = await ctx.driver.is_sleeping()
    except FrontendError as exc:
        ctx.note(f"error: {exc}")
        return
    ctx.require(False, expected="an error from engine 1's failure_message",
                observed=f"is_sleeping returned {result}")


@case("dp.utility.failure_waits_for_all", Level.SHOULD,
      "A failing utility call should return only after every engine has replied.",
      source="PR #43429 (call_utility_waits_for_all_engines_before_returning_error)",
      needs=RESET)
async def failure_waits_for_all(ctx: CaseContext) -> None:
    scripts = [EngineScript(utilities={"reset_prefix_cache": UtilityReply(failure="boom")}),
               EngineScript(utilities={"reset_prefix_cache": UtilityReply(True, delay=0.6)})]
    group = await ctx.start(scripts)
    began = time.monotonic()
    try:
        await ctx.driver.reset_prefix_cache()
    except FrontendError:
        pass
    else:
        ctx.require(False, expected="an error", observed="success")
    elapsed = time.monotonic() - began
    ids = {r.message.call_id for r in group.transcript.utility_calls("reset_prefix_cache", 1)}
    replies = [r for r in group.transcript.select(rank=1, direction="out", channel="output")
               if r.message is not None and r.message.utility_output is not None
               and r.message.utility_output.call_id in ids]
    ctx.require(elapsed >= 0.55, expected="error only after engine 1's reply (>= 0.6 s)",
                observed=f"error after {elapsed:.3f}s; engine 1's delayed reply sent at "
                         f"{[round(r.t - began, 3) for r in replies]}s")


@case("dp.utility.never_answered_bounded", Level.MUST,
      "A utility call one engine never answers ends (error or value) within a bound; "
      "it must not hang the caller.", source="rust-client.md §1.7", needs=RESET, timeout=30)
async def never_answered(ctx: CaseContext) -> None:
    scripts = [EngineScript(), EngineScript(utilities={
        "reset_prefix_cache": UtilityReply(never=True)})]
    await ctx.start(scripts)
    try:
        result = await asyncio.wait_for(ctx.driver.reset_prefix_cache(), ctx.t(15))
        ctx.note(f"returned {result}")
    except FrontendError as exc:
        ctx.note(f"failed: {exc}")
    except asyncio.TimeoutError:
        ctx.require(False, expected="an error or a value within 15 s",
                    observed="the call was still pending after 15 s (no bound)")


@case("dp.utility.unsolicited_reply_ignored", Level.SHOULD,
      "A utility reply with an unknown call id should be dropped; the frontend keeps "
      "serving.", source="rust-client.md §1.3 (dispatcher)", needs=SLEEP)
async def unsolicited_reply(ctx: CaseContext) -> None:
    from harness.wire import messages as m

    group = await ctx.start(1)
    stray = m.EngineCoreOutputs(0, [], None, 1.0, m.UtilityOutput(
        987654321, None, m.UtilityResult(None, True)))
    group[0].send_garbage(group.codec.encode_outputs(stray))
    await ctx.quiet(0.2)
    result = await ctx.driver.is_sleeping()
    ctx.require(result is False, expected="is_sleeping still answers false",
                observed=result)


@case("dp.routing.explicit_rank", Level.MUST,
      "A request with data_parallel_rank r is sent to engine r only.", source=DPLB,
      needs=[Capability.GENERATE, Capability.DP_RANK])
async def explicit_rank(ctx: CaseContext) -> None:
    group = await ctx.start(3)
    for rank in (2, 0, 1, 2):
        p = prompt(10 + len(group.transcript.adds()))
        handle = await ctx.driver.generate(p, 2, data_parallel_rank=rank)
        await handle.wait(ctx.t(3))
        owner = requests_for(group, [p])
        ctx.require(owner is not None and list(owner.values()) == [rank],
                    expected=f"the ADD for data_parallel_rank={rank} at engine {rank}",
                    observed=owner)


@case("dp.routing.spread", Level.SHOULD,
      "Without an explicit rank, concurrent requests should be spread over the engines.",
      source=DPLB, needs=[Capability.GENERATE])
async def routing_spread(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())]) for _ in range(2)])
    prompts = [prompt(i) for i in range(6)]
    handles = [await ctx.driver.generate(p, 50) for p in prompts]
    for h in handles:
        await h.wait_first(ctx.t(3))
    owners = requests_for(group, prompts) or {}
    per_engine = [list(owners.values()).count(r) for r in (0, 1)]
    ctx.note(f"requests per engine: {per_engine}")
    ctx.require(min(per_engine) >= 2, expected="each engine gets at least 2 of 6",
                observed=per_engine)
