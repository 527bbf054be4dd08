"""DP aggregation of utilities (seed PR #43429, core_client.py DPLB).

is_sleeping must agree across engines (consensus), reset_prefix_cache is the AND of every
engine's answer, and utility calls fan out to each engine exactly once; a failure from one
engine fails the aggregated call, and a reply nobody asked for or a reply that never comes
must not hang or kill the client.
"""

from __future__ import annotations

import asyncio
import time

from conformance.dp.helpers import CC, CORE, RC, RT
from harness.cases.authoring import (
    UTILITY_GIVE_UP_S,
    Capability,
    CaseContext,
    EngineScript,
    FrontendError,
    Level,
    UtilityReply,
    both,
    case,
    defect,
    differ,
    engine,
    messages,
    py,
    recommendation,
    rs,
)

# is_sleeping asks every engine and returns the shared answer.
SLEEP_AGREE = both(
    py(f"{CC}:1406", 'return await self.call_utility_consensus_async("is_sleeping")'),
    py(f"{CC}:1320", "return results[0]"),
    rs(f"{RC}:901", 'self.call_utility_consensus("is_sleeping", ()).await'),
    rs(f"{RC}:780", "Ok(results.into_iter().next().unwrap())"),
    rs(f"{RT}:2653", "assert!(client.is_sleeping().await.unwrap());"),
    engine(f"{CORE}:1078", "def is_sleeping(self) -> bool:"),
)
# Engines that disagree make is_sleeping fail.
SLEEP_DISAGREE = both(
    py(f"{CC}:1316", "if any(result != results[0] for result in results):"),
    py(f"{CC}:1317", "raise RuntimeError("),
    rs(f"{RC}:782", "Err(Error::InconsistentUtilityResults {"),
    rs(f"{RT}:2603", "let error = client.is_sleeping().await.unwrap_err();"),
)
# The disagreement error quotes the engines' values.
SLEEP_NAMES = both(
    py(f"{CC}:1318", 'f"Engines returned different {method} results: {results}"'),
    rs(f"{RC}:784", 'values: format!("{results:?}"),'),
    rs("rust/src/engine-core-client/src/error.rs:98",
       "returned inconsistent results across engines: {values}"),
)
# reset_prefix_cache is the AND of every engine's answer.
RESET_AND = both(
    py(f"{CC}:1387", "return all("),
    py(f"{CC}:1388", "await self.call_utility_all_async("),
    rs(f"{RC}:932", ".all(|reset| reset))"),
    rs(f"{RT}:2739", "assert!(!client.reset_prefix_cache(false, false).await.unwrap());"),
    rs(f"{RT}:2696", "assert!(client.reset_prefix_cache(false, false).await.unwrap());"),
    engine(f"{CORE}:883", "def reset_prefix_cache("),
)
SLEEP = [Capability.IS_SLEEPING]
RESET = [Capability.RESET_PREFIX_CACHE]


def _answers(method: str, *values: object) -> list[EngineScript]:
    return [EngineScript(utilities={method: UtilityReply(v)}) for v in values]


# ----------------------------------------------------------------- is_sleeping: consensus

async def _is_sleeping_value(ctx: CaseContext, *values: bool) -> None:
    await ctx.start(_answers("is_sleeping", *values))
    result = await ctx.driver.is_sleeping()
    ctx.require(result is values[0], expected=f"is_sleeping {values[0]}", observed=result)


@case("dp.is_sleeping.all_true", Level.MUST,
      "When every engine reports sleeping, is_sleeping is true.", grounds=SLEEP_AGREE,
      needs=SLEEP)
async def sleeping_all_true(ctx: CaseContext) -> None:
    await _is_sleeping_value(ctx, True, True)


@case("dp.is_sleeping.all_false", Level.MUST,
      "When no engine reports sleeping, is_sleeping is false.", grounds=SLEEP_AGREE,
      needs=SLEEP)
async def sleeping_all_false(ctx: CaseContext) -> None:
    await _is_sleeping_value(ctx, False, False)


@case("dp.is_sleeping.single_engine", Level.MUST,
      "With one engine its is_sleeping answer passes straight through.",
      grounds=SLEEP_AGREE, needs=SLEEP)
async def sleeping_single(ctx: CaseContext) -> None:
    await _is_sleeping_value(ctx, True)


async def _expect_disagreement(ctx: CaseContext, values: tuple[bool, bool]) -> str:
    await ctx.start(_answers("is_sleeping", *values))
    try:
        result = await ctx.driver.is_sleeping()
    except FrontendError as exc:
        return str(exc)
    ctx.fail(expected=f"an error: engines disagree {list(values)}",
             observed=f"is_sleeping returned {result}")


@case("dp.is_sleeping.disagree", Level.MUST,
      "When engines disagree ([true, false]) is_sleeping fails instead of picking a value.",
      grounds=SLEEP_DISAGREE, needs=SLEEP)
async def sleeping_disagree(ctx: CaseContext) -> None:
    await _expect_disagreement(ctx, (True, False))


@case("dp.is_sleeping.disagree_reversed", Level.MUST,
      "When engines disagree ([false, true]) is_sleeping fails instead of picking a value.",
      grounds=SLEEP_DISAGREE, needs=SLEEP)
async def sleeping_disagree_reversed(ctx: CaseContext) -> None:
    await _expect_disagreement(ctx, (False, True))


@case("dp.is_sleeping.disagree_names_values", Level.MUST,
      "The disagreement error names the values the engines returned.", grounds=SLEEP_NAMES,
      needs=SLEEP)
async def sleeping_names_values(ctx: CaseContext) -> None:
    message = await _expect_disagreement(ctx, (True, False))
    text = message.lower()
    ctx.require("true" in text and "false" in text,
                expected="error text naming both true and false", observed=message)


# ----------------------------------------------------------------- reset_prefix_cache: AND

async def _reset_value(ctx: CaseContext, values: tuple[bool, ...], want: bool) -> None:
    await ctx.start(_answers("reset_prefix_cache", *values))
    result = await ctx.driver.reset_prefix_cache()
    ctx.require(result is want, expected=f"reset_prefix_cache {want} (AND of {list(values)})",
                observed=result)


@case("dp.reset_prefix_cache.all_true", Level.MUST,
      "reset_prefix_cache is true when every engine succeeded.", grounds=RESET_AND,
      needs=RESET)
async def reset_all_true(ctx: CaseContext) -> None:
    await _reset_value(ctx, (True, True), True)


@case("dp.reset_prefix_cache.one_false", Level.MUST,
      "reset_prefix_cache is false (not an error) when any engine failed to reset.",
      grounds=RESET_AND, needs=RESET)
async def reset_one_false(ctx: CaseContext) -> None:
    await _reset_value(ctx, (True, False), False)


@case("dp.reset_prefix_cache.first_false", Level.MUST,
      "reset_prefix_cache is false when the first engine failed and the other succeeded.",
      grounds=RESET_AND, needs=RESET)
async def reset_first_false(ctx: CaseContext) -> None:
    await _reset_value(ctx, (False, True), False)


@case("dp.reset_prefix_cache.all_false", Level.MUST,
      "reset_prefix_cache is false when every engine failed to reset.", grounds=RESET_AND,
      needs=RESET)
async def reset_all_false(ctx: CaseContext) -> None:
    await _reset_value(ctx, (False, False), False)


# ----------------------------------------------------------------- fan-out and failures

@case("dp.utility.fan_out_once", Level.MUST,
      "A utility call reaches every engine exactly once, each with its own call id, "
      "as [client_index, call_id, method, args].",
      grounds=both(
          py(f"{CC}:1309", "self._call_utility_async(method, *args, engine=engine)"),
          py(f"{CC}:1325", "call_id = uuid.uuid1().int >> 64"),
          py(f"{CC}:1330", "*self.encoder.encode((self.client_index, call_id, method, args)),"),
          rs(f"{RC}:743", "for engine in &self.engines {"),
          rs(f"{RC}:744", "let (call_id, rx) = self.inner.allocate_and_register_utility_call()?;"),
          rs(f"{RC}:747", "EngineCoreUtilityRequest::new(self.config.client_index, call_id, "
                          "method, &args)?;"),
          rs(f"{RT}:2166", "async fn multi_engine_abort_is_grouped_and_utility_fans_out_to_all_"
                           "engines() {"),
          engine(f"{CORE}:1765", "client_idx, call_id, method_name, args = request"),
      ), needs=SLEEP)
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
      "A failure_message from one engine makes the aggregated call fail.",
      grounds=both(
          py(f"{CC}:941", "future.set_exception(Exception(failure_message))"),
          py(f"{CC}:1307", "return await asyncio.gather("),
          rs(f"{RC}:756", "rx.await"),
          rs(f"{RC}:765", "outcomes.into_iter().collect()"),
          engine(f"{CORE}:1850", 'output.failure_message = f"Call to {name} method failed: '
                                 '{str(e)}"'),
      ), needs=SLEEP)
async def failure_surfaces(ctx: CaseContext) -> None:
    scripts = [EngineScript(), EngineScript(utilities={
        "is_sleeping": UtilityReply(failure="Call to is_sleeping method failed: boom")})]
    await ctx.start(scripts)
    try:
        result = await ctx.driver.is_sleeping()
    except FrontendError as exc:
        ctx.note(f"error: {exc}")
        return
    ctx.fail(expected="an error from engine 1's failure_message",
             observed=f"is_sleeping returned {result}")


@case("dp.utility.failure_waits_for_all", Level.SHOULD,
      "A failing utility call should return only after every engine has replied.",
      grounds=differ(
          py(f"{CC}:1307", "return await asyncio.gather("),
          rs(f"{RC}:707", "waits for every engine outcome before returning an error"),
          rs(f"{RC}:751", "let outcomes = join_all(prepared_calls.into_iter().map("),
          rs(f"{RT}:1490", "fn call_utility_waits_for_all_engines_before_returning_error()"),
          note="python raises the first engine's failure at once (asyncio.gather without "
               "return_exceptions), leaving the other replies to land unobserved; rust joins "
               "every engine's outcome first so callers can compensate partial mutations"),
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
        ctx.fail(expected="an error", observed="success")
    elapsed = time.monotonic() - began
    ids = {r.message.call_id for r in group.transcript.utility_calls("reset_prefix_cache", 1)}
    replies = [r for r in group.transcript.select(rank=1, direction="out", channel="output")
               if r.message is not None and r.message.utility_output is not None
               and r.message.utility_output.call_id in ids]
    ctx.require(elapsed >= 0.55, expected="error only after engine 1's reply (>= 0.6 s)",
                observed=f"error after {elapsed:.3f}s; engine 1's delayed reply sent at "
                         f"{[round(r.t - began, 3) for r in replies]}s")


@case("dp.utility.never_answered_bounded", Level.SHOULD,
      "A utility call one engine never answers should end (error or value) within a bound "
      "rather than hang the caller.",
      grounds=recommendation(
          py(f"{CC}:1334", "return await future"),
          rs(f"{RC}:756", "rx.await"),
          note="neither 0.33.0 frontend bounds a utility wait (python awaits a bare future, "
               "rust awaits the reply channel with no timeout), so one silent engine hangs the "
               "caller; corewire advises a bound so a stuck engine surfaces as an error"),
      needs=RESET, timeout=30)
async def never_answered(ctx: CaseContext) -> None:
    scripts = [EngineScript(), EngineScript(utilities={
        "reset_prefix_cache": UtilityReply(never=True)})]
    await ctx.start(scripts)
    try:
        result = await asyncio.wait_for(ctx.driver.reset_prefix_cache(),
                                        ctx.t(UTILITY_GIVE_UP_S))
        ctx.note(f"returned {result}")
    except FrontendError as exc:
        ctx.note(f"failed: {exc}")
    except asyncio.TimeoutError:
        ctx.fail(expected=f"an error or a value within {UTILITY_GIVE_UP_S:g} s",
                 observed=f"the call was still pending after {UTILITY_GIVE_UP_S:g} s "
                          "(no bound)")


@case("dp.utility.unsolicited_reply_ignored", Level.SHOULD,
      "A utility reply with an unknown call id should be dropped; the frontend keeps "
      "serving.",
      grounds=defect(
          py(f"{CC}:937", "future = utility_results.pop(output.call_id)"),
          py(f"{CC}:1262", "outputs_queue.put_nowait(e)"),
          rs("rust/src/engine-core-client/src/client/imp.rs:259", "None => false,"),
          rs("rust/src/engine-core-client/src/client/imp.rs:521",
             '"dropping output for unexpected utility call"'),
          note="python deviates: an unknown call id raises KeyError in the output reader "
               "(core_client.py:937), which kills the output task and errors the whole client "
               "(crash); rust drops the reply with a warning (imp.rs:259, 521)"),
      needs=SLEEP)
async def unsolicited_reply(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    stray = messages.EngineCoreOutputs(0, [], None, 1.0, messages.UtilityOutput(
        987654321, None, messages.UtilityResult(None, True)))
    group[0].send_garbage(group.codec.encode_outputs(stray))
    await ctx.quiet(0.2)
    try:
        result = await asyncio.wait_for(ctx.driver.is_sleeping(), ctx.t(3.0))
    except asyncio.TimeoutError:  # a hang is this rule's failure, graded by its level
        ctx.fail(expected="is_sleeping still answers false",
                 observed="is_sleeping still pending after 3 s")
    ctx.require(result is False, expected="is_sleeping still answers false",
                observed=result)
