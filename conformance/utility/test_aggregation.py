"""How a client folds its engines' answers into one: consensus, AND, engine 0's answer,
flattening, at every engine count (one engine included).

Sources: Python DPLB `call_utility_all_async` / the per-method folds (core_client.py
:1305-1320, :1361-1415, :1814-1816); Rust `call_utility` (rust-client.md §1.7) and the
per-method folds of its client (client.rs). Where the two differ (add_lora / remove_lora,
collective_rpc, a method without a folding rule) the rule is a SHOULD.
"""

from __future__ import annotations

from typing import Any

from conformance.utility.helpers import (
    CALL,
    CC,
    CLIENT,
    CONSENSUS,
    CORE,
    ENGINE_ZERO,
    LORA,
    RESET_AND,
    ROUTES,
    RS_FLATTEN,
    TESTS,
    UTIL,
    answer,
    prepare,
    refused,
    utility_engines,
)
from harness.cases.authoring import (
    Basis,
    CaseContext,
    EngineScript,
    FrontendError,
    Level,
    UtilityReply,
    both,
    case,
    differ,
    engine,
    py,
    rs,
)

# wake_up is the AND over engines ("fully awake" only when every engine is).
WAKE_AND = both(
    py(f"{CC}:1403", 'return all(await self.call_utility_all_async("wake_up", tags))'),
    rs(f"{CLIENT}:972", ".all(|fully_awake| fully_awake))"),
    rs(f"{ROUTES}/sleep.rs:119", 'status: if fully_awake { "awake" } else { "sleeping" },'),
    rs(f"{TESTS}:2335", "async fn wake_up_requires_every_engine_to_be_fully_awake()"),
    engine(f"{CORE}:1031", "def wake_up(self, tags: list[str] | None = None) -> bool:"),
    note="both AND; vllm-rs reports it as POST /wake_up's status ('sleeping' when not every "
         "engine is fully awake, sleep.rs:119)",
)
LORA_AND = differ(
    py(f"{CC}:1418", 'return await self.call_utility_async("add_lora", lora_request)'),
    py(f"{CC}:1421", 'return await self.call_utility_async("remove_lora", lora_id)'),
    ENGINE_ZERO,
    rs(f"{CLIENT}:941", ".all(|loaded| loaded))"),
    rs(f"{CLIENT}:950", ".all(|removed| removed))"),
    note="rust ANDs add_lora / remove_lora over engines (client.rs:941, :950); python's DPLB "
         "client fans out but returns engine 0's answer (core_client.py:1816)",
)
RPC_FLATTEN = differ(
    py(f"{CC}:1442", '"collective_rpc", method, timeout, args, kwargs'),
    ENGINE_ZERO,
    RS_FLATTEN,
    rs(f"{TESTS}:2418", "async fn collective_rpc_flattens_results_from_all_engines()"),
    note="rust flattens every engine's worker list in engine order (client.rs:810); python's "
         "DPLB client returns engine 0's list only (core_client.py:1816)",
)
# The consensus methods as the folds at every engine count cite them.
CONSENSUS_FOLD = both(
    py(f"{CC}:1316", "if any(result != results[0] for result in results):"),
    py(f"{CC}:1362", 'return await self.call_utility_consensus_async("is_scheduler_paused")'),
    py(f"{CC}:1415", 'return await self.call_utility_consensus_async("get_weight_version")'),
    rs(f"{CLIENT}:777", "if results.iter().all_equal() {"),
    rs(f"{CLIENT}:990", 'self.call_utility_consensus("is_scheduler_paused", ()).await'),
    rs(f"{CLIENT}:896", 'self.call_utility_consensus("get_weight_version", ()).await'),
)
ADD_LORA_TRUE = both(
    py(f"{CC}:1418", 'return await self.call_utility_async("add_lora", lora_request)'),
    ENGINE_ZERO,
    rs(f"{CLIENT}:941", ".all(|loaded| loaded))"),
    note="rust ANDs and python returns engine 0's answer (the and_across_engines cases); with "
         "every engine answering true both give true",
)
LIST_LORAS = both(
    py(f"{CC}:1424", 'return await self.call_utility_async("list_loras")'),
    ENGINE_ZERO,
    py(f"{CC}:944", "future.set_result(output.result.result)"),
    rs(f"{UTIL}:252", "let result = self.result.map(|e| e.result).unwrap_or(Value::Nil);"),
    rs(f"{CLIENT}:713",
       "pub async fn call_utility<T, A>(&self, method: &str, args: A) -> Result<Vec<T>>"),
    engine(f"{CORE}:1094", "def list_loras(self) -> set[int]:"),
    note="vllm-rs never sends list_loras (it lists its own adapter registry, "
         "server/src/state.rs:168); its call_utility hands any engine's answer back as sent",
)
NON_BOOL = differ(
    py(f"{CC}:1406", 'return await self.call_utility_consensus_async("is_sleeping")'),
    py(f"{CC}:1316", "if any(result != results[0] for result in results):"),
    rs(f"{CLIENT}:901", 'self.call_utility_consensus("is_sleeping", ()).await'),
    rs(f"{UTIL}:254",
       "rmpv::ext::from_value(result).map_err(|error| Error::UtilityResultDecode {"),
    note="rust decodes is_sleeping as a bool and refuses anything else (utility.rs:254); "
         "python compares the engines' answers and returns whatever they agree on "
         "(core_client.py:1316)",
)
UNLISTED = differ(
    ENGINE_ZERO,
    py(f"{CC}:1815", "# Only the result from the first engine is returned."),
    rs(f"{CLIENT}:713",
       "pub async fn call_utility<T, A>(&self, method: &str, args: A) -> Result<Vec<T>>"),
    note="python's DPLB client answers any method with engine 0's result "
         "(core_client.py:1816); rust's call_utility returns one result per engine for its "
         "caller to fold (client.rs:713), and vllm-rs serves no route for a method it does "
         "not know",
)
COUNTS = [{"n": n} for n in (1, 2, 3)]


# ---------------------------------------------------------------- consensus

@case("utility.{method}.disagree", Level.MUST,
      "When engines disagree on {method} ({values}, the odd one last) the call "
      "fails instead of picking a value.", grounds=CONSENSUS, needs=CALL,
      params=[{"method": "is_scheduler_paused", "values": [False, False, True]},
              {"method": "get_weight_version", "values": ["v1", "v1", "v2"]}])
async def consensus_disagree(ctx: CaseContext, method: str, values: list[Any]) -> None:
    await ctx.start(utility_engines(method, *[UtilityReply(v) for v in values]))
    await refused(ctx, ctx.driver.call_utility(method, []),
                  f"an error: engines disagree {values}")


@case("utility.is_scheduler_paused.agree_four", Level.MUST,
      "With 4 engines that all report paused, every engine is asked and "
      "is_scheduler_paused is true.", grounds=CONSENSUS, needs=CALL)
async def paused_agree_four(ctx: CaseContext) -> None:
    result = await answer(ctx, "is_scheduler_paused", [True] * 4)
    asked = len(ctx.engines.transcript.utility_calls("is_scheduler_paused"))
    ctx.require(result is True and asked == 4, expected="true, 4 engines asked",
                observed=f"{result!r}, {asked} engine(s) asked")


# ---------------------------------------------------------------- AND and engine 0

@case("utility.reset_prefix_cache.and_four_last_false", Level.MUST,
      "reset_prefix_cache over 4 engines is false when only the last engine fails to reset.",
      grounds=RESET_AND, needs=CALL)
async def reset_and_four(ctx: CaseContext) -> None:
    result = await answer(ctx, "reset_prefix_cache", [True, True, True, False])
    ctx.require(result is False, expected="false", observed=result)


# (method, why, grounds): a MUST where both frontends AND (by the level rule), else SHOULD.
_AND = (
    ("wake_up", "Python all() (core_client.py:1403); the Rust client ANDs too and /wake_up "
                "reports it as status 'sleeping'.", WAKE_AND),
    ("add_lora", "Rust ANDs; Python DPLB returns engine 0's answer.", LORA_AND),
    ("remove_lora", "Rust ANDs; Python DPLB returns engine 0's answer.", LORA_AND),
)


@case("utility.{method}.and_across_engines", Level.SHOULD,
      "{method}'s answer {verb} the AND over engines ([true, false] -> false). {reason}",
      grounds=LORA_AND, needs=CALL,
      params=[{"method": method, "reason": reason, "grounds": grounds,
               "level": Level.MUST if grounds.basis is Basis.BOTH else Level.SHOULD,
               "verb": "is" if grounds.basis is Basis.BOTH else "should be"}
              for method, reason, grounds in _AND])
async def and_across_engines(ctx: CaseContext, method: str) -> None:
    result = await answer(ctx, method, [True, False])
    ctx.require(result is False, expected=f"{method} false: engine 1 answered false",
                observed=result)


@case("utility.collective_rpc.flatten_engine_order", Level.SHOULD,
      "collective_rpc returns every engine's results flattened in engine order, even when "
      "the replies arrive in reverse order (Rust flattens; Python DPLB returns engine 0's "
      "list only).", grounds=RPC_FLATTEN, needs=CALL)
async def rpc_flatten(ctx: CaseContext) -> None:
    result = await answer(ctx, "collective_rpc", [["a"], ["b"], ["c"]], [0.4, 0.2, 0.0])
    ctx.require(result == ["a", "b", "c"], expected="['a', 'b', 'c']", observed=result)


# ---------------------------------------------------------------- folds at every count

async def _fold(ctx: CaseContext, method: str, args: list[Any], value: Any, expected: Any,
                n: int) -> None:
    """`method` over n engines that all answer `value` gives `expected` (type included)."""
    await ctx.start(utility_engines(method, *[UtilityReply(value)] * n))
    await prepare(ctx, method)
    result = await ctx.driver.call_utility(method, args)
    ctx.require(result == expected and type(result) is type(expected),
                expected=f"{method} over {n} engine(s) answering {value!r}: "
                         f"{expected!r}", observed=repr(result))


@case("utility.edges.get_weight_version_agree_{n}", Level.MUST,
      "get_weight_version over {n} engine(s) that all answer 'v7' is 'v7' (a single "
      "engine is its own consensus).", grounds=CONSENSUS_FOLD, needs=CALL, params=COUNTS)
async def weight_version_agree(ctx: CaseContext, n: int) -> None:
    await _fold(ctx, "get_weight_version", [], "v7", "v7", n)


@case("utility.edges.is_scheduler_paused_agree_{n}", Level.MUST,
      "is_scheduler_paused over {n} engine(s) that all answer false is false.",
      grounds=CONSENSUS_FOLD, needs=CALL, params=COUNTS)
async def paused_agree(ctx: CaseContext, n: int) -> None:
    await _fold(ctx, "is_scheduler_paused", [], False, False, n)


@case("utility.edges.add_lora_all_true_{n}", Level.MUST,
      "add_lora over {n} engine(s) that all answer true is true (AND, or engine 0's "
      "answer: the same here).", grounds=ADD_LORA_TRUE, needs=CALL, params=COUNTS)
async def add_lora_all_true(ctx: CaseContext, n: int) -> None:
    await _fold(ctx, "add_lora", [LORA], True, True, n)


@case("utility.edges.list_loras_answer_{n}", Level.MUST,
      "list_loras over {n} engine(s) that all hold adapter 1 answers [1] (engine 0's "
      "list; the engines hold the same adapters).", grounds=LIST_LORAS, needs=CALL,
      params=COUNTS)
async def list_loras_answer(ctx: CaseContext, n: int) -> None:
    await _fold(ctx, "list_loras", [], [1], [1], n)


# ---------------------------------------------------------------- odd answers

@case("utility.edges.is_sleeping_non_bool_refused", Level.SHOULD,
      "is_sleeping answered with a non-boolean (1) by both of 2 engines is refused as a "
      "malformed answer, not passed on (Rust deserializes a bool; Python passes any value).",
      grounds=NON_BOOL, needs=CALL)
async def is_sleeping_non_bool(ctx: CaseContext) -> None:
    await ctx.start(utility_engines("is_sleeping", *[UtilityReply(1)] * 2))
    try:
        value = await ctx.driver.call_utility("is_sleeping", [])
    except FrontendError as exc:
        ctx.note(f"refused: {exc}")
        return
    ctx.fail(expected="an error: is_sleeping answered 1, not a boolean",
             observed=f"answered {value!r}")


@case("utility.edges.unlisted_method_answered", Level.SHOULD,
      "A utility method the frontend has no folding rule for (cw_custom_probe, 2 engines "
      "answering 'cw-custom') should still be answered with engine 0's answer (Python DPLB "
      "returns engine 0's, core_client.py:1814-1816), not dropped as None.",
      grounds=UNLISTED, needs=CALL)
async def unlisted_method(ctx: CaseContext) -> None:
    method = "cw_custom_probe"
    await ctx.start([EngineScript(utilities={method: UtilityReply("cw-custom")})
                     for _ in range(2)])
    value = await ctx.driver.call_utility(method, [])
    ctx.require(value == "cw-custom", expected="'cw-custom' (engine 0's answer)",
                observed=repr(value))
