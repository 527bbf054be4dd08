"""Utility call framing (protocol-python.md §5.4): the frames a frontend sends and how it
matches replies to calls."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from harness.case_context import CaseContext
from harness.casekit import hold, prompt, request_for
from harness.frontends.driver import Capability, FrontendError, UnsupportedOperation
from harness.verdicts import Level, case
from harness.vllm_dist import tiny_lora_dir
from harness.wire import messages as m
from mock_engines.group import EngineGroup
from mock_engines.script import (
    EngineScript,
    UtilityReply,
    any_request,
    by_prompt,
    default_ready,
    stream,
)

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


# ---------------------------------------------------------------- every utility method
#
# call_utility(method, wire args) drives each method through the frontend's own user
# surface; the engines' transcripts show what reached them. Fan-out: Python DPLB
# call_utility_all_async (core_client.py:1305-1312, :1814-1816), Rust call_utility
# (rust-client.md §1.7) both call every engine once.

FANOUT = "core_client.py:1305-1312,1814-1816; rust-client.md §1.7 (0.33.0)"
AGG = "core_client.py:1314-1320,1361-1415; rust-client.md §1.7 (0.33.0)"
STRAY = "core_client.py:1222-1244 (special call ids -1 / -2); rust-client.md §1.3"
IDS = "v1/engine/input_processor.py:354-371; rust-client.md §1.4 DuplicateRequestId"
PASS = "v1/request.py:118-125 (extra_args kv/ec_transfer_params); EngineCoreRequest"
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
                f"{args}.", source=FANOUT, needs=CALL)(run)


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
                f"answering from the others.", source=FANOUT, needs=CALL)(run)


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
                f"fails instead of picking a value.", source=AGG, needs=CALL)(run)


disagree_paused = _consensus_disagree("is_scheduler_paused", [False, False, True])
disagree_weight_version = _consensus_disagree("get_weight_version", ["v1", "v1", "v2"])


@case("utility.is_scheduler_paused.agree_four", Level.MUST,
      "With 4 engines that all report paused, every engine is asked and "
      "is_scheduler_paused is true.", source=AGG, needs=CALL)
async def paused_agree_four(ctx: CaseContext) -> None:
    result = await _answer(ctx, "is_scheduler_paused", [True] * 4)
    asked = len(ctx.engines.transcript.utility_calls("is_scheduler_paused"))
    ctx.require(result is True and asked == 4, expected="true, 4 engines asked",
                observed=f"{result!r}, {asked} engine(s) asked")


@case("utility.reset_prefix_cache.and_four_last_false", Level.MUST,
      "reset_prefix_cache over 4 engines is false when only the last engine fails to reset.",
      source=AGG, needs=CALL)
async def reset_and_four(ctx: CaseContext) -> None:
    result = await _answer(ctx, "reset_prefix_cache", [True, True, True, False])
    ctx.require(result is False, expected="false", observed=result)


def _and_case(method: str, reason: str) -> Callable[[CaseContext], Awaitable[None]]:
    async def run(ctx: CaseContext) -> None:
        result = await _answer(ctx, method, [True, False])
        ctx.require(result is False, expected=f"{method} false: engine 1 answered false",
                    observed=result)

    return case(f"utility.{method}.and_across_engines", Level.SHOULD,
                f"{method}'s answer is the AND over engines ([true, false] -> false). "
                f"{reason}", source=AGG, needs=CALL)(run)


and_wake_up = _and_case("wake_up", "Python all() (:1402-1403); Rust /wake_up returns no "
                                   "value.")
and_add_lora = _and_case("add_lora", "Rust ANDs; Python DPLB returns engine 0's answer.")
and_remove_lora = _and_case("remove_lora", "Rust ANDs; Python DPLB returns engine 0's "
                                           "answer.")


@case("utility.collective_rpc.flatten_engine_order", Level.SHOULD,
      "collective_rpc returns every engine's results flattened in engine order, even when "
      "the replies arrive in reverse order (Rust flattens; Python DPLB returns engine 0's "
      "list only).", source=AGG, needs=CALL)
async def rpc_flatten(ctx: CaseContext) -> None:
    result = await _answer(ctx, "collective_rpc", [["a"], ["b"], ["c"]], [0.4, 0.2, 0.0])
    ctx.require(result == ["a", "b", "c"], expected="['a', 'b', 'c']", observed=result)


@case("utility.reply.reversed_order_and", Level.MUST,
      "Replies from 3 engines arriving in reverse order ([true, true, false], engine 0 "
      "last) still aggregate to reset_prefix_cache false.", source=AGG, needs=CALL)
async def reversed_and(ctx: CaseContext) -> None:
    result = await _answer(ctx, "reset_prefix_cache", [True, True, False], [0.4, 0.2, 0.0])
    ctx.require(result is False, expected="false", observed=result)


@case("utility.reply.interleaved_consensus", Level.MUST,
      "is_scheduler_paused replies from 4 engines arriving interleaved (1, 3, 0, 2) "
      "aggregate to the common value.", source=AGG, needs=CALL)
async def interleaved_consensus(ctx: CaseContext) -> None:
    result = await _answer(ctx, "is_scheduler_paused", [True] * 4, [0.3, 0.0, 0.45, 0.15])
    ctx.require(result is True, expected="true", observed=result)


@case("utility.concurrent.different_methods", Level.MUST,
      "Concurrent calls of three different methods on 2 engines, with replies crossing, "
      "each get their own aggregated answer.", source=FANOUT, needs=CALL)
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
        sleeping = await ctx.driver.call_utility("is_sleeping", [])
        handle = await ctx.driver.generate(prompt(1), 3)
        await handle.wait(ctx.t(5.0))
    except UnsupportedOperation:
        raise
    except FrontendError as exc:
        ctx.require(False, expected=f"the client still serves after {what}",
                    observed=f"{type(exc).__name__}: {exc}")
        return
    ctx.require(sleeping is False and handle.error is None and len(handle.tokens) == 3,
                expected=f"after {what}: is_sleeping false and a 3-token stream",
                observed=f"is_sleeping {sleeping!r}, stream tokens {handle.tokens} "
                         f"error {handle.error!r}")


@case("utility.cancel.late_reply_harmless", Level.MUST,
      "A utility call the client cancels leaves nothing behind: its late reply is dropped "
      "and later calls and streams work (Rust cancelled_utility_call_unregisters_waiter).",
      source="rust-client.md §1.7; core_client.py:933-952",
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


def _stray_case(name: str, engines: int, output: m.UtilityOutput, level: Level,
                what: str) -> Callable[[CaseContext], Awaitable[None]]:
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start(engines)
        frames = group.codec.encode_outputs(m.EngineCoreOutputs(
            group.engines[0].rank, [], None, time.time(), utility_output=output))
        group.engines[0].send_garbage(list(frames))
        await ctx.quiet(0.2)
        await _still_serves(ctx, what)

    return case(f"utility.stray.{name}", level,
                f"{what.capitalize()} from an engine ({engines} engine(s)) does not break "
                f"the client: utilities and streams keep working.", source=STRAY,
                needs=CALL)(run)


# What an engine sends after an elastic-EP reconfiguration (core.py:2646-2652).
EEP = m.UtilityOutput(-1, None, m.UtilityResult(None, ["RECONFIGURE_FINISHED", 0]))
# SHOULD like dp.utility.unsolicited_reply_ignored: Python's non-DP client has no EEP
# handler and treats -1 as an unknown call id (KeyError in its output reader).
stray_eep_single = _stray_case("eep_notification_single", 1, EEP, Level.SHOULD,
                               "an EEP notification (call id -1)")
stray_eep_dp = _stray_case("eep_notification_dp", 2, EEP, Level.MUST,
                           "an EEP notification (call id -1)")
stray_ft = _stray_case("ft_status", 1, m.UtilityOutput(-2, None, m.UtilityResult(
    None, {"status": "healthy"})), Level.MUST, "an FT status report (call id -2)")


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
      "same engine-side id (Rust refuses it, Python suffixes every id).", source=IDS,
      needs=RID)
async def duplicate_no_collision(ctx: CaseContext) -> None:
    ids, _refusal = await _duplicate(ctx)
    ctx.require(len(ids) == len(set(ids)), expected="distinct engine-side ids",
                observed=ids)


@case("utility.request_id.duplicate_live_refused", Level.SHOULD,
      "A request reusing the id of a live request is refused and no second ADD is sent "
      "(Rust DuplicateRequestId; Python instead renames it with a random suffix).",
      source=IDS, needs=RID)
async def duplicate_refused(ctx: CaseContext) -> None:
    ids, refusal = await _duplicate(ctx)
    ctx.require(refusal is not None and len(ids) == 1,
                expected="the duplicate refused, one ADD", observed=f"refusal {refusal!r}, "
                f"ADD ids {ids}")


@case("utility.request_id.duplicate_live_first_unchanged", Level.MUST,
      "After a second request reusing a live request's client id is refused (Rust) or "
      "renamed (Python), the first request's stream still completes with its own tokens "
      "and finish reason, and draws no ABORT (the duplicate's clean-up must not touch it).",
      source=IDS, needs=RID)
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
      source=IDS, needs=RID)
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


def _pass_case(key: str, value: Any, read: Callable[[m.EngineCoreRequest], Any]
               ) -> Callable[[CaseContext], Awaitable[None]]:
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start(1)
        handle = await ctx.driver.generate(prompt(0), 2, params={key: value})
        await handle.wait(ctx.t(5.0))
        adds = group.transcript.adds()
        seen = read(adds[0]) if adds else "no ADD"
        ctx.require(seen == value, expected=f"{key} = {value!r} on the ADD", observed=seen)

    return case(f"utility.pass_through.{key}", Level.MUST,
                f"The client's {key} reaches the engine unchanged.", source=PASS,
                needs=[Capability.PASS_THROUGH])(run)


def _extra(key: str) -> Callable[[m.EngineCoreRequest], Any]:
    def read(req: m.EngineCoreRequest) -> Any:
        extra = req.sampling_params.extra_args if req.sampling_params else None
        return (extra or {}).get(key)

    return read


pass_kv = _pass_case("kv_transfer_params", {"do_remote_prefill": False,
                                            "remote_engine_id": "cw-e1",
                                            "remote_block_ids": [3, 5]},
                     _extra("kv_transfer_params"))
pass_ec = _pass_case("ec_transfer_params", {"producer": "cw-ec", "hashes": ["h1"]},
                     _extra("ec_transfer_params"))
pass_salt = _pass_case("cache_salt", "cw-salt-1", lambda r: r.cache_salt)
