"""Streaming-input sessions (vLLM's resumable requests) as the engines see them.

A session is one request id fed by several ADDs: the first and every continuation carry
`resumable=True`, a final non-resumable ADD closes the input. Each segment ends with a
finish reason that must not end the client's stream; only the close (or an abort or error)
does. vllm-rs 0.33.0 exposes no streaming-input surface over HTTP (`session_id` /
X-Session-ID only fills EngineCoreRequest.session_id), so these cases are UNSUPPORTED there.
"""

from __future__ import annotations

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import engine, only, py, rs
from harness.cases.resumable import (
    F,
    finish_segment,
    open_first_segment,
    scripts,
    segment_prompt,
    segment_tokens,
    session_adds,
)
from harness.frontends.api import Capability
from harness.protocol.wire import messages as m
from harness.results.records import Level
from mock_engines.script import Emit, EngineScript, Finish, by_prompt

NEEDS = [Capability.STREAMING_INPUT]
# vllm-rs 0.33.0 has no streaming-input sessions: only the Python frontend holds these rules.
_RS_NO_SESSIONS = rs("rust/src/llm/src/request.rs:121", "resumable: false,")
_NO_RS = ("rust lacks streaming-input sessions in 0.33.0 (every ADD resumable=false, "
          "rust/src/llm/src/request.rs:121), python holds it; ")
SAME_ID = only(
    py("vllm/v1/engine/async_llm.py:657", "request_id=internal_req_id,"),
    py("vllm/v1/engine/async_llm.py:660", "resumable=True,"),
    py("vllm/v1/engine/async_llm.py:688",
       "await self._add_request(final_req, None, None, 0, queue)"),
    py("vllm/v1/engine/core_client.py:1758",
       "if (engine := self.reqs_in_flight.get(request.request_id)) is not None:"),
    _RS_NO_SESSIONS,
    engine("vllm/v1/core/sched/scheduler.py:2932",
           "existing = self.requests.get(request.request_id)"),
    engine("vllm/v1/core/sched/scheduler.py:2944",
           "self.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)"),
    note=_NO_RS + "the engine finds the session by its request id (scheduler.py:2932); a "
    "continuation under another id or at another engine opens a second resumable request "
    "(scheduler.py:2946-2947), and without the non-resumable final ADD (scheduler.py:2944) "
    "the session waits for input forever (engine left in a wrong state)")
SEGMENT_BOUNDARY = only(
    py("vllm/v1/engine/output_processor.py:844",
       "streaming_chunk_boundary = req_state.streaming_input and ("),
    py("vllm/v1/engine/output_processor.py:859", "request_output.finished = False"),
    py("vllm/v1/engine/output_processor.py:870", "if streaming_chunk_boundary:"),
    py("vllm/v1/engine/output_processor.py:711", "req_state.streaming_input = False"),
    _RS_NO_SESSIONS,
    engine("vllm/v1/core/sched/scheduler.py:2719", "if not request.resumable:"),
    note=_NO_RS + "the engine keeps a resumable request after its segment stops "
    "(scheduler.py:2718-2720); a frontend that ends the stream there, or ABORTs it, loses "
    "the continuation's tokens (lost data)")
CLOSE_WHILE_RUNNING = only(
    py("vllm/v1/engine/async_llm.py:688",
       "await self._add_request(final_req, None, None, 0, queue)"),
    py("vllm/v1/engine/output_processor.py:711", "req_state.streaming_input = False"),
    py("vllm/v1/engine/output_processor.py:845",
       "finish_reason not in (FinishReason.ABORT, FinishReason.ERROR)"),
    _RS_NO_SESSIONS,
    engine("vllm/v1/core/sched/scheduler.py:2938", "existing.streaming_queue.append(update)"),
    note=_NO_RS + "the engine queues the close behind the running segment "
    "(scheduler.py:2938) and finishes it normally; ending the stream or sending an ABORT at "
    "the close loses the segment's last tokens (lost data)")


def _make_same_id(engines: int) -> None:
    @case(f"streaming.resumable.continuation_same_id_{engines}_engines", Level.MUST,
          f"With {engines} engine(s), a session's continuation and its final ADD carry the "
          "first ADD's request id and go to the engine that holds the session; the first "
          "and the continuation are resumable, the final one is not.",
          grounds=SAME_ID, needs=NEEDS)
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start(scripts(engines, 1, 2))
        handle, rid = await open_first_segment(ctx, group)
        await finish_segment(ctx, group, handle, rid, 1, 2)
        await ctx.driver.continue_session(handle, segment_prompt(0, 1), 2)
        await finish_segment(ctx, group, handle, rid, 2, 4)
        await ctx.driver.close_session(handle)
        await ctx.wait_until(lambda: handle.ended and len(session_adds(group, rid)) >= 3, 3)
        adds = session_adds(group, rid)
        shape = [(a.rank, a.request.resumable, a.request.prompt_token_ids) for a in adds]
        ctx.require(len(adds) == 3, expected="3 ADDs with the session's id (first, "
                    "continuation, final)", observed=f"(rank, resumable, prompt): {shape}")
        ctx.require(len({a.rank for a in adds}) == 1,
                    expected=f"every ADD of the session at engine {adds[0].rank}",
                    observed=f"(rank, resumable, prompt): {shape}")
        ctx.require([a.request.resumable for a in adds] == [True, True, False],
                    expected="resumable = [True, True, False]",
                    observed=f"(rank, resumable, prompt): {shape}")
        ctx.require(adds[1].request.prompt_token_ids == segment_prompt(0, 1),
                    expected=f"the continuation carries its prompt {segment_prompt(0, 1)}",
                    observed=f"(rank, resumable, prompt): {shape}")

    run.__name__ = run.__qualname__ = f"continuation_same_id_{engines}"
    globals()[run.__name__] = run


for _n in (1, 2, 3):
    _make_same_id(_n)


def _make_keeps_stream(reason: m.FinishReason) -> None:
    name = str(reason)

    @case(f"streaming.resumable.segment_{name}_keeps_stream", Level.MUST,
          f"A segment that finishes with {name!r} does not end the session's stream and "
          "draws no ABORT; the continuation's tokens arrive on the same stream, and closing "
          "the input ends it with the last segment's finish reason, without an ABORT.",
          grounds=SEGMENT_BOUNDARY, needs=NEEDS)
    async def run(ctx: CaseContext) -> None:
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

    run.__name__ = run.__qualname__ = f"segment_{name}_keeps_stream"
    globals()[run.__name__] = run


for _reason in (F.LENGTH, F.STOP):
    _make_keeps_stream(_reason)


@case("streaming.resumable.close_while_segment_runs", Level.MUST,
      "Closing the input while a segment still runs sends the final ADD at once but keeps "
      "the stream open until that segment finishes: its last tokens arrive and the stream "
      "ends with its finish reason, without an ABORT.",
      grounds=CLOSE_WHILE_RUNNING, needs=NEEDS)
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
