"""Streaming-input sessions (vLLM's resumable requests): when the session's stream ends,
and which continuations and closes are refused.

Each segment ends with a finish reason that must not end the client's stream; only the
close (or an engine-side abort or error) does, and a close or continuation sent while a
segment runs waits for that segment. vllm-rs 0.33.0 exposes no streaming-input surface over
HTTP (`session_id` / X-Session-ID only fills EngineCoreRequest.session_id), so these cases
are UNSUPPORTED there.

A continuation of a request that has no open session (a plain request, a session that has
ended) or whose input is already closing must be refused before any ADD. Neither 0.33.0
frontend has such calls (Python feeds a session from an async generator; vllm-rs 0.33.0 has
no sessions; the Rust tests rust-client.md §1.6 names are not in 0.33.0), so whether the
refusal says WHY is corewire's advice: a port that refuses both with the same bare text
leaves the client unable to tell "wrong request" from "too late". Dimensions: the client
call (continue, close), the target (plain request, closed input, ended session).
"""

from __future__ import annotations

import re

from conformance.streaming.helpers import NO_RS, RS_NEVER_RESUMABLE, SESSION_NEEDS, F, ended_as
from harness.cases.authoring import (
    CaseContext,
    Emit,
    EngineGroup,
    EngineScript,
    Finish,
    FrontendError,
    Level,
    StreamHandle,
    by_prompt,
    case,
    engine,
    messages,
    only,
    prompt,
    py,
    recommendation,
    stream,
)
from harness.cases.resumable import (
    finish_segment,
    open_first_segment,
    scripts,
    segment_prompt,
    segment_tokens,
    session_adds,
)

_PY_BOUNDARY_UNLESS_FAILED = py("vllm/v1/engine/output_processor.py:845",
                                "finish_reason not in (FinishReason.ABORT, FinishReason.ERROR)")
_PY_INPUT_CLOSED = py("vllm/v1/engine/output_processor.py:711",
                      "req_state.streaming_input = False")
_PY_FINAL_ADD = py("vllm/v1/engine/async_llm.py:688",
                   "await self._add_request(final_req, None, None, 0, queue)")
_PY_NO_REQUEST = py("vllm/v1/engine/async_llm.py:646",
                    "if any_added and not self.output_processor.has_request(")
_PY_INPUT_STREAM = py("vllm/v1/engine/async_llm.py:642", "async for input_chunk in input_stream:")
_ENGINE_KEEPS = engine("vllm/v1/core/sched/scheduler.py:2719", "if not request.resumable:")
_ENGINE_QUEUES = engine("vllm/v1/core/sched/scheduler.py:2938",
                        "existing.streaming_queue.append(update)")
_ENGINE_NEW_SESSION = engine("vllm/v1/core/sched/scheduler.py:2946", "if request.resumable:")
SEGMENT_BOUNDARY = only(
    py("vllm/v1/engine/output_processor.py:844",
       "streaming_chunk_boundary = req_state.streaming_input and ("),
    py("vllm/v1/engine/output_processor.py:859", "request_output.finished = False"),
    py("vllm/v1/engine/output_processor.py:870", "if streaming_chunk_boundary:"),
    _PY_INPUT_CLOSED, RS_NEVER_RESUMABLE, _ENGINE_KEEPS,
    note=NO_RS + "the engine keeps a resumable request after its segment stops "
    "(scheduler.py:2718-2720); a frontend that ends the stream there, or ABORTs it, loses "
    "the continuation's tokens (lost data)")
CLOSE_WHILE_RUNNING = only(
    _PY_FINAL_ADD, _PY_INPUT_CLOSED, _PY_BOUNDARY_UNLESS_FAILED, RS_NEVER_RESUMABLE,
    _ENGINE_QUEUES,
    note=NO_RS + "the engine queues the close behind the running segment "
    "(scheduler.py:2938) and finishes it normally; ending the stream or sending an ABORT at "
    "the close loses the segment's last tokens (lost data)")
SESSION_ENGINE_END = only(
    _PY_BOUNDARY_UNLESS_FAILED,
    py("vllm/v1/engine/output_processor.py:878",
       "if req_state.streaming_input or not engine_core_output.finished:"),
    _PY_NO_REQUEST, RS_NEVER_RESUMABLE, _ENGINE_NEW_SESSION,
    note=NO_RS + "a frontend that takes an engine ABORT/ERROR for a segment boundary keeps "
    "the client feeding a session the engine has ended: its next chunk re-creates the "
    "request engine-side (scheduler.py:2946-2947; output_processor.py:879-881) and the "
    "client waits on a dead session (hang)")
SESSION_QUEUED_CHUNKS = only(
    py("vllm/v1/engine/output_processor.py:709", "req_state.input_chunk_queue[-1].final = True"),
    py("vllm/v1/engine/output_processor.py:872",
       "update = req_state.input_chunk_queue.popleft()"),
    py("vllm/v1/engine/output_processor.py:859", "request_output.finished = False"),
    _PY_FINAL_ADD, RS_NEVER_RESUMABLE, _ENGINE_QUEUES,
    note=NO_RS + "the engine queues the continuation and the close behind the running "
    "segment (scheduler.py:2938); ending the stream at the first segment's finish loses the "
    "second segment's tokens (lost data)")
SESSION_NO_LATE_CHUNK = only(
    _PY_INPUT_STREAM, _PY_NO_REQUEST, RS_NEVER_RESUMABLE,
    engine("vllm/v1/core/sched/scheduler.py:2936",
           'assert existing.streaming_queue is not None, "duplicate request id"'),
    _ENGINE_NEW_SESSION,
    note=NO_RS + "its chunks come only from the session's own input generator, so none "
    "exists for a plain request or after the input closed (the error itself is the "
    "driver's); a continuation ADD for a running plain request trips the engine's "
    "duplicate-id assertion (scheduler.py:2936: crash), one after the session's close "
    "re-creates a resumable request nobody closes (scheduler.py:2946-2947: engine left in "
    "a wrong state)")
# Neither 0.33.0 frontend has a continue/close call that can refuse: corewire's advice.
REFUSAL_SAYS_WHY = recommendation(
    _PY_INPUT_STREAM, RS_NEVER_RESUMABLE,
    note="corewire's advice: python feeds a session from an async generator (async_llm.py:642), "
    "so no call exists to refuse, and rust 0.33.0 has no sessions (the rust-client tests the "
    "old source named are not in 0.33.0); a port with continue/close calls should say "
    "whether the request has no open session or its input is already closing, so a client "
    "can tell 'wrong request' from 'too late'")


# ----------------------------------------------------------------- the stream across segments


@case("streaming.resumable.segment_{name}_keeps_stream", Level.MUST,
      "A segment that finishes with {name!r} does not end the session's stream and "
      "draws no ABORT; the continuation's tokens arrive on the same stream, and closing "
      "the input ends it with the last segment's finish reason, without an ABORT.",
      grounds=SEGMENT_BOUNDARY, needs=SESSION_NEEDS,
      params=[{"reason": reason, "name": str(reason)} for reason in (F.LENGTH, F.STOP)])
async def segment_keeps_stream(ctx: CaseContext, reason: messages.FinishReason,
                               name: str) -> None:
    group = await ctx.start(scripts(1, 1, 2, reason=reason))
    handle, rid = await open_first_segment(ctx, group)
    await finish_segment(ctx, group, handle, rid, 1, 2)
    await ctx.quiet(0.3)
    first = segment_tokens(0)
    ctx.require(not handle.ended and handle.tokens == first,
                expected=f"the stream open after segment 1 with tokens {first}",
                observed=f"ended={handle.ended} finish={handle.finish_reason} "
                         f"error={handle.error} tokens={handle.tokens}")
    ctx.require(not group.transcript.aborted_ids(),
                expected="no ABORT for a segment finish",
                observed=f"ABORTs {group.transcript.aborted_ids()}")
    await ctx.driver.continue_session(handle, segment_prompt(0, 1), 2)
    await finish_segment(ctx, group, handle, rid, 2, 4)
    both = first + segment_tokens(1)
    ctx.require(not handle.ended and handle.tokens == both,
                expected=f"the stream open after segment 2 with tokens {both}",
                observed=f"ended={handle.ended} finish={handle.finish_reason} "
                         f"error={handle.error} tokens={handle.tokens}")
    await ctx.driver.close_session(handle)
    await ctx.wait_until(lambda: handle.ended, 3)
    ctx.require(handle.ended and handle.finish_reason == name and handle.error is None,
                expected=f"the stream ends {name!r} once the input is closed",
                observed=f"ended={handle.ended} finish={handle.finish_reason} "
                         f"error={handle.error}")
    await ctx.quiet(0.2)
    ctx.require(not group.transcript.aborted_ids(),
                expected="no ABORT for a closed session",
                observed=f"ABORTs {group.transcript.aborted_ids()}")


@case("streaming.resumable.close_while_segment_runs", Level.MUST,
      "Closing the input while a segment still runs sends the final ADD at once but keeps "
      "the stream open until that segment finishes: its last tokens arrive and the stream "
      "ends with its finish reason, without an ABORT.",
      grounds=CLOSE_WHILE_RUNNING, needs=SESSION_NEEDS)
async def close_while_segment_runs(ctx: CaseContext) -> None:
    steps = [Emit([100]), Finish(F.LENGTH, [101], 0.6)]
    group = await ctx.start([EngineScript(rules=[by_prompt(segment_prompt(0, 0), steps)])])
    handle, rid = await open_first_segment(ctx, group)
    await ctx.wait_until(lambda: bool(handle.tokens), 3)
    await ctx.driver.close_session(handle)
    await ctx.wait_until(lambda: len(session_adds(group, rid)) >= 2, 3)
    adds = session_adds(group, rid)
    ctx.require([a.request.resumable for a in adds] == [True, False],
                expected="the final (non-resumable) ADD sent while the segment runs",
                observed=f"resumable flags {[a.request.resumable for a in adds]}")
    ctx.require(not handle.ended, expected="the stream open until the segment finishes",
                observed=f"ended {handle.finish_reason!r} ({handle.error}) before the "
                         f"engine's finish")
    await ctx.wait_until(lambda: handle.ended, 3)
    ctx.require(handle.ended and handle.finish_reason == "length"
                and handle.tokens == [100, 101],
                expected="the stream ends 'length' with [100, 101]",
                observed=f"ended={handle.ended} finish={handle.finish_reason} "
                         f"error={handle.error} tokens={handle.tokens}")
    await ctx.quiet(0.2)
    ctx.require(not group.transcript.aborted_ids(), expected="no ABORT",
                observed=f"ABORTs {group.transcript.aborted_ids()}")


@case("streaming.resumable.close_with_two_segments_in_flight", Level.MUST,
      "With a continuation sent while the first segment still runs, the first segment's "
      "finish and then the input's close leave the stream open until the second segment "
      "finishes: its tokens arrive and the stream ends with its reason, without an ABORT.",
      grounds=SESSION_QUEUED_CHUNKS, needs=SESSION_NEEDS)
async def close_with_two_segments_in_flight(ctx: CaseContext) -> None:
    first = [Emit([100], 0.01), Finish(F.LENGTH, [101], 0.3)]
    second = [Emit([110], 0.01), Finish(F.LENGTH, [111], 1.0)]
    group = await ctx.start([EngineScript(rules=[by_prompt(segment_prompt(0, 0), first),
                                                 by_prompt(segment_prompt(0, 1), second)])])
    handle, rid = await open_first_segment(ctx, group)
    await ctx.wait_until(lambda: bool(handle.tokens), 3)
    await ctx.driver.continue_session(handle, segment_prompt(0, 1), 2)
    await finish_segment(ctx, group, handle, rid, 1, 2)
    await ctx.driver.close_session(handle)
    await ctx.wait_until(lambda: len(session_adds(group, rid)) >= 3, 3)
    await ctx.quiet(0.1)
    ctx.require(not handle.ended, expected="the stream open while the second segment runs",
                observed=f"ended {handle.finish_reason!r} ({handle.error}) with "
                         f"{handle.tokens} before the second segment finished")
    await ctx.wait_until(lambda: handle.ended, 3)
    ctx.require(handle.ended and handle.finish_reason == "length" and handle.error is None
                and handle.tokens[-2:] == [110, 111],
                expected="the stream ends 'length' after the second segment's [110, 111]",
                observed=f"ended={handle.ended} {handle.finish_reason} error={handle.error} "
                         f"tokens={handle.tokens}")
    await ctx.quiet(0.2)
    ctx.require(not group.transcript.aborted_ids(), expected="no ABORT",
                observed=f"ABORTs {group.transcript.aborted_ids()}")


def _segment_failure(kind: messages.FinishReason, segment: int) -> dict[str, object]:
    phase = "first_segment" if segment == 0 else "continuation"
    return {"kind": kind, "segment": segment, "want": "abort" if kind is F.ABORT else "error",
            "phase": phase, "phase_words": phase.replace("_", " ")}


@case("streaming.resumable.engine_{want}_ends_session_{phase}", Level.MUST,
      "An engine-side {kind.name} finishing a session's {phase_words} is not a segment "
      "boundary: the client's stream ends {want!r} without waiting for the input to close.",
      grounds=SESSION_ENGINE_END, needs=SESSION_NEEDS,
      params=[_segment_failure(kind, segment) for kind in (F.ABORT, F.ERROR)
              for segment in (0, 1)])
async def segment_failure(ctx: CaseContext, kind: messages.FinishReason, segment: int,
                          want: str) -> None:
    reasons = [F.LENGTH, F.LENGTH]
    reasons[segment] = kind
    rules = [by_prompt(segment_prompt(0, s), stream(segment_tokens(s), 0.01, reasons[s]))
             for s in range(2)]
    group = await ctx.start([EngineScript(rules=list(rules))])
    handle, rid = await open_first_segment(ctx, group)
    if segment == 1:
        await finish_segment(ctx, group, handle, rid, 1, 2)
        ctx.require(not handle.ended, expected="the stream open after a LENGTH segment",
                    observed=f"ended {handle.finish_reason!r} ({handle.error})")
        await ctx.driver.continue_session(handle, segment_prompt(0, 1), 2)
    ended = await ctx.wait_until(lambda: handle.ended, 3)
    ctx.require(ended and ended_as(handle, want), expected=f"the session's stream ends {want!r}",
                observed=(f"ended {handle.finish_reason!r} error={handle.error}" if ended
                          else f"still open after 3 s with {handle.tokens}"))


# ----------------------------------------------------------------- refused continuations

TARGETS = {  # target -> (what it is, a pattern the refusal must match)
    "plain_request": ("a plain (non-session) request", r"session"),
    "closed_input": ("a session whose input was closed (its segment still runs)",
                     r"clos"),
    "ended_session": ("a session that has ended", r"session|ended|finished"),
}


async def _refusal_target(ctx: CaseContext, target: str, plain: int
                          ) -> tuple[EngineGroup, StreamHandle]:
    """One engine, and a stream brought to `target`: a plain request streaming (prompt
    `plain`), a session whose input was closed while its long first segment runs, or a
    session that has ended."""
    long_first = [Emit([100], 0.01), Finish(F.LENGTH, [101], 0.8)]
    rules = [by_prompt(segment_prompt(0, 0),
                       long_first if target == "closed_input"
                       else stream(segment_tokens(0), 0.01, F.LENGTH)),
             by_prompt(prompt(plain), stream([300, 301, 302, 303], 0.2))]
    group = await ctx.start([EngineScript(rules=rules)])
    if target == "plain_request":
        handle = await ctx.driver.generate(prompt(plain), 4)
        await handle.wait_first(ctx.t(3))
    else:
        handle, _rid = await open_first_segment(ctx, group)
        await ctx.wait_until(lambda: bool(handle.tokens), 3)
        await ctx.driver.close_session(handle)
        if target == "ended_session":
            await ctx.wait_until(lambda: handle.ended, 3)
    return group, handle


@case("streaming.resumable.continuation_rejected_{target}", Level.MUST,
      "A continuation of {what} is rejected with a frontend error, and no ADD for it "
      "reaches any engine.",
      grounds=SESSION_NO_LATE_CHUNK, needs=SESSION_NEEDS,
      params=[{"target": "plain_request", "what": "a plain (non-session) request's stream"},
              {"target": "closed_input",
               "what": "a session whose input was closed (its segment still runs)"},
              {"target": "ended_session", "what": "a session that has ended"}])
async def continuation_rejected(ctx: CaseContext, target: str) -> None:
    group, handle = await _refusal_target(ctx, target, 900)
    adds_before = len(group.transcript.adds())
    try:
        await ctx.driver.continue_session(handle, segment_prompt(0, 1), 2)
        raised: BaseException | None = None
    except Exception as exc:  # noqa: BLE001 - any failure is graded below
        raised = exc
    ctx.require(isinstance(raised, FrontendError),
                expected="a frontend error rejecting the continuation",
                observed=("accepted" if raised is None
                          else f"{type(raised).__name__}: {raised}"))
    await ctx.quiet(0.2)
    late = [a.prompt_token_ids for a in group.transcript.adds()[adds_before:]]
    ctx.require(segment_prompt(0, 1) not in late,
                expected="no ADD carrying the rejected continuation",
                observed=f"ADDs after the continuation: {late}")


@case("streaming.sessions_edges.{action}_refusal_says_why_{target}", Level.SHOULD,
      "A {action} of {what} is refused with an error that says why (matching "
      "/{pattern}/i: no open session vs. input already closing), not a bare refusal.",
      grounds=REFUSAL_SAYS_WHY, needs=SESSION_NEEDS,
      params=[{"action": action, "target": target, "what": TARGETS[target][0],
               "pattern": TARGETS[target][1]}
              for action, target in (("continuation", "plain_request"),
                                     ("continuation", "closed_input"),
                                     ("continuation", "ended_session"),
                                     ("close", "plain_request"), ("close", "closed_input"))])
async def refusal_says_why(ctx: CaseContext, action: str, target: str, pattern: str) -> None:
    _group, handle = await _refusal_target(ctx, target, 910)
    try:
        if action == "continuation":
            await ctx.driver.continue_session(handle, segment_prompt(0, 1), 2)
        else:
            await ctx.driver.close_session(handle)
    except FrontendError as exc:
        ctx.require(bool(re.search(pattern, str(exc), re.I)),
                    expected=f"a refusal that says why (/{pattern}/i)",
                    observed=str(exc))
        return
    ctx.fail(expected=f"the {action} is refused", observed="it was accepted")
