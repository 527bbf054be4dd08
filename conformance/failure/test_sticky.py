"""Sticky failure: one broken output message or ENGINE_CORE_DEAD ends the client for good.

Both 0.33.0 frontends stop serving at the first undecodable message (Rust: the dispatcher
closes its registries with the first error and `call` / `call_utility` return it from then on,
client/imp.rs:215-227, 120-131; Python: the output task dies, core_client.py:1261-1262, and
AsyncLLM is `errored`, async_llm.py:1386, and refuses new generation, :418). Python's utility
calls are not gated by `errored`, only by `engine_dead` (core_client.py:808, 1296), which a
decode failure does not set: a later utility call is sent, but nothing reads its reply any
more, so it hangs; that is a Python defect. A port must fail every open stream AND every later
call promptly, whichever engine (of 1..4) sent the bad frame, instead of serving on with a
reader that lost sync or hanging.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec

from conformance.failure.helpers import require_pending_call_fails
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineScript,
    FrontendError,
    Level,
    MockEngine,
    StreamHandle,
    UtilityReply,
    any_request,
    both,
    case,
    defect,
    engine,
    hold,
    messages,
    prompt,
    py,
    rs,
)
from harness.protocol.wire import WireCodec

GARBAGE_STICKS = defect(
    py("vllm/v1/engine/core_client.py:1262", "outputs_queue.put_nowait(e)"),
    py("vllm/v1/engine/async_llm.py:944", "output_processor.propagate_error(e)"),
    py("vllm/v1/engine/async_llm.py:418", "if self.errored:"),
    py("vllm/v1/engine/core_client.py:808", "if self.resources.engine_dead:"),
    py("vllm/v1/engine/core_client.py:1195", "if resources.output_queue_task is not None:"),
    py("vllm/v1/engine/core_client.py:1334", "return await future"),
    rs("rust/src/engine-core-client/src/client/imp.rs:537",
       "inner.close_registries(Arc::new(error));"),
    rs("rust/src/engine-core-client/src/client/imp.rs:120", "if registry.is_closed() {"),
    rs("rust/src/engine-core-client/src/client/imp.rs:130", "return Err(self.closed_error());"),
    rs("rust/src/engine-core-client/src/tests/client.rs:1417",
       "assert!(is_decode_error(&add_error));"),
    note="python deviates: after an undecodable output message the output task ends "
         "(core_client.py:1261-1262) without setting engine_dead, so streams fail "
         "(async_llm.py:944) and generate is refused (:418), but a later utility call passes "
         "ensure_alive (core_client.py:808, 1296), is sent, and awaits a future (:1334) that "
         "nothing resolves because the reader is gone and is not restarted (:1195): the call "
         "hangs (hang); rust closes its registries on the first error (imp.rs:537) and refuses "
         "every later request and utility call (imp.rs:120-131)")
DEAD_STICKS = both(
    py("vllm/v1/engine/core_client.py:587", "self.engine_dead = True"),
    py("vllm/v1/engine/async_llm.py:944", "output_processor.propagate_error(e)"),
    py("vllm/v1/engine/async_llm.py:418", "if self.errored:"),
    py("vllm/v1/engine/core_client.py:808", "if self.resources.engine_dead:"),
    py("vllm/v1/engine/core_client.py:1296", "self.ensure_alive()"),
    rs("rust/src/engine-core-client/src/transport.rs:615",
       "let _ = tx.send(Err(Error::EngineCoreDead)).await;"),
    rs("rust/src/engine-core-client/src/client/imp.rs:120", "if registry.is_closed() {"),
    rs("rust/src/engine-core-client/src/client/imp.rs:130", "return Err(self.closed_error());"),
    rs("rust/src/engine-core-client/src/tests/client.rs:1741",
       "async fn engine_core_dead_sentinel_marks_client_unhealthy_and_sticks()"),
    engine("vllm/v1/engine/core.py:2078", "if output == EngineCoreProc.ENGINE_CORE_DEAD:"),
)
GARBAGE_PENDING = defect(
    py("vllm/v1/engine/core_client.py:1262", "outputs_queue.put_nowait(e)"),
    py("vllm/v1/engine/core_client.py:1327", "self.utility_results[call_id] = future"),
    rs("rust/src/engine-core-client/src/client/imp.rs:226",
       "let _ = sender.send(Err(Error::Shared(persistent_error.clone())));"),
    rs("rust/src/engine-core-client/src/tests/client.rs:1682",
       'let error = client.call_utility::<bool, _>("is_sleeping", ()).await.unwrap_err();'),
    note="python deviates: an undecodable output message is forwarded only to outputs_queue "
         "(core_client.py:1261-1262); the futures in utility_results (:1327) are never "
         "failed, so a utility call waiting for another engine hangs (hang); rust's "
         "dispatcher closes its registries and fails every waiting utility call "
         "(imp.rs:225-226)")
STICKY = [Capability.GENERATE, Capability.IS_SLEEPING]
FAILED = ("error",)


def _bad_aux_index(codec: WireCodec) -> list[bytes]:
    """A well-formed outputs message (in the engines' protocol profile) whose ndarray points
    at an aux frame that is missing."""
    big = messages.WireArray("<i4", (1, 128), bytes(512))
    frames = codec.encode_outputs(messages.EngineCoreOutputs(
        0, [messages.EngineCoreOutput("ghost", [100], routed_experts=big)], None, time.monotonic()))
    return frames[:1]


GARBAGE: dict[str, tuple[str, Callable[[WireCodec], list[bytes]]]] = {
    "not_msgpack": ("a frame that is not msgpack", lambda _codec: [b"\xc1garbage"]),
    "wrong_shape": ("valid msgpack of the wrong shape (a map, not EngineCoreOutputs)",
                    lambda _codec: [msgspec.msgpack.encode({"outputs": "nope"})]),
    "missing_aux_frame": ("an outputs message referencing an aux frame it lacks",
                          _bad_aux_index),
    "two_frame_garbage": ("a two-frame message of garbage",
                          lambda _codec: [b"\xc1garbage", b"\x00\x01more"]),
}


# (kind, engines): every kind with 2 engines, the plainest one with 1 to 4.
GARBAGE_CASES = [*(("not_msgpack", n) for n in (1, 2, 3, 4)),
                 *((kind, 2) for kind in ("wrong_shape", "missing_aux_frame",
                                          "two_frame_garbage"))]


def _errored(h: StreamHandle) -> bool:
    return h.ended and (h.finish_reason in FAILED or (
        h.error is not None and h.finish_reason not in ("length", "stop", "abort")))


async def _open_holding(ctx: CaseContext, engines: int) -> tuple[list[MockEngine],
                                                                 list[StreamHandle]]:
    group = await ctx.start([EngineScript(rules=[any_request(hold())])
                             for _ in range(engines)])
    handles = [await ctx.driver.generate(prompt(i), 100) for i in range(engines + 1)]
    await asyncio.gather(*(h.wait_first(ctx.t(3)) for h in handles))
    return list(group.engines), handles


async def _require_streams_failed(ctx: CaseContext, handles: list[StreamHandle]) -> None:
    await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    bad = [(h.finish_reason, h.error, h.ended) for h in handles if not _errored(h)]
    ctx.require(not bad, expected=f"all {len(handles)} open streams end with an error "
                                  "within 3 s",
                observed=f"{len(bad)} did not (finish, error, ended): {bad[:3]}")


async def _require_later_calls_fail(ctx: CaseContext) -> None:
    """A new request and a utility call both fail, each within 2 s."""
    began = time.monotonic()
    try:
        later = await asyncio.wait_for(ctx.driver.generate(prompt(90), 2), ctx.t(2))
        ended = await ctx.wait_until(lambda: later.ended, 2)
        ctx.require(ended and _errored(later), expected="a new request fails within 2 s",
                    observed=(f"{later.finish_reason} tokens={later.tokens}" if ended
                              else "the new request is still open after 2 s"))
    except FrontendError:
        pass
    except asyncio.TimeoutError:
        ctx.fail(expected="a new request fails within 2 s",
                 observed="generate() still pending after 2 s")
    try:
        value = await asyncio.wait_for(ctx.driver.is_sleeping(), ctx.t(2))
        ctx.fail(expected="is_sleeping fails after the failure",
                 observed=f"it answered {value!r}")
    except FrontendError:
        pass
    except asyncio.TimeoutError:
        ctx.fail(expected="is_sleeping fails within 2 s",
                 observed="still pending after 2 s")
    ctx.note(f"later calls failed after {time.monotonic() - began:.2f}s")


@case("failure.sticky.{kind}_{engines}_engines", Level.MUST,
      "With {engines} engine(s), {text} from the last engine ends every open stream "
      "(on every engine) with an error, and every later call (generate, is_sleeping) "
      "fails within 2 s instead of being served or hanging.",
      grounds=GARBAGE_STICKS, needs=STICKY,
      params=[{"kind": kind, "text": GARBAGE[kind][0], "engines": n}
              for kind, n in GARBAGE_CASES])
async def sticky_garbage(ctx: CaseContext, kind: str, engines: int) -> None:
    engs, handles = await _open_holding(ctx, engines)
    engs[-1].send_garbage(GARBAGE[kind][1](ctx.engines.codec))
    await _require_streams_failed(ctx, handles)
    await _require_later_calls_fail(ctx)


@case("failure.sticky.engine_dead_{engines}_engines", Level.MUST,
      "With {engines} engine(s), ENGINE_CORE_DEAD from the last engine ends every open "
      "stream with an error and every later call fails within 2 s.",
      grounds=DEAD_STICKS,
      needs=[*STICKY, Capability.ENGINE_DEATH], params=[{"engines": n} for n in (1, 2, 3, 4)])
async def sticky_dead(ctx: CaseContext, engines: int) -> None:
    engs, handles = await _open_holding(ctx, engines)
    engs[-1].send_dead()
    await _require_streams_failed(ctx, handles)
    await _require_later_calls_fail(ctx)


@case("failure.sticky.engine_dead_from_every_engine_2_engines", Level.MUST,
      "With 2 engines both sending ENGINE_CORE_DEAD (a DP deployment going down sends one "
      "per engine), every open stream ends once with an error, the second sentinel is no "
      "new failure for the client, and every later call fails within 2 s.",
      grounds=DEAD_STICKS, needs=[*STICKY, Capability.ENGINE_DEATH])
async def sticky_dead_from_every_engine(ctx: CaseContext) -> None:
    engs, handles = await _open_holding(ctx, 2)
    for mock in engs:
        mock.send_dead()
    await _require_streams_failed(ctx, handles)
    await ctx.quiet(0.1)  # the second sentinel, whichever came last, is read by now
    await _require_later_calls_fail(ctx)


@case("failure.sticky.garbage_fails_pending_utility", Level.MUST,
      "A utility call still waiting for an engine's reply fails promptly (within 1 s) when "
      "another engine's output message cannot be decoded.",
      grounds=GARBAGE_PENDING, needs=[Capability.IS_SLEEPING])
async def garbage_pending_utility(ctx: CaseContext) -> None:
    never = EngineScript(utilities={"is_sleeping": UtilityReply(never=True)})
    group = await ctx.start([EngineScript(), never])
    call = asyncio.ensure_future(ctx.driver.is_sleeping())
    await ctx.quiet(0.2)
    ctx.require(not call.done(), expected="the call waits for the silent engine",
                observed=f"it returned early: {call.result() if call.done() else None}")
    group[0].send_garbage([b"\xc1garbage"])
    await require_pending_call_fails(ctx, call, "the undecodable message")
