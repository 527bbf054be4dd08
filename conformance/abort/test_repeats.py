"""Aborting a stream more than once: the engine still gets one ABORT for it.

A client may abort a stream explicitly and then drop it (or the reverse), abort the same id
twice, or drop one stream twice before any ABORT went out. The first abort takes the request
out of the frontend's table (output_processor.py:633; the Rust registry's remove, state.rs:360
and imp.rs:335), so every later one finds nothing to send: a port that keys aborts on the
handle instead of the live request sends the engine the same ABORT again.
"""

from __future__ import annotations

from conformance.abort.helpers import (
    ABORT,
    ABORT_ONCE,
    DROP,
    check_exactly_once,
    holding,
    open_streams,
    settle_aborts,
    wait_aborted,
)
from harness.cases.authoring import Capability, CaseContext, Level, case


@case("abort.explicit.then_drop_once", Level.MUST,
      "A stream aborted explicitly and then dropped is aborted exactly once.",
      grounds=ABORT_ONCE,
      needs=[*ABORT, Capability.DROP])
async def abort_then_drop(ctx: CaseContext) -> None:
    group = await ctx.start(holding())
    handles, owners = await open_streams(ctx, group, 2)
    await ctx.driver.abort(list(owners))
    await ctx.driver.drop(handles)
    await wait_aborted(ctx, group, set(owners))
    await ctx.quiet(0.3)
    check_exactly_once(ctx, group, owners)


@case("abort.explicit.twice", Level.MUST,
      "Explicitly aborting the same live id twice sends one ABORT.", grounds=ABORT_ONCE,
      needs=ABORT)
async def explicit_twice(ctx: CaseContext) -> None:
    group = await ctx.start(holding())
    _handles, owners = await open_streams(ctx, group, 2)
    await ctx.driver.abort(list(owners))
    await settle_aborts(ctx, group, owners)
    await ctx.driver.abort(list(owners))
    await ctx.quiet(0.4)
    check_exactly_once(ctx, group, owners)


@case("abort.drop.then_explicit_once", Level.MUST,
      "A stream dropped and then explicitly aborted is aborted exactly once.",
      grounds=ABORT_ONCE,
      needs=[*ABORT, Capability.DROP])
async def drop_then_explicit(ctx: CaseContext) -> None:
    group = await ctx.start(holding())
    handles, owners = await open_streams(ctx, group, 3)
    await ctx.driver.drop(handles)
    await settle_aborts(ctx, group, owners)
    await ctx.driver.abort(list(owners))
    await ctx.quiet(0.4)
    check_exactly_once(ctx, group, owners)


@case("abort.drop.same_stream_twice_zero_delay_{engines}_engines", Level.MUST,
      "With {engines} engine(s), live streams dropped twice with no pause in between "
      "(each listed twice in one drop call, or dropped by two back-to-back calls, both "
      "before any ABORT could go out) are each aborted exactly once, at their engine.",
      grounds=ABORT_ONCE, needs=DROP, params=[{"engines": n} for n in (1, 2)])
async def drop_same_stream_twice(ctx: CaseContext, engines: int) -> None:
    group = await ctx.start(holding(engines))
    handles, owners = await open_streams(ctx, group, 4 * engines)
    listed_twice, called_twice = handles[:2 * engines], handles[2 * engines:]
    await ctx.driver.drop([h for h in listed_twice for _ in range(2)])
    await ctx.driver.drop(called_twice)
    await ctx.driver.drop(called_twice)
    await settle_aborts(ctx, group, owners)
    check_exactly_once(ctx, group, owners)
