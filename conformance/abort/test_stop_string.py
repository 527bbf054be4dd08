"""Stop strings: the frontend ends the stream and owes the engine one ABORT.

A stop string matched in the frontend ends the stream with 'stop' and aborts the engine's
request (the engine has not finished it); dropping or aborting the stream afterwards sends
nothing more. The engine's next message can already be queued when the frontend matches a
stop string in one output: more outputs, its death, its retiring the request, its final
output, each sent with no delay. The ABORT the stop string owes must still go out while the
engine runs the request, and nothing the engine sends next may change the ended stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from conformance.abort.helpers import (
    ABORT,
    ABORT_ONCE,
    AL,
    CC,
    DROP,
    ENGINE_ABORT,
    IMP,
    OP,
    check_exactly_once,
    settle_aborts,
    wait_aborted,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    Die,
    Emit,
    EngineGroup,
    EngineScript,
    Finish,
    FinishedOnly,
    FrontendError,
    Level,
    Step,
    StreamHandle,
    any_request,
    both,
    by_prompt,
    case,
    detokenize,
    messages,
    prompt,
    py,
    request_for,
    rs,
    trickle,
)

# A stop string matched in the frontend ends the stream with STOP and aborts the engine's
# request (the engine has not finished it).
STOP_STRING = both(
    py(f"{OP}:829", "finish_reason = FinishReason.STOP"),
    py(f"{OP}:878", "if req_state.streaming_input or not engine_core_output.finished:"),
    py(f"{AL}:920", "await engine_core.abort_requests_async("),
    rs("rust/src/text/src/output/decoded.rs:302",
       "AbortCause::StopStringMatched.drop_as(raw_stream);"),
    rs(f"{IMP}:398", "AbortCause::StopStringMatched => {"),
    rs("rust/src/llm/src/output.rs:529",
       "AbortCause::StopStringMatched => FinishReason::Stop(None),"),
    *ENGINE_ABORT,
)

# 200 one-token outputs with no delay, the last one completing the stop string: the engine
# runs ahead of the frontend, so what it sends next is queued before the match is read.
_STOP_TOKENS = list(range(100, 300))
STOP_AT = "t299"  # only token 299's text holds it
STOP_TEXT_SEEN = detokenize(_STOP_TOKENS[:-1]) + " "
_STOP_STEPS: list[Step] = [Emit([t]) for t in _STOP_TOKENS]
STOP_RACE_ENDS_ONCE = both(
    *STOP_STRING.cites,
    py(f"{OP}:761", "# Ignore output for already-aborted request."),
    rs(f"{IMP}:467", '"dropping output for inactive request"'),
)
STOP_RACE_DEATH = both(
    *STOP_RACE_ENDS_ONCE.cites,
    py(f"{CC}:587", "self.engine_dead = True"),
    rs(f"{IMP}:120", "if registry.is_closed() {"),
)
STOP_RACE_RETIRED = both(
    *STOP_RACE_ENDS_ONCE.cites,
    py(f"{CC}:1823", "for req_id in outputs.finished_requests:"),
    rs(f"{IMP}:486", "drop(inner.finish_requests(finished_requests));"),
)


async def _stop_string_matched(ctx: CaseContext) -> tuple[EngineGroup, StreamHandle,
                                                          dict[str, int]]:
    """One trickling stream ended by the stop string 't103': its group, its stream and
    {engine-side id: owning rank}."""
    group = await ctx.start([EngineScript(rules=[any_request(trickle(0.01))])])
    p = prompt(0)
    handle = await ctx.driver.generate(p, 1000, stop=["t103"])
    await handle.wait(ctx.t(3))
    ctx.require(handle.finish_reason == "stop", expected="finish_reason stop",
                observed=f"{handle.finish_reason} error={handle.error}")
    found = request_for(group, p)
    ctx.require(found is not None, expected="an ADD", observed=None)
    assert found is not None
    return group, handle, {found[1]: found[0]}


@case("abort.stop_string.aborts_engine", Level.MUST,
      "A stop string matched by the frontend ends the stream with 'stop' and aborts the "
      "request at its engine.", grounds=STOP_STRING,
      needs=[Capability.GENERATE, Capability.STOP_STRINGS])
async def stop_string(ctx: CaseContext) -> None:
    group, _handle, owners = await _stop_string_matched(ctx)
    await settle_aborts(ctx, group, owners)
    check_exactly_once(ctx, group, owners)


@case("abort.after_end.stop_string_{via}", Level.MUST,
      "A stream ended by a frontend stop string is aborted once at its engine; "
      "{how} it afterwards sends nothing more.",
      grounds=both(*STOP_STRING.cites, *ABORT_ONCE.cites),
      params=[{"explicit": explicit, "via": "explicit" if explicit else "drop",
               "how": "explicitly aborting" if explicit else "dropping",
               "needs": [*(ABORT if explicit else DROP), Capability.STOP_STRINGS]}
              for explicit in (False, True)])
async def after_stop_string(ctx: CaseContext, explicit: bool) -> None:
    group, handle, owners = await _stop_string_matched(ctx)
    await settle_aborts(ctx, group, owners)
    if explicit:
        await ctx.driver.abort(list(owners))
    else:
        await ctx.driver.drop([handle])
    await ctx.quiet(0.4)
    check_exactly_once(ctx, group, owners)


def _check_stopped(ctx: CaseContext, handle: StreamHandle) -> None:
    ctx.require(handle.finish_reason == "stop" and handle.text == STOP_TEXT_SEEN
                and handle.error is None,
                expected=f"the stream ends 'stop' with text {STOP_TEXT_SEEN!r}, no error",
                observed=f"{handle.finish_reason!r}, text {handle.text!r}, "
                         f"error {handle.error!r}")


async def _stopped_stream(ctx: CaseContext, steps: list[Step],
                          others: Sequence[tuple[list[int], list[Step]]] = ()
                          ) -> tuple[EngineGroup, StreamHandle, list[StreamHandle]]:
    """One stream stopped at STOP_AT by zero-delay `steps`, started after `others` (each
    streaming already); its stream and theirs."""
    p = prompt(0)
    rules = [by_prompt(p, steps), *(by_prompt(q, s) for q, s in others)]
    group = await ctx.start([EngineScript(rules=rules)])
    started = []
    for q, _steps in others:
        started.append(await ctx.driver.generate(q, 100_000))
        await asyncio.wait_for(started[-1].first_output.wait(), ctx.t(3))
    handle = await ctx.driver.generate(p, 1000, stop=[STOP_AT])
    await handle.wait(ctx.t(3))
    _check_stopped(ctx, handle)
    return group, handle, started


@case("abort.stop_string.zero_delay_outputs_still_aborted", Level.MUST,
      "A stop string matched while the engine streams on with no delay (its next outputs "
      "already queued behind the matching one) still aborts the request at its engine, "
      "exactly once; the stream ends 'stop' with the text before the stop string.",
      grounds=STOP_RACE_ENDS_ONCE, needs=[Capability.GENERATE, Capability.STOP_STRINGS])
async def stop_string_zero_delay_outputs(ctx: CaseContext) -> None:
    more: list[Step] = [Emit([300 + i % 500]) for i in range(300)]  # then open, no Finish
    group, _handle, _ = await _stopped_stream(ctx, [*_STOP_STEPS, *more])
    found = request_for(group, prompt(0))
    ctx.require(found is not None, expected="an ADD", observed=None)
    assert found is not None
    await wait_aborted(ctx, group, {found[1]})
    await ctx.quiet(0.1)
    check_exactly_once(ctx, group, {found[1]: found[0]})


@case("abort.stop_string.zero_delay_final_output_keeps_stop", Level.MUST,
      "The engine's final output ('length') arriving with no delay after the output that "
      "completed a stop string leaves the stream as the stop string ended it: 'stop', the "
      "text before the stop string, no tokens after it; at most one ABORT.",
      grounds=STOP_RACE_ENDS_ONCE, needs=[Capability.GENERATE, Capability.STOP_STRINGS])
async def stop_string_zero_delay_final(ctx: CaseContext) -> None:
    group, handle, _ = await _stopped_stream(
        ctx, [*_STOP_STEPS, Emit([300]), Finish(messages.FinishReason.LENGTH, [301])])
    ctx.require(handle.tokens == _STOP_TOKENS,
                expected="tokens 100 to 299", observed=handle.tokens[-3:])
    await ctx.quiet(0.2)
    aborted = group.transcript.aborted_ids()
    ctx.require(len(aborted) <= 1, expected="at most one ABORT", observed=aborted)


@case("abort.stop_string.zero_delay_engine_death_keeps_stop", Level.MUST,
      "ENGINE_CORE_DEAD arriving with no delay after the output that completed a stop "
      "string leaves that stream 'stop' with the text before the stop string; a request "
      "after the death fails.",
      grounds=STOP_RACE_DEATH,
      needs=[Capability.GENERATE, Capability.STOP_STRINGS, Capability.ENGINE_DEATH])
async def stop_string_zero_delay_death(ctx: CaseContext) -> None:
    await _stopped_stream(ctx, [*_STOP_STEPS, Die()])
    await ctx.quiet(0.2)
    try:
        later = await ctx.driver.generate(prompt(1), 2)
        await later.wait(ctx.t(2))
        ctx.require(later.finish_reason == "error" or later.error is not None,
                    expected="a request after the death fails",
                    observed=f"{later.finish_reason} {later.tokens}")
    except FrontendError:
        pass


@case("abort.stop_string.zero_delay_retired_keeps_stop", Level.MUST,
      "The engine retiring a request (finished_requests, no final output) with no delay "
      "after the output that completed its stop string leaves the stream 'stop' with the "
      "text before the stop string, at most one ABORT, and a neighbour stream serving on "
      "until it is dropped.",
      grounds=STOP_RACE_RETIRED, needs=[Capability.GENERATE, Capability.STOP_STRINGS,
                                        Capability.DROP])
async def stop_string_zero_delay_retired(ctx: CaseContext) -> None:
    carrier: list[Step] = [Emit([400 + i % 400]) for i in range(3000)]  # carries the ids
    group, _handle, (neighbour,) = await _stopped_stream(
        ctx, [*_STOP_STEPS, FinishedOnly()], [(prompt(1), carrier)])
    await ctx.quiet(0.2)
    found = request_for(group, prompt(0))
    ctx.require(found is not None, expected="an ADD", observed=None)
    assert found is not None
    aborted = [rid for rid in group.transcript.aborted_ids() if rid == found[1]]
    ctx.require(len(aborted) <= 1, expected="at most one ABORT for the stopped request",
                observed=aborted)
    ctx.require(not neighbour.ended and neighbour.error is None,
                expected="the neighbour stream still open",
                observed=f"{neighbour.finish_reason!r}, error {neighbour.error!r}")
    await ctx.driver.drop([neighbour])
