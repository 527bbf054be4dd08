"""DP aggregation of utilities and request routing (seed PR #43429, core_client.py DPLB).

is_sleeping must agree across engines (consensus), reset_prefix_cache is the AND of every
engine's answer, utility calls fan out to each engine exactly once, and an explicit
data_parallel_rank is honoured.
"""

from __future__ import annotations

import asyncio
import time

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, defect, differ, engine, py, recommendation, rs
from harness.cases.helpers import UTILITY_GIVE_UP_S, hold, prompt, requests_for
from harness.frontends.api import Capability, FrontendError
from harness.results.records import Level
from mock_engines.script import EngineScript, UtilityReply, any_request

CC = "vllm/v1/engine/core_client.py"
RC = "rust/src/engine-core-client/src/client.rs"
RT = "rust/src/engine-core-client/src/tests/client.rs"
RS = "rust/src/engine-core-client/src/client/state.rs"
CORE = "vllm/v1/engine/core.py"

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
    ctx.require(False, expected=f"an error: engines disagree {list(values)}",
                observed=f"is_sleeping returned {result}")
    return ""


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
    ctx.require(False, expected="an error from engine 1's failure_message",
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
        ctx.require(False, expected="an error", observed="success")
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
        ctx.require(False, expected=f"an error or a value within {UTILITY_GIVE_UP_S:g} s",
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
    from harness.protocol.wire import messages as m

    group = await ctx.start(1)
    stray = m.EngineCoreOutputs(0, [], None, 1.0, m.UtilityOutput(
        987654321, None, m.UtilityResult(None, True)))
    group[0].send_garbage(group.codec.encode_outputs(stray))
    await ctx.quiet(0.2)
    try:
        result = await asyncio.wait_for(ctx.driver.is_sleeping(), ctx.t(3.0))
    except asyncio.TimeoutError:  # a hang is this rule's failure, graded by its level
        ctx.require(False, expected="is_sleeping still answers false",
                    observed="is_sleeping still pending after 3 s")
        return
    ctx.require(result is False, expected="is_sleeping still answers false",
                observed=result)


@case("dp.routing.explicit_rank", Level.MUST,
      "A request with data_parallel_rank r is sent to engine r only.",
      grounds=both(
          py(f"{CC}:1763", "if (eng_index := request.data_parallel_rank) is None and ("),
          py(f"{CC}:1808", "chosen_engine = self.core_engines[eng_index]"),
          rs(f"{RS}:202", "if let Some(rank) = data_parallel_rank {"),
          rs(f"{RS}:203", "u16::try_from(rank).ok().map(EngineId::from_engine_index)"),
          rs(f"{RS}:1176", "fn register_with_data_parallel_rank_routes_to_specified_engine() {"),
      ),
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


@case("dp.routing.spread", Level.MUST,
      "Without an explicit rank, concurrent requests are spread over the engines.",
      grounds=both(
          py(f"{CC}:1786", "score: float = max(self.client_count * inflight, waiting + running)"),
          py(f"{CC}:1811", "self.engine_inflight[chosen_engine] += 1"),
          rs(f"{RS}:92", "self.inflight.max(stats.running + stats.waiting"),
          rs(f"{RS}:97", "self.inflight += 1;"),
          rs(f"{RS}:219", ".min_by_key(|(_, state)| state.routing_score())"),
      ), needs=[Capability.GENERATE])
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
