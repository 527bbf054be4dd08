"""Utility call framing (protocol-python.md §5.4): the frames a frontend sends and how it
matches replies to calls."""

from __future__ import annotations

import asyncio

from harness.case_context import CaseContext
from harness.frontends.driver import Capability
from harness.verdicts import Level, case
from mock_engines.script import EngineScript, UtilityReply

SPEC = "protocol-python.md §5.4 (0.33.0)"


@case("utility.is_sleeping.wire_shape", Level.MUST,
      "is_sleeping is sent as UTILITY [client_index:int, call_id:uint64, 'is_sleeping', []].",
      source=SPEC, needs=[Capability.IS_SLEEPING])
async def is_sleeping_shape(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    await ctx.driver.is_sleeping()
    calls = group.transcript.utility_calls("is_sleeping")
    ctx.require(len(calls) == 1, expected="one is_sleeping frame", observed=len(calls))
    msg = calls[0].message
    ctx.require(calls[0].frames[0] == b"\x03", expected="type frame 0x03",
                observed=calls[0].frames[0].hex())
    ctx.require(isinstance(msg.client_index, int) and 0 <= msg.call_id < 2**64
                and msg.args == [],
                expected="[int, uint64, 'is_sleeping', []]",
                observed=[msg.client_index, msg.call_id, msg.method, msg.args])


@case("utility.reset_prefix_cache.wire_args", Level.MUST,
      "reset_prefix_cache() is sent with args [false, false] (reset_running_requests, "
      "reset_connector).", source="PR #43429", needs=[Capability.RESET_PREFIX_CACHE])
async def reset_args(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    await ctx.driver.reset_prefix_cache()
    calls = group.transcript.utility_calls("reset_prefix_cache")
    ctx.require([c.message.args for c in calls] == [[False, False]],
                expected="one call with args [false, false]",
                observed=[c.message.args for c in calls])


@case("utility.reply.delayed", Level.MUST,
      "A utility reply that arrives late (0.5 s) is still matched to its call.", source=SPEC,
      needs=[Capability.IS_SLEEPING])
async def delayed_reply(ctx: CaseContext) -> None:
    await ctx.start([EngineScript(utilities={"is_sleeping": UtilityReply(True, delay=0.5)})])
    result = await ctx.driver.is_sleeping()
    ctx.require(result is True, expected="is_sleeping true", observed=result)


@case("utility.concurrent.matched_by_call_id", Level.MUST,
      "Concurrent utility calls get their own replies, matched by call id (the older "
      "call's reply arrives while the newer call is still pending).", source=SPEC,
      needs=[Capability.IS_SLEEPING, Capability.RESET_PREFIX_CACHE])
async def concurrent(ctx: CaseContext) -> None:
    await ctx.start([EngineScript(utilities={
        "is_sleeping": UtilityReply(True),
        "reset_prefix_cache": UtilityReply(False, delay=0.4)})])
    sleeping, reset = await asyncio.gather(ctx.driver.is_sleeping(),
                                           ctx.driver.reset_prefix_cache())
    ctx.require(sleeping is True and reset is False,
                expected="is_sleeping true, reset_prefix_cache false",
                observed=f"is_sleeping {sleeping}, reset_prefix_cache {reset}")
