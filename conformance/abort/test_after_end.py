"""No ABORT for a request that already ended: by the engine's finish, or by its death.

After a request ended by length, EOS, a stop token, a repetition finish, an engine-side
abort or a per-request error, the frontend forgot it: dropping its stream or aborting its id
sends nothing (a mix of finished and live streams aborts only the live ones). After
ENGINE_CORE_DEAD, nothing is aborted at the dead engine, and an explicit abort returns (or
fails) instead of hanging.
"""

from __future__ import annotations

import asyncio

from conformance.abort.helpers import (
    ABORT,
    AL,
    CC,
    CLIENT,
    DROP,
    DROP_ONCE,
    FINISHED_DROP,
    IMP,
    OP,
    STATE,
    STREAM,
    check_exactly_once,
    holding,
    open_streams,
    wait_aborted,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    Emit,
    EngineGroup,
    EngineScript,
    Finish,
    FrontendError,
    Level,
    Step,
    StreamHandle,
    any_request,
    both,
    by_prompt,
    case,
    hold,
    messages,
    prompt,
    py,
    request_for,
    rs,
    stream,
)

F = messages.FinishReason

# After the engine ended a request (length, EOS, engine abort, per-request error) the frontend
# forgot it, so an explicit abort of its id sends nothing.
FINISHED_EXPLICIT = both(
    py(f"{OP}:919", "self.request_states.pop(req_id)"),
    py(f"{OP}:768", "self._finish_request(req_state)"),
    py(f"{OP}:634", "if req_state is not None:"),
    py(f"{CC}:1345", "if request_ids and not self.resources.engine_dead:"),
    rs(f"{STATE}:252", "if output.finished() {"),
    rs(f"{STATE}:229", "let Some(tracked) = self.requests.get(request_id.as_str()) else {"),
    rs(f"{CLIENT}:691", "if abortable.is_empty() {"),
)

ENDINGS: dict[str, tuple[str, list[Step]]] = {
    "length": ("LENGTH from the engine", stream([100, 101])),
    "eos": ("EOS token, STOP from the engine", stream([100, 2], reason=F.STOP)),
    "stop_token": ("a stop token id, STOP from the engine",
                   stream([100, 201], reason=F.STOP, stop_reason=201)),
    "repetition": ("REPETITION finish from the engine",
                   stream([100, 101], reason=F.REPETITION,
                          stop_reason="repetition_detected")),
    "engine_abort": ("ABORT finish from the engine",
                     [Emit([100]), Finish(F.ABORT)]),
    "error": ("per-request ERROR from the engine",
              [Emit([100]), Finish(F.ERROR,
                                   error=messages.RequestError("internal",
                                                               "scripted failure"))]),
}


@case("abort.finished.not_aborted", Level.MUST,
      "Dropping a stream that already finished sends no ABORT.", grounds=FINISHED_DROP,
      needs=DROP)
async def finished_not_aborted(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    handle = await ctx.driver.generate(prompt(0), 3)
    await handle.wait(ctx.t(3))
    await ctx.driver.drop([handle])
    await ctx.quiet(0.3)
    ids = group.transcript.aborted_ids()
    ctx.require(not ids, expected="no ABORT for a finished request", observed=ids)


@case("abort.finished_and_live.mixed_drop", Level.MUST,
      "Dropping a mix of finished and live streams aborts only the live ones.",
      grounds=both(*FINISHED_DROP.cites, *DROP_ONCE.cites), needs=DROP)
async def mixed_drop(ctx: CaseContext) -> None:
    finished_prompt = prompt(99)
    script = EngineScript(rules=[any_request(hold())])
    script.rules.insert(0, by_prompt(finished_prompt, stream([100, 101])))
    group = await ctx.start([script])
    done = await ctx.driver.generate(finished_prompt, 2)
    await done.wait(ctx.t(3))
    handles, owners = await open_streams(ctx, group, 3)
    await ctx.driver.drop([done, *handles])
    await wait_aborted(ctx, group, set(owners))
    await ctx.quiet(0.2)
    check_exactly_once(ctx, group, owners)


async def _ended(ctx: CaseContext, steps: list[Step]) -> tuple[EngineGroup, StreamHandle, str]:
    group = await ctx.start([EngineScript(rules=[any_request(steps)])])
    p = prompt(0)
    handle = await ctx.driver.generate(p, 2)
    await handle.wait(ctx.t(3))
    ctx.require(handle.ended, expected="the request ends on its own",
                observed=f"tokens {handle.tokens}, not ended")
    found = request_for(group, p)
    ctx.require(found is not None, expected="its ADD at the engine", observed=None)
    assert found is not None
    await ctx.quiet(0.1)
    return group, handle, found[1]


@case("abort.after_end.{kind}_{via}", Level.MUST,
      "After a request ended by {what}, {how} it sends no ABORT.",
      params=[{"kind": kind, "what": what, "steps": steps, "explicit": explicit,
               "via": "explicit" if explicit else "drop",
               "how": "explicitly aborting" if explicit else "dropping",
               "grounds": FINISHED_EXPLICIT if explicit else FINISHED_DROP,
               "needs": ABORT if explicit else DROP}
              for kind, (what, steps) in ENDINGS.items() for explicit in (False, True)])
async def after_end(ctx: CaseContext, what: str, steps: list[Step], explicit: bool) -> None:
    group, handle, rid = await _ended(ctx, steps)
    if explicit:
        await ctx.driver.abort([rid])
    else:
        await ctx.driver.drop([handle])
    await ctx.quiet(0.4)
    ids = group.transcript.aborted_ids()
    ctx.require(not ids, expected=f"no ABORT after {what}", observed=ids)


async def _ended_by_death(ctx: CaseContext
                          ) -> tuple[EngineGroup, list[StreamHandle], dict[str, int]]:
    """Two held streams, then ENGINE_CORE_DEAD from their engine; waits (bounded) for both
    to end: the group, the streams and {engine-side id: owning rank}."""
    group = await ctx.start(holding())
    handles, owners = await open_streams(ctx, group, 2)
    group[0].send_dead()
    await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    return group, handles, owners


@case("abort.dead_engine.no_abort", Level.MUST,
      "After ENGINE_CORE_DEAD, dropped streams are not aborted at the dead engine.",
      grounds=both(
          py(f"{AL}:814", "# Engine is dead. Do not abort since we shut down."),
          py(f"{CC}:1345", "if request_ids and not self.resources.engine_dead:"),
          py(f"{CC}:1875", "if not request_ids or self.resources.engine_dead:"),
          rs(f"{IMP}:218", "let request_senders = self.request_reg.lock().close();"),
          rs(f"{IMP}:336", "if registry.is_closed() {"),
          rs(f"{STREAM}:224", "if self.is_terminated() {"),
      ),
      needs=[*DROP, Capability.ENGINE_DEATH])
async def dead_no_abort(ctx: CaseContext) -> None:
    group, handles, _owners = await _ended_by_death(ctx)
    await ctx.driver.drop(handles)
    await ctx.quiet(0.3)
    ids = group.transcript.aborted_ids()
    ctx.require(not ids, expected="no ABORT after engine death", observed=ids)


@case("abort.dead_engine.explicit_no_abort", Level.MUST,
      "After ENGINE_CORE_DEAD ended the streams, an explicit abort of their ids sends no "
      "ABORT and returns (or fails) within 2 s instead of hanging.",
      grounds=both(
          py(f"{CC}:1875", "if not request_ids or self.resources.engine_dead:"),
          rs(f"{IMP}:218", "let request_senders = self.request_reg.lock().close();"),
          rs(f"{CLIENT}:687", "let abortable = self.inner.abortable_request_ids(ids)?;"),
      ),
      needs=[*ABORT, Capability.ENGINE_DEATH])
async def dead_explicit_no_abort(ctx: CaseContext) -> None:
    group, _handles, owners = await _ended_by_death(ctx)
    try:
        await asyncio.wait_for(ctx.driver.abort(list(owners)), ctx.t(2))
    except FrontendError as exc:
        ctx.note(f"abort after death refused: {exc}")
    except TimeoutError:
        ctx.fail(expected="the abort returns or fails within 2 s",
                 observed="still waiting after 2 s")
    await ctx.quiet(0.3)
    ids = group.transcript.aborted_ids()
    ctx.require(not ids, expected="no ABORT after engine death", observed=ids)
