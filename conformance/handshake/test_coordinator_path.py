"""Misuse of the coordinator path: a miswired engine sends request outputs or a utility
reply where the frontend's own DP coordinator expects only control messages.

A frontend that owns the DP coordinator (named in every INIT) reads its engines' control
outputs there; anything else on that path means an engine is wired wrong. Python's
coordinator asserts on it (`coordinator.py:362-363`, its own process dies, the client
serves on); Rust's in-process coordinator fails and closes the client's registries
(`inproc.rs:134-137`, `:199`). corewire asks for the closed failure: a client that serves on
past a miswired engine hides it.
"""

from __future__ import annotations

import asyncio

from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineScript,
    FrontendError,
    Level,
    any_request,
    case,
    differ,
    hold,
    messages,
    prompt,
    py,
    rs,
)

COORD = differ(
    py("vllm/v1/engine/coordinator.py:362", "assert not outputs.outputs"),
    py("vllm/v1/engine/coordinator.py:363", "assert outputs.utility_output is None"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:136",
       "received non-control output on coordinator path: {other:?}"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:199",
       "inner.close_registries(Arc::new(error));"),
    note="python's DP coordinator (its own process) dies on the assert while the AsyncLLM "
         "client serves on; rust's in-process coordinator fails and closes the client's "
         "registries (inproc.rs:134-137, :199), failing open streams and later calls",
)

MISUSE = {
    "request_outputs": lambda rank: messages.EngineCoreOutputs(
        rank, [messages.EngineCoreOutput("cw-misrouted", [100])]),
    "utility_reply": lambda rank: messages.EngineCoreOutputs(
        rank, utility_output=messages.UtilityOutput(4242, None, None)),
}


@case("handshake.more_edges.coordinator_path_{kind}_fails_closed", Level.SHOULD,
      "With 2 engines and the frontend's own DP coordinator, engine 1 sending {what} on the "
      "coordinator path (a miswired engine) should fail the client closed: the open stream "
      "ends with an error and a later is_sleeping fails, each within 3 s, instead of "
      "serving on.",
      grounds=COORD, needs=[Capability.GENERATE, Capability.IS_SLEEPING], timeout=30,
      params=[{"kind": kind, "what": kind.replace("_", " ")} for kind in MISUSE])
async def coordinator_path(ctx: CaseContext, kind: str) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())]) for _ in range(2)],
                            coordinated=True)
    handle = await ctx.driver.generate(prompt(930), 100)
    await handle.wait_first(ctx.t(3))
    group[1].send_coordinator(MISUSE[kind](1))
    ended = await ctx.wait_until(lambda: handle.ended, 3)
    ctx.require(ended and handle.finish_reason not in ("length", "stop", "abort"),
                expected="the open stream ends with an error within 3 s",
                observed=(f"ended {handle.finish_reason!r} ({handle.error})" if ended
                          else f"still open with {handle.tokens}"))
    try:
        value = await asyncio.wait_for(ctx.driver.is_sleeping(), ctx.t(3))
    except FrontendError:
        return
    except asyncio.TimeoutError:
        ctx.fail(expected="is_sleeping fails within 3 s", observed="still pending after 3 s")
    ctx.fail(expected="is_sleeping fails", observed=f"answered {value!r}")
