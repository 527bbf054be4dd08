"""Streaming-input sessions (vLLM's resumable requests) as the engines see them.

A session is one request id fed by several ADDs: the first and every continuation carry
`resumable=True`, a final non-resumable ADD closes the input. Each segment ends with a
finish reason that must not end the client's stream; only the close (or an abort or error)
does. vllm-rs 0.33.0 exposes no streaming-input surface over HTTP (`session_id` /
X-Session-ID only fills EngineCoreRequest.session_id), so these cases are UNSUPPORTED there.
"""

from __future__ import annotations

from harness.case_context import CaseContext
from harness.frontends.driver import Capability
from harness.sessionkit import (
    SOURCE,
    F,
    finish_segment,
    open_first_segment,
    scripts,
    segment_prompt,
    segment_tokens,
    session_adds,
)
from harness.verdicts import Level, case
from harness.wire import messages as m
from mock_engines.script import Emit, EngineScript, Finish, by_prompt

NEEDS = [Capability.STREAMING_INPUT]


def _make_same_id(engines: int) -> None:
    @case(f"streaming.resumable.continuation_same_id_{engines}_engines", Level.MUST,
          f"With {engines} engine(s), a session's continuation and its final ADD carry the "
          "first ADD's request id and go to the engine that holds the session; the first "
          "and the continuation are resumable, the final one is not.",
          source=f"{SOURCE}; core_client.py:1760-1762 (session affinity)", needs=NEEDS)
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
          source=SOURCE, needs=NEEDS)
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
      source=f"{SOURCE}; output_processor.py:699-711 (final request while a chunk runs)",
      needs=NEEDS)
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
