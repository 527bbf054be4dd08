"""Aborts and drops at every phase of a live request, and racing its final output.

A port author gets aborts wrong at the edges: before the ADD reached the engine, the instant
generate() returned, before the first output (dropped, or explicitly aborted), while tokens
flow, or in the very milliseconds the engine's final output arrives. The rule is the same
everywhere: an engine gets an ABORT only for a live request it received the ADD for, after
that ADD, at most once (PR #44591; the grounds cite async_llm.py, core_client.py,
output_processor.py and the Rust client's stream.rs / imp.rs / state.rs).
"""

from __future__ import annotations

import asyncio
from collections import Counter

from conformance.abort.helpers import (
    ABORT,
    AL,
    BURST_ONCE,
    CC,
    CLIENT,
    DROP,
    ENGINE_ABORT,
    EXPLICIT_ENDS,
    IMP,
    OP,
    STATE,
    STREAM,
    check_exactly_once,
    holding,
    open_streams,
    settle_aborts,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    Emit,
    EngineGroup,
    EngineScript,
    Finish,
    Level,
    any_request,
    both,
    by_prompt,
    case,
    engine,
    messages,
    prompt,
    py,
    request_for,
    requests_for,
    rs,
    trickle,
)
from harness.protocol.wire import AbortRequests, AddRequest

_LLM = "rust/src/llm/src/lib.rs"

# The ADD goes out before any ABORT for the same id, on the owning engine's input: Python
# registers the request and sends its ADD inside add_request(), and generate() aborts only a
# request whose queue exists; Rust builds the stream (whose Drop aborts) and then sends the ADD
# to the engine it registered. An ABORT before its ADD is skipped by the engine
# (scheduler.py:2994) and the late ADD then runs for nobody.
ADD_BEFORE_ABORT = both(
    py(f"{AL}:581", "self.output_processor.add_request(request, prompt, parent_req, index,"),
    py(f"{AL}:584", "await self.engine_core.add_request_async(request)"),
    py(f"{CC}:1615", "await self._send_input(EngineCoreRequestType.ADD, request, chosen_engine)"),
    py(f"{AL}:809", "await self.abort(q.request_id, internal=True)"),
    rs(f"{CLIENT}:671", "self.inner.send_request_to_engine(&engine_id, req).await?;"),
    rs(f"{STREAM}:232", "let abort_req = AbortRequest {"),
    rs(f"{IMP}:389", "let Some(engine_id) = inner.take_auto_abort_target(&request_id) else {"),
    *ENGINE_ABORT,
)

# An explicit abort issued once generate() has returned (its ADD sent, no output yet) finds the
# request: Python registers it in the output processor before the ADD is sent; the Rust client
# registers it before its ADD (client.rs:642) and vllm-rs's Llm tracks its external -> engine
# id once call() has sent the ADD, before generate() returns the stream to the client
# (lib.rs:124-135), which is where /abort_requests resolves ids (lib.rs:158). PR #47173's review
# of that window, and PR #57062 (a partially registered request not aborted), are the bug
# class: an abort that the index does not hold yet is lost and the request runs on.
EXPLICIT_BEFORE_OUTPUT = both(
    *EXPLICIT_ENDS.cites,
    py(f"{AL}:581", "self.output_processor.add_request(request, prompt, parent_req, index,"),
    py(f"{AL}:584", "await self.engine_core.add_request_async(request)"),
    rs(f"{CLIENT}:642", "let (engine_id, rx) = self.inner.register_request("),
    rs(f"{_LLM}:124", "let stream = self.client.call(prepared.engine_request).await?;"),
    rs(f"{_LLM}:135", "let guard = self.inflight.track(external_request_id, internal_request_id);"),
    rs(f"{_LLM}:158", "self.inflight.resolve(external_ids)"),
)

# The engine's final output and the client's abort (or drop) of the same stream in the same
# few milliseconds: whichever the frontend sees first ends the stream, the other is a no-op.
RACE_ENDS_ONCE = both(
    py(f"{OP}:633", "req_state = self.request_states.pop(request_id, None)"),
    py(f"{OP}:919", "self.request_states.pop(req_id)"),
    rs(f"{STATE}:253", "match self.remove(output.request_id.as_str()) {"),
    rs(f"{IMP}:390", 'debug!(request_id, "skip auto-abort for inactive request");'),
    engine("vllm/v1/core/sched/scheduler.py:2994",
           "if request is None or request.is_finished():"),
)
RACE_STREAMS = 12
RACE_FINISH_AFTER = 0.15  # s after the first token; stream i finishes i ms later


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


def _owners_of_adds(group: EngineGroup) -> dict[str, int]:
    """{engine-side id: rank} of every ADD the engines read."""
    return {req.request_id: rank for rank in range(len(group))
            for req in group.transcript.adds(rank)}


@case("abort.phase.before_add_read", Level.MUST,
      "Dropping streams whose ADDs the engines have not read yet sends, per request, the "
      "ADD then one ABORT (or neither), each to the owning engine.",
      grounds=ADD_BEFORE_ABORT, needs=DROP)
async def before_add_read(ctx: CaseContext) -> None:
    group = await ctx.start(holding(2))
    for mock in group.engines:
        mock.stop_reading()
    await ctx.quiet(0.1)
    prompts = [prompt(i) for i in range(4)]
    handles = [await ctx.driver.generate(p, 100) for p in prompts]
    await ctx.quiet(0.1)
    await ctx.driver.drop(handles)
    await ctx.quiet(0.3)
    for mock in group.engines:
        mock.resume_reading()
    await ctx.wait_until(lambda: requests_for(group, prompts) is not None, 3)
    owners = _owners_of_adds(group)
    await ctx.wait_until(lambda: set(owners) <= set(group.transcript.aborted_ids()), 3)
    await ctx.quiet(0.2)
    _check_add_before_abort(ctx, group)
    aborted = set(group.transcript.aborted_ids())
    ctx.note(f"{len(owners)} ADDs read after the drop, {len(aborted)} ids aborted")
    check_exactly_once(ctx, group, owners)


@case("abort.phase.drop_zero_delay_{n}_engines", Level.MUST,
      "With {n} engine(s), streams each dropped the instant its generate() returned "
      "(no wait for the ADD to reach an engine, generate and drop interleaved) are "
      "each, at their own engine, ADDed then ABORTed exactly once (or neither): no ADD "
      "is left running, no ABORT overtakes its ADD, every stream ends.",
      grounds=ADD_BEFORE_ABORT, needs=DROP, params=[{"n": n} for n in (1, 2)])
async def drop_zero_delay(ctx: CaseContext, n: int) -> None:
    group = await ctx.start(holding(n))
    handles = []
    for i in range(2 * n):
        handle = await ctx.driver.generate(prompt(i), 100)
        await ctx.driver.drop([handle])  # zero delay: nothing awaited in between
        handles.append(handle)

    def added() -> set[str]:
        return {req.request_id for req in group.transcript.adds()}

    # Every request's ADD (a frontend may also send neither ADD nor ABORT: then the
    # bound passes with fewer), each ABORTed.
    settled = await ctx.wait_until(lambda: len(added()) == 2 * n
                                   and added() <= set(group.transcript.aborted_ids()), 3)
    settled = settled or added() <= set(group.transcript.aborted_ids())
    owners = _owners_of_adds(group)
    ctx.note(f"{len(owners)} of {2 * n} requests reached an engine")
    ctx.require(settled, expected="every ADD that reached an engine ABORTed there",
                observed=f"ADDed, never ABORTed: "
                         f"{sorted(set(owners) - set(group.transcript.aborted_ids()))}")
    await ctx.quiet(0.2)  # a duplicate ABORT would arrive now
    _check_add_before_abort(ctx, group)
    check_exactly_once(ctx, group, owners)
    ended = await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    ctx.require(ended, expected="every dropped stream ended",
                observed=f"{sum(not h.ended for h in handles)} still open")


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
    await settle_aborts(ctx, group, owners)
    _check_add_before_abort(ctx, group)
    check_exactly_once(ctx, group, owners)


@case("abort.phase.explicit_before_first_output_{n}_engines", Level.MUST,
      "With {n} engine(s), an explicit abort of streams whose ADDs the engines hold but "
      "that have no output yet (issued right after generate returned) sends each one "
      "ABORT, after its ADD, to its own engine, and ends every stream 'abort' with no "
      "tokens and no error.", grounds=EXPLICIT_BEFORE_OUTPUT, needs=ABORT,
      params=[{"n": n} for n in (1, 2)])
async def explicit_before_first_output(ctx: CaseContext, n: int) -> None:
    # No steps: the engines hold every request without output until it is aborted.
    group = await ctx.start([EngineScript(rules=[any_request([])]) for _ in range(n)])
    prompts = [prompt(i) for i in range(2 * n)]
    handles = [await ctx.driver.generate(p, 100) for p in prompts]
    ok = await ctx.wait_until(lambda: requests_for(group, prompts) is not None, 3)
    ctx.require(ok, expected=f"{len(prompts)} ADDs at the engines",
                observed=len(group.transcript.adds()))
    owners = requests_for(group, prompts) or {}
    early = [h.tokens for h in handles if h.first_output.is_set()]
    ctx.require(not early, expected="no output before the abort (the engines hold it)",
                observed=f"streams with output already: {early}")
    await ctx.driver.abort(list(owners))
    await settle_aborts(ctx, group, owners)
    _check_add_before_abort(ctx, group)
    check_exactly_once(ctx, group, owners)
    ended = await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    seen = [(h.finish_reason, h.error, h.tokens) for h in handles]
    ctx.require(ended and all(s == ("abort", None, []) for s in seen),
                expected="every stream ended 'abort', no error, no tokens",
                observed=f"ended {ended}; (finish_reason, error, tokens): {seen}")


@case("abort.phase.mid_stream", Level.MUST,
      "Dropping streams while tokens are flowing aborts each one once at its engine.",
      grounds=BURST_ONCE, needs=DROP)
async def mid_stream(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(trickle(0.01))])
                             for _ in range(2)])
    handles, owners = await open_streams(ctx, group, 6)
    await ctx.wait_until(lambda: all(len(h.tokens) >= 3 for h in handles), 3)
    await ctx.driver.drop(handles)
    await settle_aborts(ctx, group, owners)
    check_exactly_once(ctx, group, owners)


@case("abort.race.final_output_meets_abort", Level.MUST,
      f"With 2 engines, {RACE_STREAMS} streams whose final 'length' output is due within a "
      "few milliseconds of each other are aborted (half explicitly, half dropped) in that "
      "very window: each stream ends once, 'length' with both tokens or 'abort', never an "
      "error; each id is aborted at most once and only at its engine; later requests are "
      "served.",
      grounds=RACE_ENDS_ONCE, needs=[*ABORT, Capability.DROP])
async def race_final_output_meets_abort(ctx: CaseContext) -> None:
    prompts = [prompt(i) for i in range(RACE_STREAMS)]
    rules = [by_prompt(p, [Emit([100]), Finish(messages.FinishReason.LENGTH, [101],
                                               delay=RACE_FINISH_AFTER + i / 1000)])
             for i, p in enumerate(prompts)]
    group = await ctx.start([EngineScript(rules=rules) for _ in range(2)])
    handles = [await ctx.driver.generate(p, 2) for p in prompts]
    for h in handles:
        await h.wait_first(ctx.t(3))
    owners = requests_for(group, prompts) or {}
    ctx.require(len(owners) == RACE_STREAMS, expected=f"{RACE_STREAMS} ADDs",
                observed=len(owners))
    ids = [request_for(group, p) for p in prompts]
    await asyncio.sleep(RACE_FINISH_AFTER + RACE_STREAMS / 2000)  # unscaled: the window
    half = RACE_STREAMS // 2
    await ctx.driver.abort([found[1] for found in ids[:half] if found is not None])
    await ctx.driver.drop(handles[half:])
    for h in handles:
        await h.wait(ctx.t(3))
    ends = [(h.finish_reason, h.tokens, h.error) for h in handles]
    wrong = [e for e in ends if not (e[0] == "length" and e[1] == [100, 101] or
                                     e[0] == "abort") or e[2] is not None]
    ctx.note(f"{sum(e[0] == 'length' for e in ends)} ended 'length', "
             f"{sum(e[0] == 'abort' for e in ends)} 'abort'")
    ctx.require(not wrong, expected="each stream 'length' with [100, 101] or 'abort', no error",
                observed=wrong[:3])
    await ctx.quiet(0.2)
    frames = group.transcript.abort_frames()
    seen = Counter(rid for r in frames for rid in r.message.request_ids)
    ctx.require(all(n == 1 for n in seen.values()), expected="each id aborted at most once",
                observed={rid: n for rid, n in seen.items() if n > 1})
    misplaced = [(rid, r.rank) for r in frames for rid in r.message.request_ids
                 if owners.get(rid) != r.rank]
    ctx.require(not misplaced, expected="each ABORT at the id's own engine",
                observed=misplaced[:3])
    later = await ctx.driver.generate(prompt(RACE_STREAMS), 2)
    await later.wait(ctx.t(3))
    ctx.require(later.finish_reason == "length", expected="a later request served",
                observed=f"{later.finish_reason} error={later.error}")
