"""How a client pairs utility replies with calls (protocol-python.md §5.4): by call id,
however late, in whatever order and while other calls are pending; and what it does with a
reply it never asked for.

Engines answer in their own time: a reply may come late, replies of several engines may
arrive in any order (the answers are still gathered in engine order), and concurrent calls'
replies may cross. Call ids -1 (an elastic-EP notification) and -2 (a fault-tolerance
status report) are not replies to any call: the client must keep working after one.
"""

from __future__ import annotations

import asyncio
import time

from conformance.utility.helpers import (
    CALL,
    CC,
    CLIENT,
    CONSENSUS,
    CORE,
    IMP,
    RESET_AND,
    STATE,
    answer,
    still_serves,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineScript,
    Level,
    UtilityReply,
    both,
    case,
    differ,
    engine,
    messages,
    py,
    rs,
)

# A reply is matched to its call by call id, however late and in whatever order.
MATCH = both(
    py(f"{CC}:1327", "self.utility_results[call_id] = future"),
    py(f"{CC}:937", "future = utility_results.pop(output.call_id)"),
    rs(f"{STATE}:459", "self.utility_calls.insert(call_id, tx);"),
    rs(f"{IMP}:254", "match self.utility_reg.lock().resolve(&call_id) {"),
    engine(f"{CORE}:1768", "output = UtilityOutput(call_id)"),
)
# The answers are gathered in engine order, whatever order the replies arrive in.
_IN_ENGINE_ORDER = (
    py(f"{CC}:1307", "return await asyncio.gather("),
    rs(f"{CLIENT}:751", "let outcomes = join_all(prepared_calls.into_iter().map("),
)
# Special call ids: -1 (elastic-EP notification), -2 (fault-tolerance status).
_RS_NEGATIVE_ID_DROPPED = (
    rs(f"{IMP}:249", "let Some(call_id) = output.call_id.as_u64() else {"),
    rs(f"{IMP}:521", '"dropping output for unexpected utility call"'),
)
EEP_DP = both(
    py(f"{CC}:1222", "outputs.utility_output.call_id == EEP_NOTIFICATION_CALL_ID"),
    py(f"{CC}:1223", "and notification_callback_handler is not None"),
    *_RS_NEGATIVE_ID_DROPPED,
    engine(f"{CORE}:2650", "call_id=EEP_NOTIFICATION_CALL_ID,"),
)
EEP_SINGLE = differ(
    py(f"{CC}:1212", 'getattr(self.__class__, "eep_process_engine_core_notification", None)'),
    py(f"{CC}:937", "future = utility_results.pop(output.call_id)"),
    *_RS_NEGATIVE_ID_DROPPED,
    engine(f"{CORE}:2650", "call_id=EEP_NOTIFICATION_CALL_ID,"),
    note="python: only the DP clients define eep_process_engine_core_notification "
         "(core_client.py:1212), so the single-engine client hands call id -1 to "
         "utility_results.pop (core_client.py:937): KeyError, the output handler dies; rust "
         "drops any call id that is not a u64 (imp.rs:249). An engine sends -1 only after an "
         "elastic-EP reconfiguration (core.py:2650), which needs data parallelism",
)
FT_STATUS = both(
    py(f"{CC}:1237", "elif outputs.utility_output.call_id == FT_STATUS_CALL_ID:"),
    *_RS_NEGATIVE_ID_DROPPED,
    engine("vllm/v1/fault_tolerance/engine_core_sentinel.py:149", "call_id=FT_STATUS_CALL_ID,"),
)


@case("utility.reply.delayed", Level.MUST,
      "A utility reply that arrives late (0.5 s) is still matched to its call.", grounds=MATCH,
      needs=[Capability.IS_SLEEPING])
async def delayed_reply(ctx: CaseContext) -> None:
    await ctx.start([EngineScript(utilities={"is_sleeping": UtilityReply(True, delay=0.5)})])
    result = await ctx.driver.is_sleeping()
    ctx.require(result is True, expected="is_sleeping true", observed=result)


@case("utility.concurrent.matched_by_call_id", Level.MUST,
      "Concurrent utility calls get their own replies, matched by call id (the older "
      "call's reply arrives while the newer call is still pending).", grounds=MATCH,
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


@case("utility.reply.reversed_order_and", Level.MUST,
      "Replies from 3 engines arriving in reverse order ([true, true, false], engine 0 "
      "last) still aggregate to reset_prefix_cache false.",
      grounds=both(*_IN_ENGINE_ORDER, *RESET_AND.cites), needs=CALL)
async def reversed_and(ctx: CaseContext) -> None:
    result = await answer(ctx, "reset_prefix_cache", [True, True, False], [0.4, 0.2, 0.0])
    ctx.require(result is False, expected="false", observed=result)


@case("utility.reply.interleaved_consensus", Level.MUST,
      "is_scheduler_paused replies from 4 engines arriving interleaved (1, 3, 0, 2) "
      "aggregate to the common value.", grounds=both(*_IN_ENGINE_ORDER, *CONSENSUS.cites),
      needs=CALL)
async def interleaved_consensus(ctx: CaseContext) -> None:
    result = await answer(ctx, "is_scheduler_paused", [True] * 4, [0.3, 0.0, 0.45, 0.15])
    ctx.require(result is True, expected="true", observed=result)


@case("utility.concurrent.different_methods", Level.MUST,
      "Concurrent calls of three different methods on 2 engines, with replies crossing, "
      "each get their own aggregated answer.",
      grounds=both(*MATCH.cites, *CONSENSUS.cites[:2], *RESET_AND.cites[:3]), needs=CALL)
async def concurrent_methods(ctx: CaseContext) -> None:
    await ctx.start([
        EngineScript(utilities={"is_sleeping": UtilityReply(True, delay=0.4),
                                "reset_prefix_cache": UtilityReply(True),
                                "is_scheduler_paused": UtilityReply(False, delay=0.2)}),
        EngineScript(utilities={"is_sleeping": UtilityReply(True),
                                "reset_prefix_cache": UtilityReply(False, delay=0.3),
                                "is_scheduler_paused": UtilityReply(False)})])
    results = await asyncio.gather(
        ctx.driver.call_utility("is_sleeping", []),
        ctx.driver.call_utility("reset_prefix_cache", [False, False]),
        ctx.driver.call_utility("is_scheduler_paused", []))
    ctx.require(results == [True, False, False],
                expected="is_sleeping true, reset_prefix_cache false, paused false",
                observed=results)


# ---------------------------------------------------------------- stray replies

# What an engine sends after an elastic-EP reconfiguration (core.py:2646-2652).
EEP = messages.UtilityOutput(-1, None, messages.UtilityResult(None, ["RECONFIGURE_FINISHED", 0]))
FT = messages.UtilityOutput(-2, None, messages.UtilityResult(None, {"status": "healthy"}))


# (case, engines, what the engine sends, level, what it is, grounds). The single-engine EEP
# case is a SHOULD like dp.utility.unsolicited_reply_ignored: Python's non-DP client has no
# EEP handler and treats -1 as an unknown call id (KeyError in its output reader).
_STRAY = (
    ("eep_notification_single", 1, EEP, Level.SHOULD, "an EEP notification (call id -1)",
     EEP_SINGLE),
    ("eep_notification_dp", 2, EEP, Level.MUST, "an EEP notification (call id -1)", EEP_DP),
    ("ft_status", 1, FT, Level.MUST, "an FT status report (call id -2)", FT_STATUS),
)


@case("utility.stray.{name}", Level.MUST,
      "{title} from an engine ({engines} engine(s)) does not break "
      "the client: utilities and streams keep working.", grounds=EEP_DP, needs=CALL,
      params=[{"name": name, "engines": engines, "output": output, "level": level,
               "what": what, "title": what.capitalize(), "grounds": grounds}
              for name, engines, output, level, what, grounds in _STRAY])
async def stray_reply(ctx: CaseContext, engines: int, output: messages.UtilityOutput,
                      what: str) -> None:
    group = await ctx.start(engines)
    frames = group.codec.encode_outputs(messages.EngineCoreOutputs(
        group.engines[0].rank, [], None, time.time(), utility_output=output))
    group.engines[0].send_garbage(list(frames))
    await ctx.quiet(0.2)
    await still_serves(ctx, what)
