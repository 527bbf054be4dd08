"""Failure semantics on the wire (seed PR #40364 outcomes, protocol-python.md §10).

A per-request ERROR (e.g. a KV-load failure under policy "fail") ends only that stream;
the "recompute" outcome reaches the user unchanged; ENGINE_CORE_DEAD fails everything
promptly and later calls fail fast; garbage or a vanished engine never hangs the client.
"""

from __future__ import annotations

import asyncio
import time

from harness.case_context import CaseContext
from harness.casekit import hold, prompt
from harness.frontends.driver import Capability, FrontendError
from harness.verdicts import Level, case
from harness.wire import messages as m
from mock_engines.script import EngineScript, Finish, any_request, by_prompt, stream

PR = "PR #40364"
DEATH = "protocol-python.md §10.1 (EngineDeadError)"
ERR = [Capability.GENERATE, Capability.REQUEST_ERRORS]
DEAD = [Capability.GENERATE, Capability.ENGINE_DEATH]
F = m.FinishReason


async def _run_three(ctx: CaseContext, failing: Finish) -> None:
    """Three requests; the middle one ends with `failing`; neighbours and a later one work."""
    p_fail = prompt(1)
    script = EngineScript(rules=[by_prompt(p_fail, [failing])])
    await ctx.start([script])
    handles = [await ctx.driver.generate(p, 4) for p in (prompt(0), p_fail, prompt(2))]
    for h in handles:
        await h.wait(ctx.t(3))
    bad = handles[1]
    ctx.require(bad.finish_reason == "error" or bad.error is not None,
                expected="the failed request ends with an error",
                observed=f"finish={bad.finish_reason} error={bad.error} tokens={bad.tokens}")
    for h in (handles[0], handles[2]):
        ctx.require(h.finish_reason == "length" and len(h.tokens) == 4,
                    expected="neighbours complete with 4 tokens",
                    observed=f"finish={h.finish_reason} tokens={h.tokens} error={h.error}")
    later = await ctx.driver.generate(prompt(3), 2)
    await later.wait(ctx.t(3))
    ctx.require(later.finish_reason == "length", expected="a later request still works",
                observed=f"finish={later.finish_reason} error={later.error}")


@case("failure.kv_load.fail_policy", Level.MUST,
      "A request finished with ERROR and no tokens (KV-load failure, policy 'fail') ends "
      "that stream with an error; its neighbours and later requests are unaffected.",
      source=PR, needs=ERR)
async def kv_fail_policy(ctx: CaseContext) -> None:
    await _run_three(ctx, Finish(F.ERROR))


@case("failure.request_error.with_payload", Level.MUST,
      "A request finished with ERROR and a RequestError payload ends only that stream.",
      source="protocol-python.md §6.2 (error field)", needs=ERR)
async def request_error_payload(ctx: CaseContext) -> None:
    await _run_three(ctx, Finish(F.ERROR, error=m.RequestError(
        "engine_paused", "Generation is paused. Please retry after it resumes.", True)))


@case("failure.request_error.after_tokens", Level.MUST,
      "A request that fails after streaming some tokens ends with an error, not success.",
      source=PR, needs=ERR)
async def error_after_tokens(ctx: CaseContext) -> None:
    p = prompt(0)
    await ctx.start([EngineScript(rules=[by_prompt(p, [*stream([100, 101])[:1],
                                                      Finish(F.ERROR, delay=0.05)])])])
    handle = await ctx.driver.generate(p, 10)
    await handle.wait(ctx.t(3))
    ctx.require(handle.finish_reason == "error" or handle.error is not None,
                expected="an error ending", observed=f"{handle.finish_reason} {handle.tokens}")


@case("failure.kv_load.recompute_policy", Level.MUST,
      "A request delayed by recompute (no output for a while, then complete output) "
      "reaches the user unchanged.", source=PR, needs=[Capability.GENERATE])
async def recompute(ctx: CaseContext) -> None:
    p = prompt(0)
    late = [*stream([300, 301, 302])]
    late[0] = type(late[0])(late[0].tokens, 0.8)  # type: ignore[call-arg]
    await ctx.start([EngineScript(rules=[by_prompt(p, late)])])
    handle = await ctx.driver.generate(p, 3)
    other = await ctx.driver.generate(prompt(1), 3)
    await other.wait(ctx.t(3))
    await handle.wait(ctx.t(5))
    ctx.require(handle.tokens == [300, 301, 302] and handle.finish_reason == "length",
                expected="tokens [300, 301, 302], finish length",
                observed=f"{handle.tokens} {handle.finish_reason} error={handle.error}")


@case("failure.engine_dead.streams_fail", Level.MUST,
      "ENGINE_CORE_DEAD makes every open stream end with an error promptly.", source=DEATH,
      needs=DEAD)
async def dead_streams(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())])])
    handles = [await ctx.driver.generate(prompt(i), 100) for i in range(3)]
    for h in handles:
        await h.wait_first(ctx.t(3))
    group[0].send_dead()
    await asyncio.gather(*(h.wait(ctx.t(3)) for h in handles))
    bad = [(h.finish_reason, h.error) for h in handles
           if not (h.finish_reason == "error" or h.error is not None)]
    ctx.require(not bad, expected="every open stream ends with an error", observed=bad)


@case("failure.engine_dead.pending_utility_fails", Level.MUST,
      "ENGINE_CORE_DEAD makes a pending utility call fail promptly (within 1 s).",
      source=DEATH,
      needs=[Capability.IS_SLEEPING, Capability.ENGINE_DEATH])
async def dead_pending_utility(ctx: CaseContext) -> None:
    from mock_engines.script import UtilityReply

    group = await ctx.start([EngineScript(utilities={"is_sleeping": UtilityReply(never=True)})])
    call = asyncio.ensure_future(ctx.driver.is_sleeping())
    await ctx.quiet(0.2)
    group[0].send_dead()
    began = time.monotonic()
    try:
        result = await asyncio.wait_for(call, ctx.t(3))
    except asyncio.TimeoutError:
        ctx.require(False, expected="the pending call fails within 1 s",
                    observed="still pending 3 s after ENGINE_CORE_DEAD")
        return
    except FrontendError as exc:
        elapsed = time.monotonic() - began
        ctx.require(elapsed <= ctx.t(1.0), expected="the pending call fails within 1 s",
                    observed=f"failed after {elapsed:.2f}s: {exc}")
        return
    ctx.require(False, expected="the pending call fails", observed=f"returned {result}")


@case("failure.engine_dead.later_calls_fail_fast", Level.MUST,
      "After ENGINE_CORE_DEAD, new requests and utility calls fail fast.", source=DEATH,
      needs=[*DEAD, Capability.IS_SLEEPING])
async def dead_later_calls(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    group[0].send_dead()
    await ctx.quiet(0.3)
    began = time.monotonic()
    try:
        handle = await ctx.driver.generate(prompt(0), 2)
        await handle.wait(ctx.t(2))
        ctx.require(handle.finish_reason == "error" or handle.error is not None,
                    expected="the new request fails",
                    observed=f"{handle.finish_reason} {handle.tokens}")
    except FrontendError:
        pass
    try:
        await asyncio.wait_for(ctx.driver.is_sleeping(), ctx.t(2))
        ctx.require(False, expected="is_sleeping fails", observed="it answered")
    except FrontendError:
        pass
    elapsed = time.monotonic() - began
    ctx.require(elapsed < ctx.t(2.5), expected="both fail within 2.5 s",
                observed=f"{elapsed:.2f}s")


@case("failure.garbage_output.bounded", Level.MUST,
      "A garbage frame on the output socket leads to a defined outcome within a bound: "
      "open streams end (with an error) or complete; nothing hangs.",
      source="rust-client.md §1.3; protocol-python.md §6.5", needs=[Capability.GENERATE])
async def garbage_output(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())])])
    handle = await ctx.driver.generate(prompt(0), 100)
    await handle.wait_first(ctx.t(3))
    group[0].send_garbage([b"\xc1garbage"])
    ended = await ctx.wait_until(lambda: handle.ended, 3)
    ctx.require(ended, expected="the open stream ends within 3 s",
                observed=f"still open with {handle.tokens}")
    ctx.note(f"stream ended: finish={handle.finish_reason} error={handle.error}")


@case("failure.socket_closed.bounded", Level.SHOULD,
      "If an engine's sockets close, open streams should end with an error within a "
      "bound instead of hanging.", source="protocol-python.md §10.1", needs=DEAD)
async def socket_closed(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())])])
    handle = await ctx.driver.generate(prompt(0), 100)
    await handle.wait_first(ctx.t(3))
    group[0].close_sockets()
    ended = await ctx.wait_until(lambda: handle.ended, 3)
    ctx.require(ended, expected="the open stream ends within 3 s",
                observed="still open: the frontend cannot tell the engine went away")
