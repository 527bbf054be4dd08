"""Aborts and drops at every phase of a request, and after every kind of ending.

A port author gets aborts wrong at the edges: before the ADD reached the engine, before the
first output, after the request already ended (by length, EOS, a stop string, an engine-side
abort or an error), twice, across several engines with uneven ownership, or for a request
that was routed with an explicit data_parallel_rank. The rule is the same everywhere: an
engine gets an ABORT only for a live request it received the ADD for, after that ADD, at
most once (PR #44591; the grounds cite async_llm.py, core_client.py, output_processor.py and
the Rust client's stream.rs / imp.rs / state.rs).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from conformance.test_abort import (
    _AL,
    _CC,
    _CLIENT,
    _ENGINE_ABORT,
    _IMP,
    _OP,
    _STATE,
    _STREAM,
    ABORT,
    ABORT_ONCE,
    BURST_ONCE,
    DROP,
    EXPLICIT_GROUPED,
    FINISHED_DROP,
    STOP_STRING,
    _check_exactly_once,
    _open_streams,
    _settle_aborts,
)
from harness.case_context import CaseContext
from harness.casekit import hold, prompt, request_for, requests_for, trickle
from harness.frontends.driver import Capability, StreamHandle
from harness.grounds import both, py, rs
from harness.verdicts import Level, case
from harness.wire import AbortRequests, AddRequest
from harness.wire import messages as m
from mock_engines.group import EngineGroup
from mock_engines.script import Emit, EngineScript, Finish, Step, any_request, stream

# The ADD goes out before any ABORT for the same id, on the owning engine's input: Python
# registers the request and sends its ADD inside add_request(), and generate() aborts only a
# request whose queue exists; Rust builds the stream (whose Drop aborts) and then sends the ADD
# to the engine it registered. An ABORT before its ADD is skipped by the engine
# (scheduler.py:2994) and the late ADD then runs for nobody.
ADD_BEFORE_ABORT = both(
    py(f"{_AL}:581", "self.output_processor.add_request(request, prompt, parent_req, index,"),
    py(f"{_AL}:584", "await self.engine_core.add_request_async(request)"),
    py(f"{_CC}:1615", "await self._send_input(EngineCoreRequestType.ADD, request, chosen_engine)"),
    py(f"{_AL}:809", "await self.abort(q.request_id, internal=True)"),
    rs(f"{_CLIENT}:671", "self.inner.send_request_to_engine(&engine_id, req).await?;"),
    rs(f"{_STREAM}:232", "let abort_req = AbortRequest {"),
    rs(f"{_IMP}:389", "let Some(engine_id) = inner.take_auto_abort_target(&request_id) else {"),
    *_ENGINE_ABORT,
)

# After the engine ended a request (length, EOS, engine abort, per-request error) the frontend
# forgot it, so an explicit abort of its id sends nothing.
FINISHED_EXPLICIT = both(
    py(f"{_OP}:919", "self.request_states.pop(req_id)"),
    py(f"{_OP}:768", "self._finish_request(req_state)"),
    py(f"{_OP}:634", "if req_state is not None:"),
    py(f"{_CC}:1345", "if request_ids and not self.resources.engine_dead:"),
    rs(f"{_STATE}:252", "if output.finished() {"),
    rs(f"{_STATE}:229", "let Some(tracked) = self.requests.get(request_id.as_str()) else {"),
    rs(f"{_CLIENT}:691", "if abortable.is_empty() {"),
)

# A request pinned with data_parallel_rank is recorded at that engine and aborted there.
PINNED_DROP = both(
    py(f"{_CC}:1763", "if (eng_index := request.data_parallel_rank) is None and ("),
    py(f"{_CC}:1810", "self.reqs_in_flight[request.request_id] = chosen_engine"),
    py(f"{_CC}:1884", "await self._abort_requests(request_ids, engine)"),
    rs(f"{_STATE}:202", "if let Some(rank) = data_parallel_rank {"),
    rs(f"{_STATE}:192", "engine_id: engine_id.clone(),"),
    rs(f"{_IMP}:406", "by_engine.entry(engine_id).or_default().push(request_id);"),
    rs(f"{_STATE}:1176", "fn register_with_data_parallel_rank_routes_to_specified_engine()"),
    *_ENGINE_ABORT,
)


def _check_add_before_abort(ctx: CaseContext, group: EngineGroup) -> None:
    """Every ABORT id reached that engine's input after that engine got its ADD."""
    added: dict[int, set[str]] = {}
    early: list[tuple[str, int]] = []
    for record in group.transcript.select(direction="in", channel="input"):
        if isinstance(record.message, AddRequest):
            added.setdefault(record.rank, set()).add(record.message.request.request_id)
        elif isinstance(record.message, AbortRequests):
            early += [(rid, record.rank) for rid in record.message.request_ids
                      if rid not in added.get(record.rank, set())]
    ctx.require(not early, expected="every ABORT after its ADD, at the same engine",
                observed=f"(id, engine) aborted without an earlier ADD there: {early[:5]}")


# ------------------------------------------------------------------ phases


@case("abort.phase.before_add_read", Level.MUST,
      "Dropping streams whose ADDs the engines have not read yet sends, per request, the "
      "ADD then one ABORT (or neither), each to the owning engine.",
      grounds=ADD_BEFORE_ABORT, needs=DROP)
async def before_add_read(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())]) for _ in range(2)])
    for engine in group.engines:
        engine.stop_reading()
    await ctx.quiet(0.1)
    prompts = [prompt(i) for i in range(4)]
    handles = [await ctx.driver.generate(p, 100) for p in prompts]
    await ctx.quiet(0.1)
    await ctx.driver.drop(handles)
    await ctx.quiet(0.3)
    for engine in group.engines:
        engine.resume_reading()
    await ctx.wait_until(lambda: requests_for(group, prompts) is not None, 3)
    owners = {req.request_id: rank for rank in range(len(group))
              for req in group.transcript.adds(rank)}
    await ctx.wait_until(lambda: set(owners) <= set(group.transcript.aborted_ids()), 3)
    await ctx.quiet(0.2)
    _check_add_before_abort(ctx, group)
    aborted = set(group.transcript.aborted_ids())
    ctx.note(f"{len(owners)} ADDs read after the drop, {len(aborted)} ids aborted")
    _check_exactly_once(ctx, group, owners)


@case("abort.phase.before_first_output", Level.MUST,
      "Dropping streams that have no output yet aborts each one once at its engine.",
      grounds=BURST_ONCE, needs=DROP)
async def before_first_output(ctx: CaseContext) -> None:
    late = [Emit([100], 30.0)]
    group = await ctx.start([EngineScript(rules=[any_request(late)]) for _ in range(2)])
    prompts = [prompt(i) for i in range(4)]
    handles = [await ctx.driver.generate(p, 100) for p in prompts]
    ok = await ctx.wait_until(lambda: requests_for(group, prompts) is not None, 3)
    ctx.require(ok, expected="4 ADDs at the engines", observed=len(group.transcript.adds()))
    owners = requests_for(group, prompts) or {}
    await ctx.driver.drop(handles)
    await _settle_aborts(ctx, group, owners)
    _check_add_before_abort(ctx, group)
    _check_exactly_once(ctx, group, owners)


@case("abort.phase.mid_stream", Level.MUST,
      "Dropping streams while tokens are flowing aborts each one once at its engine.",
      grounds=BURST_ONCE, needs=DROP)
async def mid_stream(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(trickle(0.01))])
                             for _ in range(2)])
    handles, owners = await _open_streams(ctx, group, 6)
    await ctx.wait_until(lambda: all(len(h.tokens) >= 3 for h in handles), 3)
    await ctx.driver.drop(handles)
    await _settle_aborts(ctx, group, owners)
    _check_exactly_once(ctx, group, owners)


# ------------------------------------------------------------------ after an ending

ENDINGS: dict[str, tuple[str, list[Step]]] = {
    "length": ("LENGTH from the engine", stream([100, 101])),
    "eos": ("EOS token, STOP from the engine", stream([100, 2], reason=m.FinishReason.STOP)),
    "engine_abort": ("ABORT finish from the engine",
                     [Emit([100]), Finish(m.FinishReason.ABORT)]),
    "error": ("per-request ERROR from the engine",
              [Emit([100]), Finish(m.FinishReason.ERROR,
                                   error=m.RequestError("internal", "scripted failure"))]),
}


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


def _ended_case(kind: str, what: str, steps: list[Step], explicit: bool
                ) -> Callable[[CaseContext], Awaitable[None]]:
    how = "explicitly aborting" if explicit else "dropping"

    @case(f"abort.after_end.{kind}_{'explicit' if explicit else 'drop'}", Level.MUST,
          f"After a request ended by {what}, {how} it sends no ABORT.",
          grounds=FINISHED_EXPLICIT if explicit else FINISHED_DROP,
          needs=ABORT if explicit else DROP)
    async def check(ctx: CaseContext) -> None:
        group, handle, rid = await _ended(ctx, steps)
        if explicit:
            await ctx.driver.abort([rid])
        else:
            await ctx.driver.drop([handle])
        await ctx.quiet(0.4)
        ids = group.transcript.aborted_ids()
        ctx.require(not ids, expected=f"no ABORT after {what}", observed=ids)

    check.__name__ = check.__qualname__ = f"after_end_{kind}_{'explicit' if explicit else 'drop'}"
    return check


for _kind, (_what, _steps) in ENDINGS.items():
    for _explicit in (False, True):
        _fn = _ended_case(_kind, _what, _steps, _explicit)
        globals()[_fn.__name__] = _fn
del _fn  # one module global per case: the loop variable must not be collected again


def _stop_string_case(explicit: bool) -> Callable[[CaseContext], Awaitable[None]]:
    how = "explicitly aborting" if explicit else "dropping"

    @case(f"abort.after_end.stop_string_{'explicit' if explicit else 'drop'}", Level.MUST,
          f"A stream ended by a frontend stop string is aborted once at its engine; "
          f"{how} it afterwards sends nothing more.",
          grounds=both(*STOP_STRING.cites, *ABORT_ONCE.cites),
          needs=[*(ABORT if explicit else DROP), Capability.STOP_STRINGS])
    async def check(ctx: CaseContext) -> None:
        group = await ctx.start([EngineScript(rules=[any_request(trickle(0.01))])])
        p = prompt(0)
        handle = await ctx.driver.generate(p, 1000, stop=["t103"])
        await handle.wait(ctx.t(3))
        ctx.require(handle.finish_reason == "stop", expected="finish_reason stop",
                    observed=f"{handle.finish_reason} error={handle.error}")
        found = request_for(group, p)
        ctx.require(found is not None, expected="an ADD", observed=None)
        assert found is not None
        owners = {found[1]: found[0]}
        await _settle_aborts(ctx, group, owners)
        if explicit:
            await ctx.driver.abort([found[1]])
        else:
            await ctx.driver.drop([handle])
        await ctx.quiet(0.4)
        _check_exactly_once(ctx, group, owners)

    check.__name__ = check.__qualname__ = f"after_stop_string_{'explicit' if explicit else 'drop'}"
    return check


after_stop_string_drop = _stop_string_case(False)
after_stop_string_explicit = _stop_string_case(True)


# ------------------------------------------------------------------ repeats and routing


@case("abort.explicit.twice", Level.MUST,
      "Explicitly aborting the same live id twice sends one ABORT.", grounds=ABORT_ONCE,
      needs=ABORT)
async def explicit_twice(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())])])
    _handles, owners = await _open_streams(ctx, group, 2)
    await ctx.driver.abort(list(owners))
    await _settle_aborts(ctx, group, owners)
    await ctx.driver.abort(list(owners))
    await ctx.quiet(0.4)
    _check_exactly_once(ctx, group, owners)


@case("abort.drop.then_explicit_once", Level.MUST,
      "A stream dropped and then explicitly aborted is aborted exactly once.",
      grounds=ABORT_ONCE,
      needs=[*ABORT, Capability.DROP])
async def drop_then_explicit(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())])])
    handles, owners = await _open_streams(ctx, group, 3)
    await ctx.driver.drop(handles)
    await _settle_aborts(ctx, group, owners)
    await ctx.driver.abort(list(owners))
    await ctx.quiet(0.4)
    _check_exactly_once(ctx, group, owners)


UNEVEN = {1: [9], 2: [1, 6], 3: [4, 1, 2], 4: [2, 9, 1, 3]}  # streams per engine


async def _open_pinned(ctx: CaseContext, group: EngineGroup, per_engine: list[int]
                       ) -> tuple[list[StreamHandle], dict[str, int]]:
    """Open `per_engine[r]` held streams pinned to engine r with data_parallel_rank."""
    prompts: list[list[int]] = []
    handles: list[StreamHandle] = []
    for rank, count in enumerate(per_engine):
        for _ in range(count):
            prompts.append(prompt(len(prompts)))
            handles.append(await ctx.driver.generate(prompts[-1], 100,
                                                     data_parallel_rank=rank))
    for h in handles:
        await h.wait_first(ctx.t(5))
    await ctx.wait_until(lambda: requests_for(group, prompts) is not None, 3)
    owners = requests_for(group, prompts) or {}
    ctx.require(len(owners) == len(prompts), expected=f"{len(prompts)} ADDs",
                observed=len(owners))
    placed = [sum(1 for r in owners.values() if r == rank) for rank in range(len(per_engine))]
    ctx.require(placed == per_engine, expected=f"streams per engine {per_engine}",
                observed=placed)
    return handles, owners


def _uneven_burst_case(n: int) -> Callable[[CaseContext], Awaitable[None]]:
    @case(f"abort.burst.uneven_{n}_engines", Level.MUST,
          f"Dropping streams spread unevenly over {n} engine(s) ({UNEVEN[n]}) aborts each "
          f"id exactly once at its own engine.", grounds=PINNED_DROP,
          needs=[*DROP, Capability.DP_RANK])
    async def check(ctx: CaseContext) -> None:
        group = await ctx.start([EngineScript(rules=[any_request(hold())])
                                 for _ in range(n)])
        handles, owners = await _open_pinned(ctx, group, UNEVEN[n])
        await ctx.driver.drop(handles)
        await _settle_aborts(ctx, group, owners)
        _check_exactly_once(ctx, group, owners)

    check.__name__ = check.__qualname__ = f"burst_uneven_{n}"
    return check


for _n in UNEVEN:
    _fn = _uneven_burst_case(_n)
    globals()[_fn.__name__] = _fn
del _fn


@case("abort.explicit.three_engines_one_call", Level.MUST,
      "One explicit abort naming ids owned by three engines sends each engine only its own "
      "ids, once.", grounds=EXPLICIT_GROUPED,
      needs=[*ABORT, Capability.DP_RANK])
async def explicit_three_engines(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())]) for _ in range(3)])
    _handles, owners = await _open_pinned(ctx, group, [3, 1, 2])
    await ctx.driver.abort(sorted(owners, reverse=True))
    await _settle_aborts(ctx, group, owners)
    _check_exactly_once(ctx, group, owners)


@case("abort.drop.explicit_rank", Level.MUST,
      "Dropping a stream routed with an explicit data_parallel_rank aborts it at that "
      "engine.", grounds=PINNED_DROP, needs=[*DROP, Capability.DP_RANK])
async def drop_explicit_rank(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())]) for _ in range(3)])
    handles, owners = await _open_pinned(ctx, group, [0, 0, 1])
    await ctx.driver.drop(handles)
    await _settle_aborts(ctx, group, owners)
    _check_exactly_once(ctx, group, owners)
