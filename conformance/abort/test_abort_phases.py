"""Aborts and drops at every phase of a request, and after every kind of ending.

A port author gets aborts wrong at the edges: before the ADD reached the engine, before the
first output (dropped, or explicitly aborted), after the request already ended (by length,
EOS, a stop string, an engine-side abort or an error), twice, across several engines with
uneven ownership, for a request that was routed with an explicit data_parallel_rank, or
when a client reuses the id of a stream it just dropped. The rule is the same everywhere:
an engine gets an ABORT only for a live request it received the ADD for, after that ADD, at
most once (PR #44591; the grounds cite async_llm.py, core_client.py, output_processor.py and
the Rust client's stream.rs / imp.rs / state.rs).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

from conformance.abort.test_abort import (
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
    EXPLICIT_ENDS,
    EXPLICIT_GROUPED,
    FINISHED_DROP,
    STOP_STRING,
    _check_exactly_once,
    _open_streams,
    _settle_aborts,
    _wait_aborted,
)
from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, engine, py, rs
from harness.cases.helpers import hold, prompt, request_for, requests_for, trickle
from harness.frontends.api import (
    Capability,
    FrontendError,
    StreamHandle,
    UnsupportedOperation,
)
from harness.protocol.vocab import detokenize
from harness.protocol.wire import AbortRequests, AddRequest
from harness.protocol.wire import messages as m
from harness.results.records import Level
from mock_engines.group import EngineGroup
from mock_engines.script import (
    Die,
    Emit,
    EngineScript,
    Finish,
    FinishedOnly,
    Step,
    any_request,
    by_prompt,
    stream,
)
from mock_engines.transcript import Record

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

_LLM = "rust/src/llm/src/lib.rs"

# An explicit abort issued once generate() has returned (its ADD sent, no output yet) finds the
# request: Python registers it in the output processor before the ADD is sent; the Rust client
# registers it before its ADD (client.rs:642) and vllm-rs's Llm tracks its external -> engine
# id once call() has sent the ADD, before generate() returns the stream to the client
# (lib.rs:124-135), which is where /abort_requests resolves ids (lib.rs:158). PR #47173's review
# of that window, and PR #57062 (a partially registered request not aborted), are the bug
# class: an abort that the index does not hold yet is lost and the request runs on.
EXPLICIT_BEFORE_OUTPUT = both(
    *EXPLICIT_ENDS.cites,
    py(f"{_AL}:581", "self.output_processor.add_request(request, prompt, parent_req, index,"),
    py(f"{_AL}:584", "await self.engine_core.add_request_async(request)"),
    rs(f"{_CLIENT}:642", "let (engine_id, rx) = self.inner.register_request("),
    rs(f"{_LLM}:124", "let stream = self.client.call(prepared.engine_request).await?;"),
    rs(f"{_LLM}:135", "let guard = self.inflight.track(external_request_id, internal_request_id);"),
    rs(f"{_LLM}:158", "self.inflight.resolve(external_ids)"),
)

# A dropped stream's ABORT names the dropped request's own engine-side id, which a later request
# reusing the client id never gets: both frontends append a random suffix to every client id,
# Python aborts the cancelled request by its internal id (q.request_id), the Rust stream's Drop
# queues its own engine-side id for run_abort_loop; each takes the request out of its table
# with that ABORT, so it is sent once. An ABORT naming the new request's id would
# end it at the engine (the engine aborts whatever id it holds) and leave its stream waiting:
# PR #24382 / issue #23697 (an id freed before its ABORT was sent, so a reuse got aborted).
REUSE_AFTER_DROP = both(
    py("vllm/v1/engine/input_processor.py:371",
       'request.request_id = f"{request.external_req_id}-{random_uuid():.8}"'),
    py(f"{_AL}:809", "await self.abort(q.request_id, internal=True)"),
    py(f"{_OP}:633", "req_state = self.request_states.pop(request_id, None)"),
    rs("rust/src/llm/src/request.rs:100",
       'format!("{external_request_id}-{}", &random_suffix[..8])'),
    rs(f"{_STREAM}:233", "request_id: self.request_id.clone(),"),
    rs(f"{_IMP}:389", "let Some(engine_id) = inner.take_auto_abort_target(&request_id) else {"),
    rs(f"{_IMP}:335", "let (_, engine_id) = registry.remove(request_id)?;"),
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
    owners = {req.request_id: rank for rank in range(len(group))
              for req in group.transcript.adds(rank)}
    await ctx.wait_until(lambda: set(owners) <= set(group.transcript.aborted_ids()), 3)
    await ctx.quiet(0.2)
    _check_add_before_abort(ctx, group)
    aborted = set(group.transcript.aborted_ids())
    ctx.note(f"{len(owners)} ADDs read after the drop, {len(aborted)} ids aborted")
    _check_exactly_once(ctx, group, owners)


def _drop_zero_delay_case(n: int) -> Callable[[CaseContext], Awaitable[None]]:
    @case(f"abort.phase.drop_zero_delay_{n}_engines", Level.MUST,
          f"With {n} engine(s), streams each dropped the instant its generate() returned "
          "(no wait for the ADD to reach an engine, generate and drop interleaved) are "
          "each, at their own engine, ADDed then ABORTed exactly once (or neither): no ADD "
          "is left running, no ABORT overtakes its ADD, every stream ends.",
          grounds=ADD_BEFORE_ABORT, needs=DROP)
    async def check(ctx: CaseContext) -> None:
        group = await ctx.start([EngineScript(rules=[any_request(hold())]) for _ in range(n)])
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
        owners = {req.request_id: rank for rank in range(len(group))
                  for req in group.transcript.adds(rank)}
        ctx.note(f"{len(owners)} of {2 * n} requests reached an engine")
        ctx.require(settled, expected="every ADD that reached an engine ABORTed there",
                    observed=f"ADDed, never ABORTed: "
                             f"{sorted(set(owners) - set(group.transcript.aborted_ids()))}")
        await ctx.quiet(0.2)  # a duplicate ABORT would arrive now
        _check_add_before_abort(ctx, group)
        _check_exactly_once(ctx, group, owners)
        ended = await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
        ctx.require(ended, expected="every dropped stream ended",
                    observed=f"{sum(not h.ended for h in handles)} still open")

    check.__name__ = check.__qualname__ = f"drop_zero_delay_{n}"
    return check


for _n in (1, 2):
    _fn0 = _drop_zero_delay_case(_n)
    globals()[_fn0.__name__] = _fn0
del _fn0


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


def _explicit_before_output_case(n: int) -> Callable[[CaseContext], Awaitable[None]]:
    @case(f"abort.phase.explicit_before_first_output_{n}_engines", Level.MUST,
          f"With {n} engine(s), an explicit abort of streams whose ADDs the engines hold but "
          "that have no output yet (issued right after generate returned) sends each one "
          "ABORT, after its ADD, to its own engine, and ends every stream 'abort' with no "
          "tokens and no error.", grounds=EXPLICIT_BEFORE_OUTPUT, needs=ABORT)
    async def check(ctx: CaseContext) -> None:
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
        await _settle_aborts(ctx, group, owners)
        _check_add_before_abort(ctx, group)
        _check_exactly_once(ctx, group, owners)
        ended = await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
        seen = [(h.finish_reason, h.error, h.tokens) for h in handles]
        ctx.require(ended and all(s == ("abort", None, []) for s in seen),
                    expected="every stream ended 'abort', no error, no tokens",
                    observed=f"ended {ended}; (finish_reason, error, tokens): {seen}")

    check.__name__ = check.__qualname__ = f"explicit_before_first_output_{n}"
    return check


explicit_before_first_output_1 = _explicit_before_output_case(1)
explicit_before_first_output_2 = _explicit_before_output_case(2)

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
    "stop_token": ("a stop token id, STOP from the engine",
                   stream([100, 201], reason=m.FinishReason.STOP, stop_reason=201)),
    "repetition": ("REPETITION finish from the engine",
                   stream([100, 101], reason=m.FinishReason.REPETITION,
                          stop_reason="repetition_detected")),
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


def _make_drop_twice(engines: int) -> None:
    @case(f"abort.drop.same_stream_twice_zero_delay_{engines}_engines", Level.MUST,
          f"With {engines} engine(s), live streams dropped twice with no pause in between "
          "(each listed twice in one drop call, or dropped by two back-to-back calls, both "
          "before any ABORT could go out) are each aborted exactly once, at their engine.",
          grounds=ABORT_ONCE, needs=DROP)
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start([EngineScript(rules=[any_request(hold())])
                                 for _ in range(engines)])
        handles, owners = await _open_streams(ctx, group, 4 * engines)
        listed_twice, called_twice = handles[:2 * engines], handles[2 * engines:]
        await ctx.driver.drop([h for h in listed_twice for _ in range(2)])
        await ctx.driver.drop(called_twice)
        await ctx.driver.drop(called_twice)
        await _settle_aborts(ctx, group, owners)
        _check_exactly_once(ctx, group, owners)

    run.__name__ = run.__qualname__ = f"drop_same_stream_twice_{engines}"
    globals()[run.__name__] = run


for _n in (1, 2):
    _make_drop_twice(_n)


# ------------------------------------------------- a stop string with the engine racing on
# The engine's next message can already be queued when the frontend matches a stop string in
# one output: more outputs, its death, its retiring the request, its final output, each sent
# with no delay. The ABORT the stop string owes must still go out while the engine runs
# the request, and nothing the engine sends next may change the ended stream.

# 200 one-token outputs with no delay, the last one completing the stop string: the engine
# runs ahead of the frontend, so what it sends next is queued before the match is read.
_STOP_TOKENS = list(range(100, 300))
STOP_AT = "t299"  # only token 299's text holds it
STOP_TEXT_SEEN = detokenize(_STOP_TOKENS[:-1]) + " "
_STOP_STEPS: list[Step] = [Emit([t]) for t in _STOP_TOKENS]
STOP_RACE_ENDS_ONCE = both(
    *STOP_STRING.cites,
    py(f"{_OP}:761", "# Ignore output for already-aborted request."),
    rs("rust/src/engine-core-client/src/client/imp.rs:467",
       '"dropping output for inactive request"'),
)
STOP_RACE_DEATH = both(
    *STOP_RACE_ENDS_ONCE.cites,
    py(f"{_CC}:587", "self.engine_dead = True"),
    rs(f"{_IMP}:120", "if registry.is_closed() {"),
)
STOP_RACE_RETIRED = both(
    *STOP_RACE_ENDS_ONCE.cites,
    py(f"{_CC}:1823", "for req_id in outputs.finished_requests:"),
    rs(f"{_IMP}:486", "drop(inner.finish_requests(finished_requests));"),
)


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
    await _wait_aborted(ctx, group, {found[1]})
    await ctx.quiet(0.1)
    _check_exactly_once(ctx, group, {found[1]: found[0]})


@case("abort.stop_string.zero_delay_final_output_keeps_stop", Level.MUST,
      "The engine's final output ('length') arriving with no delay after the output that "
      "completed a stop string leaves the stream as the stop string ended it: 'stop', the "
      "text before the stop string, no tokens after it; at most one ABORT.",
      grounds=STOP_RACE_ENDS_ONCE, needs=[Capability.GENERATE, Capability.STOP_STRINGS])
async def stop_string_zero_delay_final(ctx: CaseContext) -> None:
    group, handle, _ = await _stopped_stream(
        ctx, [*_STOP_STEPS, Emit([300]), Finish(m.FinishReason.LENGTH, [301])])
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


# The engine's final output and the client's abort (or drop) of the same stream in the same
# few milliseconds: whichever the frontend sees first ends the stream, the other is a no-op.
RACE_ENDS_ONCE = both(
    py(f"{_OP}:633", "req_state = self.request_states.pop(request_id, None)"),
    py(f"{_OP}:919", "self.request_states.pop(req_id)"),
    rs(f"{_STATE}:253", "match self.remove(output.request_id.as_str()) {"),
    rs(f"{_IMP}:390", 'debug!(request_id, "skip auto-abort for inactive request");'),
    engine("vllm/v1/core/sched/scheduler.py:2994",
           "if request is None or request.is_finished():"),
)
RACE_STREAMS = 12
RACE_FINISH_AFTER = 0.15  # s after the first token; stream i finishes i ms later


@case("abort.race.final_output_meets_abort", Level.MUST,
      f"With 2 engines, {RACE_STREAMS} streams whose final 'length' output is due within a "
      "few milliseconds of each other are aborted (half explicitly, half dropped) in that "
      "very window: each stream ends once, 'length' with both tokens or 'abort', never an "
      "error; each id is aborted at most once and only at its engine; later requests are "
      "served.",
      grounds=RACE_ENDS_ONCE, needs=[*ABORT, Capability.DROP])
async def race_final_output_meets_abort(ctx: CaseContext) -> None:
    prompts = [prompt(i) for i in range(RACE_STREAMS)]
    rules = [by_prompt(p, [Emit([100]), Finish(m.FinishReason.LENGTH, [101],
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


# ------------------------------------------------------------------ a dropped stream's id reused

REUSED_ID = "cw-reuse-1"


def _add_at(records: list[Record], prompt_ids: list[int]) -> tuple[int, str] | None:
    """(index, engine-side id) of the ADD carrying `prompt_ids` among one engine's inputs."""
    for i, record in enumerate(records):
        message = record.message
        if (isinstance(message, AddRequest)
                and list(message.request.prompt_token_ids or []) == prompt_ids):
            return i, message.request.request_id
    return None


def _aborts_naming(records: list[Record], rid: str, start: int, end: int) -> int:
    return sum(1 for r in records[start + 1:end]
               if isinstance(r.message, AbortRequests) and rid in r.message.request_ids)


def _reuse_aborts(group: EngineGroup, rank: int, dropped_prompt: list[int],
                  reuse_prompt: list[int]) -> tuple[int, tuple[int, str, int] | None]:
    """ABORTs naming the dropped request's id at its engine after its ADD (and before a
    reuse's ADD under that same id there), and (rank, engine-side id, ABORTs naming it
    after its ADD at that engine) of the reuse, None if no ADD carried it."""
    inputs = {e.rank: group.transcript.select(rank=e.rank, direction="in", channel="input")
              for e in group.engines}
    first = _add_at(inputs[rank], dropped_prompt)
    if first is None:
        return 0, None
    reuse = None
    for r, records in inputs.items():
        found = _add_at(records, reuse_prompt)
        if found is not None:
            reuse = (r, found[0], found[1])
            break
    end = len(inputs[rank])
    if reuse is not None and reuse[0] == rank and reuse[2] == first[1]:
        end = reuse[1]  # one id, two requests: the ABORTs after the reuse's ADD name it
    dropped = _aborts_naming(inputs[rank], first[1], first[0], end)
    if reuse is None:
        return dropped, None
    r, index, rid = reuse
    return dropped, (r, rid, _aborts_naming(inputs[r], rid, index, len(inputs[r])))


def _reuse_case(n: int, settled: bool) -> Callable[[CaseContext], Awaitable[None]]:
    when = "settled" if settled else "zero_delay"
    pin = None if n == 1 else n - 1  # both requests on one engine, not rank 0
    how = ("once the dropped stream's ABORT reached its engine" if settled
           else "at once, with no wait after the drop")
    where = "" if pin is None else f", both pinned to engine {pin}"

    @case(f"abort.reuse.dropped_id_{when}_{n}_engines", Level.MUST,
          f"With {n} engine(s){where}: a stream with client request id X is dropped and a new "
          f"request with id X is sent {how}. The dropped request is aborted once at its "
          "engine; the new one is either refused or runs to completion (its tokens, 'length', no "
          "error), and no ABORT naming its engine-side id reaches its engine after its ADD.",
          grounds=REUSE_AFTER_DROP,
          needs=[*DROP, Capability.CLIENT_REQUEST_ID,
                 *([Capability.DP_RANK] if pin is not None else [])])
    async def check(ctx: CaseContext) -> None:
        first_prompt, second_prompt = prompt(0), prompt(1)
        rules = [by_prompt(first_prompt, hold()),
                 by_prompt(second_prompt, stream([300, 301, 302], 0.05))]
        group = await ctx.start([EngineScript(rules=list(rules)) for _ in range(n)])
        first = await ctx.driver.generate(first_prompt, 50, request_id=REUSED_ID,
                                          data_parallel_rank=pin)
        await first.wait_first(ctx.t(5))
        dropped = request_for(group, first_prompt)
        ctx.require(dropped is not None, expected="the first request's ADD", observed="none")
        assert dropped is not None
        rank, rid = dropped
        await ctx.driver.drop([first])
        if settled:
            await _wait_aborted(ctx, group, {rid})
            await ctx.quiet(0.1)
        reuse: StreamHandle | None = None
        try:
            reuse = await ctx.driver.generate(second_prompt, 3, request_id=REUSED_ID,
                                              data_parallel_rank=pin)
        except UnsupportedOperation:
            raise
        except FrontendError as exc:
            ctx.note(f"the reuse was refused: {exc}")
        if reuse is not None:
            handle = reuse
            await ctx.wait_until(lambda: handle.ended, 3)
        await ctx.wait_until(lambda: rid in group.transcript.aborted_ids(rank), 3)
        await ctx.quiet(0.2)  # an ABORT owed to nobody would come now
        dropped_aborts, found = _reuse_aborts(group, rank, first_prompt, second_prompt)
        if reuse is not None and found is None and reuse.ended \
                and reuse.finish_reason == "error" and not reuse.tokens:
            ctx.note(f"the reuse was refused: {reuse.error}")  # as a stream error, no ADD
            reuse = None
        if reuse is None:
            ctx.require(found is None, expected="a refused reuse sends no ADD",
                        observed=f"ADD {found}")
        else:
            ctx.require(reuse.ended and reuse.error is None
                        and reuse.tokens == [300, 301, 302] and reuse.finish_reason == "length",
                        expected="the new request: tokens [300, 301, 302], finish 'length', "
                                 "no error",
                        observed=f"ended {reuse.ended}, finish {reuse.finish_reason!r}, "
                                 f"tokens {reuse.tokens}, error {reuse.error!r}")
            ctx.require(found is not None, expected="the new request's ADD", observed="none")
            assert found is not None
            new_rank, new_rid, late = found
            ctx.note(f"dropped {rid} at engine {rank}; the reuse is {new_rid} at engine "
                     f"{new_rank}")
            ctx.require(late == 0, expected=f"no ABORT naming {new_rid} at engine {new_rank} "
                                            "after its ADD",
                        observed=f"{late} ABORT(s) naming it after its ADD")
        ctx.require(dropped_aborts == 1,
                    expected=f"the dropped request {rid} aborted once at engine {rank}",
                    observed=f"{dropped_aborts} ABORT(s) naming it there after its ADD "
                             f"(ABORTed ids at engine {rank}: "
                             f"{group.transcript.aborted_ids(rank)})")

    check.__name__ = check.__qualname__ = f"reuse_dropped_id_{when}_{n}"
    return check


for _n in (1, 2):
    for _settled in (False, True):
        _fn = _reuse_case(_n, _settled)
        globals()[_fn.__name__] = _fn
del _fn


# Dropping a stream that already finished sends nothing, even when a live request now uses
# its client id: the finished request left the frontend's table when it ended (python's
# generate() returned, its state popped, output_processor.py:919; rust's terminated stream
# skips its auto-abort, stream.rs:224), and an ABORT by the client id would end the reuse.
DROP_FINISHED_SPARES_REUSE = both(
    py(f"{_OP}:919", "self.request_states.pop(req_id)"),
    py(f"{_AL}:809", "await self.abort(q.request_id, internal=True)"),
    py("vllm/v1/engine/input_processor.py:371",
       'request.request_id = f"{request.external_req_id}-{random_uuid():.8}"'),
    rs(f"{_STREAM}:224", "if self.is_terminated() {"),
    rs("rust/src/llm/src/request.rs:100",
       'format!("{external_request_id}-{}", &random_suffix[..8])'),
    *_ENGINE_ABORT,
)


def _drop_finished_case(n: int) -> Callable[[CaseContext], Awaitable[None]]:
    @case(f"abort.reuse.drop_finished_handle_spares_reuse_{n}_engines", Level.MUST,
          f"With {n} engine(s): a request with client id X finishes, a new request reuses X "
          "and is live, then the client drops the first (finished) stream: no ABORT is "
          "sent at all, and the live reuse keeps streaming.",
          grounds=DROP_FINISHED_SPARES_REUSE, needs=[*DROP, Capability.CLIENT_REQUEST_ID])
    async def check(ctx: CaseContext) -> None:
        first_prompt, second_prompt = prompt(0), prompt(1)
        rules = [by_prompt(first_prompt, stream([100])),
                 by_prompt(second_prompt, hold((300,)))]
        group = await ctx.start([EngineScript(rules=list(rules)) for _ in range(n)])
        first = await ctx.driver.generate(first_prompt, 1, request_id=REUSED_ID)
        await first.wait(ctx.t(3))
        ctx.require(first.ended and first.finish_reason == "length",
                    expected="the first request ends 'length'",
                    observed=f"{first.finish_reason} {first.error}")
        reuse = await ctx.driver.generate(second_prompt, 50, request_id=REUSED_ID)
        await reuse.wait_first(ctx.t(3))
        await ctx.driver.drop([first])
        await ctx.quiet(0.3)  # an ABORT would arrive now
        ids = group.transcript.aborted_ids()
        ctx.require(not ids, expected="no ABORT (the dropped stream had finished)",
                    observed=f"ABORTed ids {ids}")
        ctx.require(not reuse.ended, expected="the reuse still streaming",
                    observed=f"ended {reuse.finish_reason!r} error {reuse.error!r}")

    check.__name__ = check.__qualname__ = f"drop_finished_spares_reuse_{n}"
    return check


for _n in (1, 2):
    _fn2 = _drop_finished_case(_n)
    globals()[_fn2.__name__] = _fn2
del _fn2
