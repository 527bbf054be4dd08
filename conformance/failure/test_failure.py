"""Failure semantics on the wire (seed PR #40364 outcomes, protocol-python.md §10).

A per-request ERROR (e.g. a KV-load failure under policy "fail") ends only that stream;
the "recompute" outcome reaches the user unchanged; ENGINE_CORE_DEAD fails everything
promptly and later calls fail fast; garbage or a vanished engine never hangs the client.
"""

from __future__ import annotations

import asyncio
import time

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, defect, engine, py, recommendation, rs
from harness.cases.helpers import hold, prompt, requests_for
from harness.frontends.api import Capability, FrontendError
from harness.protocol.wire import messages as m
from harness.results.records import Level
from mock_engines.script import EngineScript, Finish, any_request, by_prompt, stream

ERROR_FINISH = both(
    py("vllm/entrypoints/generate/base/serving.py:202", 'if finish_reason == "error":'),
    py("vllm/v1/request.py:409", "RequestStatus.FINISHED_ERROR: FinishReason.ERROR,"),
    rs("rust/src/llm/src/output.rs:156",
       "EngineCoreFinishReason::Error => FinishReason::Error(error),"),
    rs("rust/src/server/src/routes/openai/completions.rs:499",
       "FinishReason::Error(error) => Err(engine_error(error.as_deref())),"),
    engine("vllm/v1/core/sched/scheduler.py:2557",
           "if failed_kv_load_req_ids and not self.recompute_kv_load_failures:"),
    engine("vllm/v1/core/sched/scheduler.py:2566", "error_req_ids, RequestStatus.FINISHED_ERROR"),
)
ERROR_PAYLOAD = both(
    py("vllm/v1/engine/output_processor.py:765",
       "if error is not None and req_state.queue is not None:"),
    py("vllm/v1/engine/output_processor.py:767", "req_state.queue.put(error.to_exception())"),
    rs("rust/src/llm/src/output.rs:156",
       "EngineCoreFinishReason::Error => FinishReason::Error(error),"),
    rs("rust/src/server/src/routes/openai/chat_completions.rs:837",
       "FinishReason::Error(error) => Err(engine_error(error.as_deref())),"),
    engine("vllm/v1/engine/core.py:1805", 'code="engine_paused",'),
    engine("vllm/v1/engine/core.py:1810",
           "[request.request_id], request.client_index, FinishReason.ERROR, error"),
)
RECOMPUTE = both(
    py("vllm/v1/engine/async_llm.py:880", "outputs = await engine_core.get_output_async()"),
    py("vllm/v1/engine/output_processor.py:779",
       "new_token_ids = engine_core_output.new_token_ids"),
    rs("rust/src/engine-core-client/src/client/imp.rs:464",
       "for output in inner.send_outputs(outputs) {"),
    engine("vllm/v1/core/sched/scheduler.py:187",
           'self.recompute_kv_load_failures = kv_load_failure_policy == "recompute"'),
    engine("vllm/v1/core/sched/scheduler.py:3699", "request.num_computed_tokens = 0"),
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
      grounds=ERROR_FINISH, needs=ERR)
async def kv_fail_policy(ctx: CaseContext) -> None:
    await _run_three(ctx, Finish(F.ERROR))


@case("failure.request_error.with_payload", Level.MUST,
      "A request finished with ERROR and a RequestError payload ends only that stream.",
      grounds=ERROR_PAYLOAD, needs=ERR)
async def request_error_payload(ctx: CaseContext) -> None:
    await _run_three(ctx, Finish(F.ERROR, error=m.RequestError(
        "engine_paused", "Generation is paused. Please retry after it resumes.", True)))


@case("failure.request_error.after_tokens", Level.MUST,
      "A request that fails after streaming some tokens ends with an error, not success.",
      grounds=ERROR_FINISH, needs=ERR)
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
      "reaches the user unchanged.", grounds=RECOMPUTE, needs=[Capability.GENERATE])
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


def _make_dead_before_output(engines: int) -> None:
    @case(f"failure.engine_dead.streams_before_first_output_fail_{engines}_engines",
          Level.MUST,
          f"With {engines} engine(s), ENGINE_CORE_DEAD from one engine while every stream "
          "has its ADD at an engine but no output yet ends every stream (on every engine) "
          "with an error promptly: a stream that has received nothing is failed too.",
          grounds=DEAD_STREAMS, needs=DEAD)
    async def run(ctx: CaseContext) -> None:
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

    run.__name__ = run.__qualname__ = f"dead_before_first_output_{engines}"
    globals()[run.__name__] = run


for _engines in (1, 2):
    _make_dead_before_output(_engines)


@case("failure.engine_dead.pending_utility_fails", Level.MUST,
      "ENGINE_CORE_DEAD makes a pending utility call fail promptly (within 1 s).",
      grounds=DEAD_PENDING_UTILITY,
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
        ctx.require(False, expected="is_sleeping fails", observed="it answered")
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
