"""An engine that dies, sends garbage or goes away never hangs the client (seed PR #40364
outcomes, protocol-python.md §10).

ENGINE_CORE_DEAD fails every open stream promptly (also those with no output yet, on every
engine) and every pending utility call, and later calls fail fast; a garbage frame on the
output socket, or an engine whose sockets close, leads to a defined outcome within a bound
instead of a hang.
"""

from __future__ import annotations

import asyncio
import time

from conformance.failure.helpers import require_pending_call_fails
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineScript,
    FrontendError,
    Level,
    UtilityReply,
    any_request,
    both,
    case,
    defect,
    engine,
    hold,
    prompt,
    py,
    recommendation,
    requests_for,
    rs,
)

DEAD_STREAMS = both(
    py("vllm/v1/engine/core_client.py:586",
       "if len(frames) == 1 and (frames[0].buffer == EngineCoreProc.ENGINE_CORE_DEAD):"),
    py("vllm/v1/engine/core_client.py:1262", "outputs_queue.put_nowait(e)"),
    py("vllm/v1/engine/async_llm.py:944", "output_processor.propagate_error(e)"),
    rs("rust/src/engine-core-client/src/transport.rs:615",
       "let _ = tx.send(Err(Error::EngineCoreDead)).await;"),
    rs("rust/src/engine-core-client/src/client/imp.rs:223",
       "sender.send_error(Error::Shared(persistent_error.clone()));"),
    engine("vllm/v1/engine/core.py:2078", "if output == EngineCoreProc.ENGINE_CORE_DEAD:"),
)
DEAD_PENDING_UTILITY = defect(
    py("vllm/v1/engine/core_client.py:1262", "outputs_queue.put_nowait(e)"),
    py("vllm/v1/engine/core_client.py:1327", "self.utility_results[call_id] = future"),
    py("vllm/v1/engine/core_client.py:1334", "return await future"),
    rs("rust/src/engine-core-client/src/transport.rs:615",
       "let _ = tx.send(Err(Error::EngineCoreDead)).await;"),
    rs("rust/src/engine-core-client/src/client/imp.rs:226",
       "let _ = sender.send(Err(Error::Shared(persistent_error.clone())));"),
    engine("vllm/v1/engine/core.py:2078", "if output == EngineCoreProc.ENGINE_CORE_DEAD:"),
    note="python deviates: on ENGINE_CORE_DEAD the output task forwards EngineDeadError only "
         "to outputs_queue (core_client.py:1261-1262) and never fails the futures in "
         "utility_results (:1327), so a caller awaiting a utility reply (:1334) hangs (hang); "
         "rust closes its registries and fails every waiting utility call (imp.rs:225-226)")
LATER_CALLS = both(
    py("vllm/v1/engine/core_client.py:587", "self.engine_dead = True"),
    py("vllm/v1/engine/async_llm.py:418", "if self.errored:"),
    py("vllm/v1/engine/core_client.py:808", "if self.resources.engine_dead:"),
    py("vllm/v1/engine/core_client.py:1296", "self.ensure_alive()"),
    rs("rust/src/engine-core-client/src/client/imp.rs:120", "if registry.is_closed() {"),
    rs("rust/src/engine-core-client/src/client/imp.rs:130", "return Err(self.closed_error());"),
    rs("rust/src/engine-core-client/src/tests/client.rs:1784",
       'let error = client.call_utility::<bool, _>("is_sleeping", ()).await.unwrap_err();'),
)
GARBAGE = both(
    py("vllm/v1/engine/core_client.py:1219",
       "outputs: EngineCoreOutputs = decoder.decode(frames)"),
    py("vllm/v1/engine/core_client.py:1262", "outputs_queue.put_nowait(e)"),
    py("vllm/v1/engine/async_llm.py:944", "output_processor.propagate_error(e)"),
    rs("rust/src/engine-core-client/src/transport.rs:623", "Err(error) => {"),
    rs("rust/src/engine-core-client/src/client/imp.rs:537",
       "inner.close_registries(Arc::new(error));"),
    rs("rust/src/engine-core-client/src/tests/client.rs:1359",
       "async fn dispatcher_failure_propagates_to_streams_and_future_calls()"),
)
SOCKET_CLOSED = recommendation(
    py("vllm/v1/engine/core_client.py:1217",
       "frames = await output_socket.recv_multipart(copy=False)"),
    py("vllm/v1/engine/core_client.py:834", "engine_manager.monitor_engine_liveness()"),
    rs("rust/src/engine-core-client/src/transport.rs:596",
       "let message = match output_socket.recv().await {"),
    rs("rust/src/engine-core-client/src/transport.rs:603",
       "let _ = tx.send(Err(Error::Transport(error))).await;"),
    note="corewire's advice, held by neither for engines the frontend did not start: python "
         "notices only the death of engine processes it launched (core_client.py:824-838) "
         "and otherwise waits on recv_multipart (:1217); rust ends its output loop only on a "
         "receive error (transport.rs:596-604), which a ZMQ PULL does not raise when a peer "
         "goes away. Without a liveness check open streams wait forever")
DEAD = [Capability.GENERATE, Capability.ENGINE_DEATH]


@case("failure.engine_dead.streams_fail", Level.MUST,
      "ENGINE_CORE_DEAD makes every open stream end with an error promptly.",
      grounds=DEAD_STREAMS,
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


@case("failure.engine_dead.streams_before_first_output_fail_{engines}_engines",
      Level.MUST,
      "With {engines} engine(s), ENGINE_CORE_DEAD from one engine while every stream "
      "has its ADD at an engine but no output yet ends every stream (on every engine) "
      "with an error promptly: a stream that has received nothing is failed too.",
      grounds=DEAD_STREAMS, needs=DEAD, params=[{"engines": n} for n in (1, 2)])
async def dead_before_first_output(ctx: CaseContext, engines: int) -> None:
    group = await ctx.start([EngineScript(rules=[any_request([])])
                             for _ in range(engines)])
    prompts = [prompt(i) for i in range(2 * engines)]
    handles = [await ctx.driver.generate(p, 100) for p in prompts]
    reached = await ctx.wait_until(lambda: requests_for(group, prompts) is not None, 3)
    ctx.require(reached, expected=f"{len(prompts)} ADDs at the engines",
                observed=len(group.transcript.adds()))
    group[engines - 1].send_dead()
    await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    bad = [(h.finish_reason, h.error, h.tokens) for h in handles
           if not (h.ended and (h.finish_reason == "error" or h.error is not None))]
    ctx.require(not bad, expected="every stream, none with output yet, ends with an error",
                observed=f"{len(bad)} of {len(handles)} did not: {bad[:3]}")


@case("failure.engine_dead.pending_utility_fails", Level.MUST,
      "ENGINE_CORE_DEAD makes a pending utility call fail promptly (within 1 s).",
      grounds=DEAD_PENDING_UTILITY,
      needs=[Capability.IS_SLEEPING, Capability.ENGINE_DEATH])
async def dead_pending_utility(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(utilities={"is_sleeping": UtilityReply(never=True)})])
    call = asyncio.ensure_future(ctx.driver.is_sleeping())
    await ctx.quiet(0.2)
    group[0].send_dead()
    await require_pending_call_fails(ctx, call, "ENGINE_CORE_DEAD", show=str)


@case("failure.engine_dead.later_calls_fail_fast", Level.MUST,
      "After ENGINE_CORE_DEAD, new requests and utility calls fail fast.",
      grounds=LATER_CALLS,
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
        ctx.fail(expected="is_sleeping fails", observed="it answered")
    except FrontendError:
        pass
    elapsed = time.monotonic() - began
    ctx.require(elapsed < ctx.t(2.5), expected="both fail within 2.5 s",
                observed=f"{elapsed:.2f}s")


@case("failure.garbage_output.bounded", Level.MUST,
      "A garbage frame on the output socket leads to a defined outcome within a bound: "
      "open streams end (with an error) or complete; nothing hangs.",
      grounds=GARBAGE, needs=[Capability.GENERATE])
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
      "bound instead of hanging.", grounds=SOCKET_CLOSED, needs=DEAD)
async def socket_closed(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())])])
    handle = await ctx.driver.generate(prompt(0), 100)
    await handle.wait_first(ctx.t(3))
    group[0].close_sockets()
    ended = await ctx.wait_until(lambda: handle.ended, 3)
    ctx.require(ended, expected="the open stream ends within 3 s",
                observed="still open: the frontend cannot tell the engine went away")
