"""Utility call framing (protocol-python.md §5.4): the frames a frontend sends and how it
matches replies to calls."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from harness.artefacts.vllm_dist import tiny_lora_dir
from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import Basis, Grounds, both, differ, engine, py, recommendation, rs
from harness.cases.helpers import hold, prompt, request_for
from harness.frontends.api import Capability, FrontendError, UnsupportedOperation
from harness.protocol.wire import messages as m
from harness.results.records import Level
from mock_engines.group import EngineGroup
from mock_engines.script import (
    EngineScript,
    UtilityReply,
    any_request,
    by_prompt,
    default_ready,
    stream,
)

_CC = "vllm/v1/engine/core_client.py"
_CORE = "vllm/v1/engine/core.py"
_ECC = "rust/src/engine-core-client/src"
_CLIENT = f"{_ECC}/client.rs"
_IMP = f"{_ECC}/client/imp.rs"
_STATE = f"{_ECC}/client/state.rs"
_UTIL = f"{_ECC}/protocol/utility.rs"
_TESTS = f"{_ECC}/tests/client.rs"
_ROUTES = "rust/src/server/src/routes"

# The UTILITY frame: type byte 0x03, then [client_index, call_id, method, args].
WIRE_SHAPE = both(
    py("vllm/v1/engine/__init__.py:308", r'UTILITY = b"\x03"'),
    py(f"{_CC}:1325", "call_id = uuid.uuid1().int >> 64"),
    py(f"{_CC}:1330", "*self.encoder.encode((self.client_index, call_id, method, args)),"),
    rs(f"{_ECC}/protocol/request.rs:55", r'Self::Utility => b"\x03",'),
    rs(f"{_UTIL}:159", "pub client_index: u32,"),
    rs(f"{_UTIL}:185", "Value::Nil => Value::Array(Vec::new()),"),
    rs(f"{_TESTS}:1448", "assert_eq!(array[3], Value::Array(Vec::new()));"),
    engine(f"{_CORE}:1765", "client_idx, call_id, method_name, args = request"),
)
# reset_prefix_cache() with its defaults: both send the two flags, false.
RESET_DEFAULTS = both(
    py(f"{_CC}:1385", "self, reset_running_requests: bool = False, reset_connector: bool = False"),
    py(f"{_CC}:1389", '"reset_prefix_cache", reset_running_requests, reset_connector'),
    rs(f"{_ROUTES}/cache.rs:36",
       ".reset_prefix_cache(params.reset_running_requests, params.reset_external)"),
    rs(f"{_CLIENT}:928", "(reset_running_requests, reset_connector),"),
    engine(f"{_CORE}:884",
           "self, reset_running_requests: bool = False, reset_connector: bool = False"),
    note="SHOULD, not MUST: the engine's reset_prefix_cache defaults both flags to False "
         "(core.py:884), so args [] act the same; no engine relies on the explicit falses",
)
# A reply is matched to its call by call id, however late and in whatever order.
MATCH = both(
    py(f"{_CC}:1327", "self.utility_results[call_id] = future"),
    py(f"{_CC}:937", "future = utility_results.pop(output.call_id)"),
    rs(f"{_STATE}:459", "self.utility_calls.insert(call_id, tx);"),
    rs(f"{_IMP}:254", "match self.utility_reg.lock().resolve(&call_id) {"),
    engine(f"{_CORE}:1768", "output = UtilityOutput(call_id)"),
)


@case("utility.is_sleeping.wire_shape", Level.MUST,
      "is_sleeping is sent as UTILITY [client_index:int, call_id:uint64, 'is_sleeping', []].",
      grounds=WIRE_SHAPE, needs=[Capability.IS_SLEEPING])
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


@case("utility.reset_prefix_cache.wire_args", Level.SHOULD,
      "reset_prefix_cache() should be sent with args [false, false] "
      "(reset_running_requests, reset_connector).", grounds=RESET_DEFAULTS,
      needs=[Capability.RESET_PREFIX_CACHE])
async def reset_args(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    await ctx.driver.reset_prefix_cache()
    calls = group.transcript.utility_calls("reset_prefix_cache")
    ctx.require([c.message.args for c in calls] == [[False, False]],
                expected="one call with args [false, false]",
                observed=[c.message.args for c in calls])


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


# ---------------------------------------------------------------- every utility method
#
# call_utility(method, wire args) drives each method through the frontend's own user
# surface; the engines' transcripts show what reached them. Fan-out: Python DPLB
# call_utility_all_async (core_client.py:1305-1312, :1814-1816), Rust call_utility
# (rust-client.md §1.7) both call every engine once.

# Every utility call reaches every engine once (Python DPLB fans out and keeps engine 0's
# answer; Rust call_utility sends one call per engine).
FANOUT = both(
    py(f"{_CC}:1816", "return (await self.call_utility_all_async(method, *args))[0]"),
    py(f"{_CC}:1309", "self._call_utility_async(method, *args, engine=engine)"),
    py(f"{_CC}:1310", "for engine in self.core_engines"),
    rs(f"{_CLIENT}:743", "for engine in &self.engines {"),
    rs(f"{_CLIENT}:744", "let (call_id, rx) = self.inner.allocate_and_register_utility_call()?;"),
    rs(f"{_TESTS}:2166",
       "async fn multi_engine_abort_is_grouped_and_utility_fans_out_to_all_engines()"),
)
# One engine's failure reply fails the whole call.
ONE_FAILS = both(
    py(f"{_CC}:941", "future.set_exception(Exception(failure_message))"),
    py(f"{_CC}:1307", "return await asyncio.gather("),
    rs(f"{_UTIL}:245", "return Err(Error::UtilityCallFailed {"),
    rs(f"{_CLIENT}:765", "outcomes.into_iter().collect()"),
    rs(f"{_TESTS}:1490", "async fn call_utility_waits_for_all_engines_before_returning_error()"),
    engine(f"{_CORE}:1850", 'output.failure_message = f"Call to {name} method failed: {str(e)}"'),
)
# is_sleeping / is_scheduler_paused / get_weight_version: every engine asked, all must agree.
CONSENSUS = both(
    py(f"{_CC}:1315", "results = await self.call_utility_all_async(method, *args)"),
    py(f"{_CC}:1316", "if any(result != results[0] for result in results):"),
    py(f"{_CC}:1362", 'return await self.call_utility_consensus_async("is_scheduler_paused")'),
    py(f"{_CC}:1415", 'return await self.call_utility_consensus_async("get_weight_version")'),
    rs(f"{_CLIENT}:775", "let results: Vec<T> = self.call_utility(method, args).await?;"),
    rs(f"{_CLIENT}:777", "if results.iter().all_equal() {"),
    rs(f"{_CLIENT}:990", 'self.call_utility_consensus("is_scheduler_paused", ()).await'),
    rs(f"{_CLIENT}:896", 'self.call_utility_consensus("get_weight_version", ()).await'),
    rs(f"{_TESTS}:2570", "async fn is_sleeping_returns_error_when_engines_disagree()"),
)
# reset_prefix_cache is the AND over engines.
RESET_AND = both(
    py(f"{_CC}:1389", '"reset_prefix_cache", reset_running_requests, reset_connector'),
    py(f"{_CC}:1388", "await self.call_utility_all_async("),
    rs(f"{_CLIENT}:932", ".all(|reset| reset))"),
    rs(f"{_TESTS}:2706", "async fn reset_prefix_cache_returns_false_when_any_engine_fails()"),
)
# The answers are gathered in engine order, whatever order the replies arrive in.
_IN_ENGINE_ORDER = (
    py(f"{_CC}:1307", "return await asyncio.gather("),
    rs(f"{_CLIENT}:751", "let outcomes = join_all(prepared_calls.into_iter().map("),
)
# wake_up is the AND over engines ("fully awake" only when every engine is).
WAKE_AND = both(
    py(f"{_CC}:1403", 'return all(await self.call_utility_all_async("wake_up", tags))'),
    rs(f"{_CLIENT}:972", ".all(|fully_awake| fully_awake))"),
    rs(f"{_ROUTES}/sleep.rs:119", 'status: if fully_awake { "awake" } else { "sleeping" },'),
    rs(f"{_TESTS}:2335", "async fn wake_up_requires_every_engine_to_be_fully_awake()"),
    engine(f"{_CORE}:1031", "def wake_up(self, tags: list[str] | None = None) -> bool:"),
    note="both AND; vllm-rs reports it as POST /wake_up's status ('sleeping' when not every "
         "engine is fully awake, sleep.rs:119)",
)
LORA_AND = differ(
    py(f"{_CC}:1418", 'return await self.call_utility_async("add_lora", lora_request)'),
    py(f"{_CC}:1421", 'return await self.call_utility_async("remove_lora", lora_id)'),
    py(f"{_CC}:1816", "return (await self.call_utility_all_async(method, *args))[0]"),
    rs(f"{_CLIENT}:941", ".all(|loaded| loaded))"),
    rs(f"{_CLIENT}:950", ".all(|removed| removed))"),
    note="rust ANDs add_lora / remove_lora over engines (client.rs:941, :950); python's DPLB "
         "client fans out but returns engine 0's answer (core_client.py:1816)",
)
RPC_FLATTEN = differ(
    py(f"{_CC}:1442", '"collective_rpc", method, timeout, args, kwargs'),
    py(f"{_CC}:1816", "return (await self.call_utility_all_async(method, *args))[0]"),
    rs(f"{_CLIENT}:810", "rmpv::Value::Array(results) => results,"),
    rs(f"{_TESTS}:2418", "async fn collective_rpc_flattens_results_from_all_engines()"),
    note="rust flattens every engine's worker list in engine order (client.rs:810); python's "
         "DPLB client returns engine 0's list only (core_client.py:1816)",
)
CANCEL = both(
    py(f"{_CC}:937", "future = utility_results.pop(output.call_id)"),
    py(f"{_CC}:945", "except asyncio.InvalidStateError:"),
    rs(f"{_CLIENT}:733", "self.inner.unregister_utility_calls(self.call_ids.drain(..));"),
    rs(f"{_IMP}:521", '"dropping output for unexpected utility call"'),
    rs(f"{_TESTS}:1641", "assert_eq!(client.pending_utility_call_count(), 0);"),
    note="vLLM's Rust test cancelled_utility_call_unregisters_waiter asserts the waiter is "
         "gone at cancellation (pending count 1 -> 0, tests/client.rs:1638-1641, engine never "
         "answers); this case checks the weaker observable that a late reply is dropped and "
         "the client keeps serving, which Python holds although it keeps the cancelled future "
         "until the reply pops it (core_client.py:937, :945)",
)
# Special call ids: -1 (elastic-EP notification), -2 (fault-tolerance status).
_RS_NEGATIVE_ID_DROPPED = (
    rs(f"{_IMP}:249", "let Some(call_id) = output.call_id.as_u64() else {"),
    rs(f"{_IMP}:521", '"dropping output for unexpected utility call"'),
)
EEP_DP = both(
    py(f"{_CC}:1222", "outputs.utility_output.call_id == EEP_NOTIFICATION_CALL_ID"),
    py(f"{_CC}:1223", "and notification_callback_handler is not None"),
    *_RS_NEGATIVE_ID_DROPPED,
    engine(f"{_CORE}:2650", "call_id=EEP_NOTIFICATION_CALL_ID,"),
)
EEP_SINGLE = differ(
    py(f"{_CC}:1212", 'getattr(self.__class__, "eep_process_engine_core_notification", None)'),
    py(f"{_CC}:937", "future = utility_results.pop(output.call_id)"),
    *_RS_NEGATIVE_ID_DROPPED,
    engine(f"{_CORE}:2650", "call_id=EEP_NOTIFICATION_CALL_ID,"),
    note="python: only the DP clients define eep_process_engine_core_notification "
         "(core_client.py:1212), so the single-engine client hands call id -1 to "
         "utility_results.pop (core_client.py:937): KeyError, the output handler dies; rust "
         "drops any call id that is not a u64 (imp.rs:249). An engine sends -1 only after an "
         "elastic-EP reconfiguration (core.py:2650), which needs data parallelism",
)
FT_STATUS = both(
    py(f"{_CC}:1237", "elif outputs.utility_output.call_id == FT_STATUS_CALL_ID:"),
    *_RS_NEGATIVE_ID_DROPPED,
    engine("vllm/v1/fault_tolerance/engine_core_sentinel.py:149", "call_id=FT_STATUS_CALL_ID,"),
)
# Client request ids: both frontends append a random suffix for the engine-side id.
_SUFFIXED = (
    py("vllm/v1/engine/input_processor.py:371",
       'request.request_id = f"{request.external_req_id}-{random_uuid():.8}"'),
    rs("rust/src/llm/src/request.rs:100",
       'format!("{external_request_id}-{}", &random_suffix[..8])'),
)
_RS_DUPLICATE = rs(f"{_STATE}:170", "return Err(Error::DuplicateRequestId { request_id });")
IDS_DISTINCT = both(
    *_SUFFIXED, _RS_DUPLICATE,
    rs(f"{_TESTS}:1082",
       "async fn duplicate_request_ids_are_rejected_without_sending_a_second_add()"),
)
IDS_REFUSED = recommendation(
    *_SUFFIXED, _RS_DUPLICATE,
    py("vllm/v1/engine/output_processor.py:692",
       "self.external_req_ids[req_state.external_req_id].append(request_id)"),
    note="neither 0.33.0 frontend refuses at its surface: both suffix every client id "
         "(input_processor.py:371, llm/src/request.rs:100), so the Rust engine-core client's "
         "DuplicateRequestId (state.rs:170) is not reached through vllm-rs. corewire advises "
         "refusing: a client id then names one request, and an abort by client id (Python "
         "maps it to every engine-side id, output_processor.py:692) cannot hit the other one",
)
IDS_REUSE = both(
    *_SUFFIXED,
    rs(f"{_STATE}:252", "if output.finished() {"),
    rs(f"{_STATE}:253", "match self.remove(output.request_id.as_str()) {"),
)
# Pass-through fields: the OpenAI surfaces put kv/ec_transfer_params into extra_args.
PASS_KV = both(
    py("vllm/entrypoints/openai/completion/protocol.py:403",
       'extra_args["kv_transfer_params"] = self.kv_transfer_params'),
    rs("rust/src/server/src/utils.rs:70", '"kv_transfer_params".to_string(),'),
    engine("vllm/v1/request.py:120", "self.kv_transfer_params = sampling_params.extra_args.get("),
)
PASS_EC = both(
    py("vllm/entrypoints/openai/completion/protocol.py:406",
       'extra_args["ec_transfer_params"] = self.ec_transfer_params'),
    rs("rust/src/server/src/utils.rs:88", '"ec_transfer_params".to_string(),'),
    engine("vllm/v1/request.py:123", "self.ec_transfer_params = sampling_params.extra_args.get("),
)
PASS_SALT = both(
    py("vllm/v1/engine/input_processor.py:548", 'cache_salt=decoder_input.get("cache_salt"),'),
    rs(f"{_ROUTES}/openai/completions/convert.rs:166", "cache_salt: request.cache_salt,"),
    engine("vllm/v1/request.py:260", "cache_salt=request.cache_salt,"),
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


def _scripts(method: str, *replies: UtilityReply) -> list[EngineScript]:
    """One engine per reply; for a LoRA method the engines report LoRA support (a frontend
    may refuse LoRA calls otherwise, vllm-rs does) and accept the preparatory add_lora."""
    if method not in LORA_METHODS:
        return [EngineScript(utilities={method: r}) for r in replies]
    return [EngineScript(ready=default_ready(rank, len(replies), supports_lora=True,
                                             max_loras=4),
                         utilities={"add_lora": UtilityReply(True), method: r})
            for rank, r in enumerate(replies)]


async def _prepare(ctx: CaseContext, method: str) -> None:
    """Load the adapter a LOADED_FIRST method acts on."""
    if method in LOADED_FIRST:
        await ctx.driver.call_utility("add_lora", [LORA])


async def _refused(ctx: CaseContext, call: Awaitable[Any], expected: str) -> str:
    """The FrontendError the call must raise (UnsupportedOperation passes through)."""
    try:
        value = await call
    except UnsupportedOperation:
        raise
    except FrontendError as exc:
        return str(exc)
    ctx.require(False, expected=expected, observed=f"answered {value!r}")
    return ""


def _same_args(method: str, seen: list[Any], expected: list[Any]) -> bool:
    """Wire args equal; a LoRARequest may carry its trailing default fields (vLLM's does)."""
    if method == "add_lora" and len(seen) == 1 and isinstance(seen[0], list):
        head, tail = seen[0][:3], seen[0][3:]
        return head == expected[0] and all(v in (None, False, "") for v in tail)
    return seen == expected


def _calls_since(group: EngineGroup, method: str, before: dict[int, int]
                 ) -> dict[int, list[Any]]:
    """Per engine, the args of the `method` calls after the `before` counts (startup's
    own calls, e.g. AsyncLLM's reset_mm_cache, are not the client's)."""
    return {e.rank: [c.message.args for c in
                     group.transcript.utility_calls(method, rank=e.rank)[before[e.rank]:]]
            for e in group.engines}


def _counts(group: EngineGroup, method: str) -> dict[int, int]:
    return {e.rank: len(group.transcript.utility_calls(method, rank=e.rank))
            for e in group.engines}


def _fan_out_case(method: str) -> Callable[[CaseContext], Awaitable[None]]:
    args, value = METHODS[method]

    async def run(ctx: CaseContext) -> None:
        group = await ctx.start(_scripts(method, *[UtilityReply(value)] * 3))
        await _prepare(ctx, method)
        before = _counts(group, method)
        await ctx.driver.call_utility(method, args)
        per_engine = _calls_since(group, method, before)
        ctx.require(all(len(calls) == 1 and _same_args(method, calls[0], args)
                        for calls in per_engine.values()),
                    expected=f"each of 3 engines: one {method} call with args {args}",
                    observed=per_engine)

    return case(f"utility.{method}.fan_out_once", Level.MUST,
                f"A {method} call reaches every engine (3) exactly once, with the wire args "
                f"{args}.", grounds=FANOUT, needs=CALL)(run)


def _failure_case(method: str) -> Callable[[CaseContext], Awaitable[None]]:
    args, value = METHODS[method]

    async def run(ctx: CaseContext) -> None:
        group = await ctx.start(_scripts(method, *[UtilityReply(value)] * 3))
        await _prepare(ctx, method)
        # Failing only from now on: a frontend may call the method while starting up.
        group.engines[2].script.utilities[method] = UtilityReply(
            failure=f"{method} failed on engine 2")
        await _refused(ctx, ctx.driver.call_utility(method, args),
                       f"an error: engine 2 of 3 failed {method}")

    return case(f"utility.{method}.one_engine_fails", Level.MUST,
                f"When one engine of 3 (the last) fails {method}, the call fails instead of "
                f"answering from the others.", grounds=ONE_FAILS, needs=CALL)(run)


for _method in METHODS:
    globals()[f"fan_out_{_method}"] = _fan_out_case(_method)
    globals()[f"fails_{_method}"] = _failure_case(_method)


async def _answer(ctx: CaseContext, method: str, values: Sequence[Any],
                  delays: Sequence[float] | None = None) -> Any:
    delays = delays or [0.0] * len(values)
    await ctx.start(_scripts(method, *[UtilityReply(v, delay=d)
                                       for v, d in zip(values, delays, strict=True)]))
    await _prepare(ctx, method)
    return await ctx.driver.call_utility(method, METHODS[method][0])


def _consensus_disagree(method: str, values: list[Any]
                        ) -> Callable[[CaseContext], Awaitable[None]]:
    async def run(ctx: CaseContext) -> None:
        await ctx.start(_scripts(method, *[UtilityReply(v) for v in values]))
        await _refused(ctx, ctx.driver.call_utility(method, []),
                       f"an error: engines disagree {values}")

    return case(f"utility.{method}.disagree", Level.MUST,
                f"When engines disagree on {method} ({values}, the odd one last) the call "
                f"fails instead of picking a value.", grounds=CONSENSUS, needs=CALL)(run)


disagree_paused = _consensus_disagree("is_scheduler_paused", [False, False, True])
disagree_weight_version = _consensus_disagree("get_weight_version", ["v1", "v1", "v2"])


@case("utility.is_scheduler_paused.agree_four", Level.MUST,
      "With 4 engines that all report paused, every engine is asked and "
      "is_scheduler_paused is true.", grounds=CONSENSUS, needs=CALL)
async def paused_agree_four(ctx: CaseContext) -> None:
    result = await _answer(ctx, "is_scheduler_paused", [True] * 4)
    asked = len(ctx.engines.transcript.utility_calls("is_scheduler_paused"))
    ctx.require(result is True and asked == 4, expected="true, 4 engines asked",
                observed=f"{result!r}, {asked} engine(s) asked")


@case("utility.reset_prefix_cache.and_four_last_false", Level.MUST,
      "reset_prefix_cache over 4 engines is false when only the last engine fails to reset.",
      grounds=RESET_AND, needs=CALL)
async def reset_and_four(ctx: CaseContext) -> None:
    result = await _answer(ctx, "reset_prefix_cache", [True, True, True, False])
    ctx.require(result is False, expected="false", observed=result)


def _and_case(method: str, reason: str, grounds: Grounds
              ) -> Callable[[CaseContext], Awaitable[None]]:
    async def run(ctx: CaseContext) -> None:
        result = await _answer(ctx, method, [True, False])
        ctx.require(result is False, expected=f"{method} false: engine 1 answered false",
                    observed=result)

    both_hold = grounds.basis is Basis.BOTH  # a MUST by the level rule; else SHOULD
    return case(f"utility.{method}.and_across_engines", Level.MUST if both_hold else Level.SHOULD,
                f"{method}'s answer {'is' if both_hold else 'should be'} the AND over engines "
                f"([true, false] -> false). {reason}", grounds=grounds, needs=CALL)(run)


and_wake_up = _and_case("wake_up", "Python all() (core_client.py:1403); the Rust client ANDs "
                                   "too and /wake_up reports it as status 'sleeping'.",
                        WAKE_AND)
and_add_lora = _and_case("add_lora", "Rust ANDs; Python DPLB returns engine 0's answer.",
                         LORA_AND)
and_remove_lora = _and_case("remove_lora", "Rust ANDs; Python DPLB returns engine 0's "
                                           "answer.", LORA_AND)


@case("utility.collective_rpc.flatten_engine_order", Level.SHOULD,
      "collective_rpc returns every engine's results flattened in engine order, even when "
      "the replies arrive in reverse order (Rust flattens; Python DPLB returns engine 0's "
      "list only).", grounds=RPC_FLATTEN, needs=CALL)
async def rpc_flatten(ctx: CaseContext) -> None:
    result = await _answer(ctx, "collective_rpc", [["a"], ["b"], ["c"]], [0.4, 0.2, 0.0])
    ctx.require(result == ["a", "b", "c"], expected="['a', 'b', 'c']", observed=result)


@case("utility.reply.reversed_order_and", Level.MUST,
      "Replies from 3 engines arriving in reverse order ([true, true, false], engine 0 "
      "last) still aggregate to reset_prefix_cache false.",
      grounds=both(*_IN_ENGINE_ORDER, *RESET_AND.cites), needs=CALL)
async def reversed_and(ctx: CaseContext) -> None:
    result = await _answer(ctx, "reset_prefix_cache", [True, True, False], [0.4, 0.2, 0.0])
    ctx.require(result is False, expected="false", observed=result)


@case("utility.reply.interleaved_consensus", Level.MUST,
      "is_scheduler_paused replies from 4 engines arriving interleaved (1, 3, 0, 2) "
      "aggregate to the common value.", grounds=both(*_IN_ENGINE_ORDER, *CONSENSUS.cites),
      needs=CALL)
async def interleaved_consensus(ctx: CaseContext) -> None:
    result = await _answer(ctx, "is_scheduler_paused", [True] * 4, [0.3, 0.0, 0.45, 0.15])
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


async def _still_serves(ctx: CaseContext, what: str) -> None:
    """After a disturbance the client still answers a utility call and runs a stream."""
    try:
        sleeping = await asyncio.wait_for(ctx.driver.call_utility("is_sleeping", []),
                                          ctx.t(3.0))
        handle = await ctx.driver.generate(prompt(1), 3)
        await handle.wait(ctx.t(5.0))
    except UnsupportedOperation:
        raise
    except FrontendError as exc:
        ctx.require(False, expected=f"the client still serves after {what}",
                    observed=f"{type(exc).__name__}: {exc}")
        return
    except asyncio.TimeoutError:  # a hang is this rule's failure, graded by its level
        ctx.require(False, expected=f"the client still serves after {what}",
                    observed="is_sleeping still pending after 3 s")
        return
    ctx.require(sleeping is False and handle.error is None and len(handle.tokens) == 3,
                expected=f"after {what}: is_sleeping false and a 3-token stream",
                observed=f"is_sleeping {sleeping!r}, stream tokens {handle.tokens} "
                         f"error {handle.error!r}")


@case("utility.cancel.late_reply_harmless", Level.MUST,
      "A utility call the client cancels leaves nothing behind: its late reply is dropped "
      "and later calls and streams work (Rust cancelled_utility_call_unregisters_waiter).",
      grounds=CANCEL,
      needs=[Capability.CALL_UTILITY, Capability.CANCEL_UTILITY])
async def cancelled_call(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(utilities={
        "is_scheduler_paused": UtilityReply(True, delay=0.6)})])
    task = asyncio.ensure_future(ctx.driver.call_utility("is_scheduler_paused", []))
    seen = await ctx.wait_until(lambda: bool(group.transcript.utility_calls(
        "is_scheduler_paused")), 3.0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, FrontendError):
        await task
    ctx.require(seen, expected="the call reached the engine before it was cancelled",
                observed="no is_scheduler_paused frame")
    await ctx.quiet(0.9)  # the late reply lands
    await _still_serves(ctx, "a cancelled call's late reply")


@case("utility.cancel.late_reply_while_same_method_pending", Level.MUST,
      "A cancelled is_scheduler_paused call's late reply (true) that arrives while a second "
      "is_scheduler_paused call is pending is not taken for the second call's answer: the "
      "second call answers its own reply (false). Replies pair with calls by call id, not "
      "by method or arrival.", grounds=CANCEL,
      needs=[Capability.CALL_UTILITY, Capability.CANCEL_UTILITY])
async def late_reply_same_method(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(utilities={
        "is_scheduler_paused": UtilityReply(True, delay=0.4)})])
    first = asyncio.ensure_future(ctx.driver.call_utility("is_scheduler_paused", []))
    seen = await ctx.wait_until(lambda: bool(group.transcript.utility_calls(
        "is_scheduler_paused")), 3.0)
    ctx.require(seen, expected="the first call at the engine", observed="no frame")
    # The second call's reply comes after the first call's late one.
    group.engines[0].script.utilities["is_scheduler_paused"] = UtilityReply(False, delay=0.8)
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError, FrontendError):
        await first
    try:
        answer = await asyncio.wait_for(
            ctx.driver.call_utility("is_scheduler_paused", []), ctx.t(3.0))
    except FrontendError as exc:
        ctx.require(False, expected="the second call answers false",
                    observed=f"{type(exc).__name__}: {exc}")
        return
    ctx.require(answer is False, expected="the second call answers its own reply, false",
                observed=f"answer {answer!r}")


def _stray_case(name: str, engines: int, output: m.UtilityOutput, level: Level,
                what: str, grounds: Grounds) -> Callable[[CaseContext], Awaitable[None]]:
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start(engines)
        frames = group.codec.encode_outputs(m.EngineCoreOutputs(
            group.engines[0].rank, [], None, time.time(), utility_output=output))
        group.engines[0].send_garbage(list(frames))
        await ctx.quiet(0.2)
        await _still_serves(ctx, what)

    return case(f"utility.stray.{name}", level,
                f"{what.capitalize()} from an engine ({engines} engine(s)) does not break "
                f"the client: utilities and streams keep working.", grounds=grounds,
                needs=CALL)(run)


# What an engine sends after an elastic-EP reconfiguration (core.py:2646-2652).
EEP = m.UtilityOutput(-1, None, m.UtilityResult(None, ["RECONFIGURE_FINISHED", 0]))
# SHOULD like dp.utility.unsolicited_reply_ignored: Python's non-DP client has no EEP
# handler and treats -1 as an unknown call id (KeyError in its output reader).
stray_eep_single = _stray_case("eep_notification_single", 1, EEP, Level.SHOULD,
                               "an EEP notification (call id -1)", EEP_SINGLE)
stray_eep_dp = _stray_case("eep_notification_dp", 2, EEP, Level.MUST,
                           "an EEP notification (call id -1)", EEP_DP)
stray_ft = _stray_case("ft_status", 1, m.UtilityOutput(-2, None, m.UtilityResult(
    None, {"status": "healthy"})), Level.MUST, "an FT status report (call id -2)", FT_STATUS)


# ---------------------------------------------------------------- client request ids

RID = [Capability.CLIENT_REQUEST_ID]


async def _duplicate(ctx: CaseContext) -> tuple[list[str], str | None]:
    """Two generates with one client id while the first is live: (ADD ids, refusal)."""
    group = await ctx.start([EngineScript(rules=[any_request(hold())])])
    first = await ctx.driver.generate(prompt(0), 50, request_id="cw-dup-1")
    await first.wait_first(ctx.t(5.0))
    refusal: str | None = None
    try:
        second = await ctx.driver.generate(prompt(1), 50, request_id="cw-dup-1")
        await ctx.wait_until(lambda: second.ended or len(group.transcript.adds()) > 1, 1.0)
        refusal = second.error if second.ended and second.finish_reason == "error" else None
    except UnsupportedOperation:
        raise
    except FrontendError as exc:
        refusal = str(exc)
    await ctx.quiet(0.2)
    return [r.request_id for r in group.transcript.adds()], refusal


@case("utility.request_id.duplicate_live_no_collision", Level.MUST,
      "A second request with the client id of a live one never reaches an engine under the "
      "same engine-side id (both suffix every id; Rust's client also refuses it).",
      grounds=IDS_DISTINCT,
      needs=RID)
async def duplicate_no_collision(ctx: CaseContext) -> None:
    ids, _refusal = await _duplicate(ctx)
    ctx.require(len(ids) == len(set(ids)), expected="distinct engine-side ids",
                observed=ids)


@case("utility.request_id.duplicate_live_refused", Level.SHOULD,
      "A request reusing the id of a live request is refused and no second ADD is sent "
      "(Rust's engine-core client has DuplicateRequestId, but both frontends rename every "
      "id with a random suffix).", grounds=IDS_REFUSED, needs=RID)
async def duplicate_refused(ctx: CaseContext) -> None:
    ids, refusal = await _duplicate(ctx)
    ctx.require(refusal is not None and len(ids) == 1,
                expected="the duplicate refused, one ADD", observed=f"refusal {refusal!r}, "
                f"ADD ids {ids}")


@case("utility.request_id.duplicate_live_first_unchanged", Level.MUST,
      "After a second request reusing a live request's client id is refused (Rust) or "
      "renamed (Python), the first request's stream still completes with its own tokens "
      "and finish reason, and draws no ABORT (the duplicate's clean-up must not touch it).",
      grounds=IDS_DISTINCT, needs=RID)
async def duplicate_first_unchanged(ctx: CaseContext) -> None:
    first_prompt, second_prompt = prompt(0), prompt(1)
    group = await ctx.start([EngineScript(rules=[
        by_prompt(first_prompt, hold()),  # token 100, then held until the case finishes it
        by_prompt(second_prompt, stream([300, 301], 0.02))])])
    first = await ctx.driver.generate(first_prompt, 3, request_id="cw-dup-2")
    await first.wait_first(ctx.t(5.0))
    owner = request_for(group, first_prompt)
    ctx.require(owner is not None, expected="the first request's ADD", observed="none")
    assert owner is not None
    second_note = "refused"
    try:
        second = await ctx.driver.generate(second_prompt, 2, request_id="cw-dup-2")
        await second.wait(ctx.t(5.0))
        second_note = (f"ended {second.finish_reason!r} with {second.tokens}"
                       + (f", error {second.error!r}" if second.error else ""))
    except UnsupportedOperation:
        raise
    except FrontendError as exc:
        second_note = f"refused: {exc}"
    ctx.note(f"the duplicate: {second_note}")
    await ctx.quiet(0.2)  # whatever the duplicate's clean-up does to the first, it did
    rank, rid = owner
    engine = next(e for e in group.engines if e.rank == rank)
    for tokens, reason in (([101], None), ([102], m.FinishReason.LENGTH)):
        engine.send_outputs(m.EngineCoreOutputs(rank, [m.EngineCoreOutput(
            rid, tokens, finish_reason=reason)], None, time.monotonic()))
        await ctx.quiet(0.2)  # an ABORT the clean-up queued goes out with an output
    await first.wait(ctx.t(5.0))
    aborted = group.transcript.aborted_ids()
    ctx.require(first.ended and first.error is None and first.tokens == [100, 101, 102]
                and first.finish_reason == "length",
                expected="the first stream: [100, 101, 102], finish 'length', no error",
                observed=f"ended {first.ended}, finish {first.finish_reason!r}, tokens "
                         f"{first.tokens}, error {first.error!r}")
    ctx.require(rid not in aborted, expected=f"no ABORT for the first request {rid}",
                observed=f"ABORTed ids {aborted}")


@case("utility.request_id.reuse_after_finish", Level.MUST,
      "Once a request finished, its client id can be used again and the new request runs.",
      grounds=IDS_REUSE, needs=RID)
async def reuse_after_finish(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    first = await (await ctx.driver.generate(prompt(0), 2, request_id="cw-again")
                   ).wait(ctx.t(5.0))
    await ctx.quiet(0.1)
    try:
        second = await (await ctx.driver.generate(prompt(1), 3, request_id="cw-again")
                        ).wait(ctx.t(5.0))
    except UnsupportedOperation:
        raise
    except FrontendError as exc:
        ctx.require(False, expected="the reused id accepted", observed=str(exc))
        return
    ctx.require(first.error is None and second.error is None and len(second.tokens) == 3
                and len(group.transcript.adds()) == 2,
                expected="both requests complete (2 ADDs, 3 tokens for the second)",
                observed=f"errors {first.error!r}/{second.error!r}, second tokens "
                         f"{second.tokens}, {len(group.transcript.adds())} ADDs")


# ---------------------------------------------------------------- pass-through fields


def _pass_case(key: str, value: Any, read: Callable[[m.EngineCoreRequest], Any],
               grounds: Grounds) -> Callable[[CaseContext], Awaitable[None]]:
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start(1)
        handle = await ctx.driver.generate(prompt(0), 2, params={key: value})
        await handle.wait(ctx.t(5.0))
        adds = group.transcript.adds()
        seen = read(adds[0]) if adds else "no ADD"
        ctx.require(seen == value, expected=f"{key} = {value!r} on the ADD", observed=seen)

    return case(f"utility.pass_through.{key}", Level.MUST,
                f"The client's {key} reaches the engine unchanged.", grounds=grounds,
                needs=[Capability.PASS_THROUGH])(run)


def _extra(key: str) -> Callable[[m.EngineCoreRequest], Any]:
    def read(req: m.EngineCoreRequest) -> Any:
        extra = req.sampling_params.extra_args if req.sampling_params else None
        return (extra or {}).get(key)

    return read


pass_kv = _pass_case("kv_transfer_params", {"do_remote_prefill": False,
                                            "remote_engine_id": "cw-e1",
                                            "remote_block_ids": [3, 5]},
                     _extra("kv_transfer_params"), PASS_KV)
pass_ec = _pass_case("ec_transfer_params", {"producer": "cw-ec", "hashes": ["h1"]},
                     _extra("ec_transfer_params"), PASS_EC)
pass_salt = _pass_case("cache_salt", "cw-salt-1", lambda r: r.cache_salt, PASS_SALT)
