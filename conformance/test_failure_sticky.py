"""Sticky failure: one broken output message or ENGINE_CORE_DEAD ends the client for good.

Both 0.33.0 frontends stop reading outputs at the first undecodable message (Rust: the
dispatcher closes its registries with the first error and `call` / `call_utility` return it
from then on; Python: the output task dies, AsyncLLM is `errored` and refuses new work), so
a port must fail every open stream AND every later call promptly, whichever engine (of 1..4)
sent the bad frame, instead of serving on with a reader that lost sync or hanging.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec

from harness.case_context import CaseContext
from harness.casekit import hold, prompt
from harness.frontends.driver import Capability, FrontendError, StreamHandle
from harness.verdicts import Level, case
from harness.wire import WireCodec
from harness.wire import messages as m
from mock_engines.group import MockEngine
from mock_engines.script import EngineScript, UtilityReply, any_request

RUST = ("rust-client.md §1.3/§1.9 (close_registries: first error sticks); Rust tests "
        "output_loop_failure_marks_client_unhealthy_and_records_first_error, "
        "dispatcher_failure_propagates_to_streams_and_future_calls")
PY = "vllm/v1/engine/core_client.py:1214-1262, async_llm.py:856-940 and :1385 (errored)"
DEAD_RUST = "engine_core_dead_sentinel_marks_client_unhealthy_and_sticks"
STICKY = [Capability.GENERATE, Capability.IS_SLEEPING]
FAILED = ("error",)


def _bad_aux_index(codec: WireCodec) -> list[bytes]:
    """A well-formed outputs message (in the engines' protocol profile) whose ndarray points
    at an aux frame that is missing."""
    big = m.WireArray("<i4", (1, 128), bytes(512))
    frames = codec.encode_outputs(m.EngineCoreOutputs(
        0, [m.EngineCoreOutput("ghost", [100], routed_experts=big)], None, time.monotonic()))
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
        ctx.require(False, expected="a new request fails within 2 s",
                    observed="generate() still pending after 2 s")
    try:
        value = await asyncio.wait_for(ctx.driver.is_sleeping(), ctx.t(2))
        ctx.require(False, expected="is_sleeping fails after the failure",
                    observed=f"it answered {value!r}")
    except FrontendError:
        pass
    except asyncio.TimeoutError:
        ctx.require(False, expected="is_sleeping fails within 2 s",
                    observed="still pending after 2 s")
    ctx.note(f"later calls failed after {time.monotonic() - began:.2f}s")


def _make_garbage_case(kind: str, engines: int) -> None:
    text, frames = GARBAGE[kind]

    @case(f"failure.sticky.{kind}_{engines}_engines", Level.MUST,
          f"With {engines} engine(s), {text} from the last engine ends every open stream "
          "(on every engine) with an error, and every later call (generate, is_sleeping) "
          "fails within 2 s instead of being served or hanging.",
          source=f"{RUST}; {PY}", needs=STICKY)
    async def run(ctx: CaseContext) -> None:
        engs, handles = await _open_holding(ctx, engines)
        engs[-1].send_garbage(frames(ctx.engines.codec))
        await _require_streams_failed(ctx, handles)
        await _require_later_calls_fail(ctx)

    run.__name__ = run.__qualname__ = f"sticky_{kind}_{engines}"
    globals()[run.__name__] = run


for _n in (1, 2, 3, 4):
    _make_garbage_case("not_msgpack", _n)
for _kind in ("wrong_shape", "missing_aux_frame", "two_frame_garbage"):
    _make_garbage_case(_kind, 2)


def _make_dead_case(engines: int) -> None:
    @case(f"failure.sticky.engine_dead_{engines}_engines", Level.MUST,
          f"With {engines} engine(s), ENGINE_CORE_DEAD from the last engine ends every open "
          "stream with an error and every later call fails within 2 s.",
          source=f"rust-client.md §1.9, {DEAD_RUST}; protocol-python.md §10.1",
          needs=[*STICKY, Capability.ENGINE_DEATH])
    async def run(ctx: CaseContext) -> None:
        engs, handles = await _open_holding(ctx, engines)
        engs[-1].send_dead()
        await _require_streams_failed(ctx, handles)
        await _require_later_calls_fail(ctx)

    run.__name__ = run.__qualname__ = f"sticky_dead_{engines}"
    globals()[run.__name__] = run


for _n in (1, 2, 3, 4):
    _make_dead_case(_n)


@case("failure.sticky.garbage_fails_pending_utility", Level.MUST,
      "A utility call still waiting for an engine's reply fails promptly (within 1 s) when "
      "another engine's output message cannot be decoded.",
      source=("rust-client.md §1.9; Rust test dispatcher_failure_propagates_to_waiting_"
              "utility_calls"), needs=[Capability.IS_SLEEPING])
async def garbage_pending_utility(ctx: CaseContext) -> None:
    never = EngineScript(utilities={"is_sleeping": UtilityReply(never=True)})
    group = await ctx.start([EngineScript(), never])
    call = asyncio.ensure_future(ctx.driver.is_sleeping())
    await ctx.quiet(0.2)
    ctx.require(not call.done(), expected="the call waits for the silent engine",
                observed=f"it returned early: {call.result() if call.done() else None}")
    group[0].send_garbage([b"\xc1garbage"])
    began = time.monotonic()
    try:
        value = await asyncio.wait_for(call, ctx.t(3))
    except asyncio.TimeoutError:
        ctx.require(False, expected="the pending call fails within 1 s",
                    observed="still pending 3 s after the undecodable message")
        return
    except FrontendError as exc:
        elapsed = time.monotonic() - began
        ctx.require(elapsed <= ctx.t(1.0), expected="the pending call fails within 1 s",
                    observed=f"failed after {elapsed:.2f}s: {exc}")
        return
    ctx.require(False, expected="the pending call fails", observed=f"returned {value!r}")
