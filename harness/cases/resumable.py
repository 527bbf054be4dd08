"""Helpers for streaming-input (resumable) session cases: scripts and wire lookups.

A session is one engine-side request id fed by several ADDs. Cases open it with a
distinct first prompt, find its id through the transcript, and then follow every ADD and
ABORT that names that id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.cases.context import CaseContext
from harness.cases.helpers import prompt
from harness.frontends.api import Sampling, StreamHandle
from harness.protocol.wire import messages as m
from harness.protocol.wire.codec import AddRequest
from mock_engines.group import EngineGroup
from mock_engines.script import Emit, EngineScript, Finish, Rule, Step, by_prompt, stream

F = m.FinishReason
SOURCE = ("vllm 0.33.0 async_llm.py:589-696 (streaming input: resumable ADDs with one id, "
          "a final non-resumable ADD); output_processor.py:844-876 (a segment finish does "
          "not end the stream); rust-client.md §1.6 (resumable sessions survive segment "
          "STOPs)")
ABORT_SOURCE = ("vllm 0.33.0 core_client.py:1751-1758, :1887-1895 (ids of streaming "
                "sessions are aborted at every engine)")


@dataclass
class SessionAdd:
    """One ADD that named the session's id, where it went and what it said."""

    t: float
    rank: int
    request: m.EngineCoreRequest


def segment_prompt(session: int, segment: int) -> list[int]:
    """A distinct prompt per (session, segment)."""
    return prompt(100 * segment + session)


def segment_tokens(segment: int, count: int = 2) -> list[int]:
    """The tokens the mock engines answer segment `segment` with (distinct per segment)."""
    return [100 + 10 * segment + i for i in range(count)]


def session_rules(sessions: int, segments: int, *, reason: m.FinishReason = F.LENGTH,
                  held: Sequence[int] = (), interval: float = 0.01) -> list[Rule]:
    """Every (session, segment) prompt answers its segment tokens and finishes with
    `reason`; segments listed in `held` send their tokens and then stay running."""
    rules: list[Rule] = []
    for s in range(sessions):
        for seg in range(segments):
            tokens = segment_tokens(seg)
            steps: list[Step] = (stream(tokens, interval, reason) if seg not in held
                                 else [Emit(tokens, interval)])
            rules.append(by_prompt(segment_prompt(s, seg), steps))
    return rules


def scripts(engines: int, sessions: int, segments: int, *,
            reason: m.FinishReason = F.LENGTH, held: Sequence[int] = ()
            ) -> list[EngineScript]:
    """The same session rules on every engine (the frontend picks the owner)."""
    rules = session_rules(sessions, segments, reason=reason, held=held)
    return [EngineScript(rules=list(rules)) for _ in range(engines)]


def session_adds(group: EngineGroup, request_id: str) -> list[SessionAdd]:
    """Every ADD naming `request_id`, in time order, with the rank that got it."""
    return [SessionAdd(r.t, r.rank, r.message.request)
            for r in group.transcript.select(direction="in", kind=AddRequest)
            if r.message.request.request_id == request_id]


def session_id(group: EngineGroup, first_prompt: Sequence[int]) -> str | None:
    want = list(first_prompt)
    for req in group.transcript.adds():
        if req.prompt_token_ids == want:
            return req.request_id
    return None


def segment_finished(group: EngineGroup, request_id: str, count: int) -> bool:
    """The engines have sent `count` finished outputs for `request_id`."""
    seen = 0
    for r in group.transcript.select(direction="out", channel="output",
                                     kind=m.EngineCoreOutputs):
        seen += sum(1 for o in r.message.outputs
                    if o.request_id == request_id and o.finish_reason is not None)
    return seen >= count


async def open_first_segment(ctx: CaseContext, group: EngineGroup, session: int = 0,
                             *, max_tokens: int = 2, data_parallel_rank: int | None = None,
                             sampling: Sampling | None = None) -> tuple[StreamHandle, str]:
    """Open a session with its first segment; returns the handle and the engine-side id."""
    first = segment_prompt(session, 0)
    handle = await ctx.driver.open_session(first, max_tokens,
                                           data_parallel_rank=data_parallel_rank,
                                           sampling=sampling)
    await ctx.wait_until(lambda: session_id(group, first) is not None, 3)
    rid = session_id(group, first)
    ctx.require(rid is not None, expected="the session's first ADD at an engine",
                observed=f"{len(group.transcript.adds())} ADDs, none with its prompt")
    assert rid is not None
    return handle, rid


async def finish_segment(ctx: CaseContext, group: EngineGroup, handle: StreamHandle,
                         rid: str, count: int, tokens: int) -> None:
    """Wait until segment number `count` has finished at the engine and the client holds
    `tokens` tokens of the session."""
    await ctx.wait_until(lambda: segment_finished(group, rid, count)
                         and len(handle.tokens) >= tokens, 3)
    ctx.require(segment_finished(group, rid, count),
                expected=f"{count} segment finish(es) sent by the engine",
                observed="fewer (harness fault or the frontend never sent the segment)")


__all__ = ["ABORT_SOURCE", "F", "Finish", "SOURCE", "SessionAdd", "finish_segment",
           "open_first_segment", "scripts", "segment_finished", "segment_prompt",
           "segment_tokens", "session_adds", "session_id", "session_rules"]
