"""A utility call the client cancels leaves nothing behind (protocol-python.md §5.4).

The engine still answers a call the client gave up on; that late reply must be dropped
(Python pops the call's future only when the reply comes, Rust unregisters the waiter at
cancellation), must not be taken for another pending call of the same method, and must not
stop the client from serving later calls and streams.
"""

from __future__ import annotations

import asyncio
import contextlib

from conformance.utility.helpers import CC, CLIENT, IMP, TESTS, still_serves
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineScript,
    FrontendError,
    Level,
    UtilityReply,
    both,
    case,
    py,
    rs,
)

CANCEL = both(
    py(f"{CC}:937", "future = utility_results.pop(output.call_id)"),
    py(f"{CC}:945", "except asyncio.InvalidStateError:"),
    rs(f"{CLIENT}:733", "self.inner.unregister_utility_calls(self.call_ids.drain(..));"),
    rs(f"{IMP}:521", '"dropping output for unexpected utility call"'),
    rs(f"{TESTS}:1641", "assert_eq!(client.pending_utility_call_count(), 0);"),
    note="vLLM's Rust test cancelled_utility_call_unregisters_waiter asserts the waiter is "
         "gone at cancellation (pending count 1 -> 0, tests/client.rs:1638-1641, engine never "
         "answers); this case checks the weaker observable that a late reply is dropped and "
         "the client keeps serving, which Python holds although it keeps the cancelled future "
         "until the reply pops it (core_client.py:937, :945)",
)
CANCELLABLE = [Capability.CALL_UTILITY, Capability.CANCEL_UTILITY]


@case("utility.cancel.late_reply_harmless", Level.MUST,
      "A utility call the client cancels leaves nothing behind: its late reply is dropped "
      "and later calls and streams work (Rust cancelled_utility_call_unregisters_waiter).",
      grounds=CANCEL, needs=CANCELLABLE)
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
    await still_serves(ctx, "a cancelled call's late reply")


@case("utility.cancel.late_reply_while_same_method_pending", Level.MUST,
      "A cancelled is_scheduler_paused call's late reply (true) that arrives while a second "
      "is_scheduler_paused call is pending is not taken for the second call's answer: the "
      "second call answers its own reply (false). Replies pair with calls by call id, not "
      "by method or arrival.", grounds=CANCEL, needs=CANCELLABLE)
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
        ctx.fail(expected="the second call answers false",
                 observed=f"{type(exc).__name__}: {exc}")
    ctx.require(answer is False, expected="the second call answers its own reply, false",
                observed=f"answer {answer!r}")
