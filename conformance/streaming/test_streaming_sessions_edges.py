"""A refused continuation or close of a streaming-input session should say WHY.

A client that feeds a session gets a continuation or close refused in two different
situations: the request has no open session at all (a plain request, a session that has
ended) or the session's input is already closing. Neither 0.33.0 frontend has such calls
(Python feeds a session from an async generator; vllm-rs 0.33.0 has no sessions; the Rust
tests rust-client.md §1.6 names are not in 0.33.0), so this is corewire's advice: a port
that refuses both with the same bare text leaves the client unable to tell "wrong request"
from "too late". Dimensions: the client call (continue, close), the target (plain request,
closed input, ended session).
"""

from __future__ import annotations

import re

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, engine, py, recommendation, rs
from harness.cases.helpers import prompt
from harness.cases.resumable import (
    F,
    finish_segment,
    open_first_segment,
    segment_prompt,
    session_adds,
)
from harness.frontends.api import Capability, FrontendError
from harness.results.records import Level
from mock_engines.script import Emit, EngineScript, Finish, by_prompt, stream

# Neither 0.33.0 frontend has a continue/close call that can refuse: corewire's advice.
REFUSAL_SAYS_WHY = recommendation(
    py("vllm/v1/engine/async_llm.py:642", "async for input_chunk in input_stream:"),
    rs("rust/src/llm/src/request.rs:121", "resumable: false,"),
    note="corewire's advice: python feeds a session from an async generator (async_llm.py:642), "
    "so no call exists to refuse, and rust 0.33.0 has no sessions (the rust-client tests the "
    "old source named are not in 0.33.0); a port with continue/close calls should say "
    "whether the request has no open session or its input is already closing, so a client "
    "can tell 'wrong request' from 'too late'")

# target -> (what it is, a pattern the refusal must match)
TARGETS = {
    "plain_request": ("a plain (non-session) request", r"session"),
    "closed_input": ("a session whose input was closed (its segment still runs)",
                     r"clos"),
    "ended_session": ("a session that has ended", r"session|ended|finished"),
}


def _make_refusal(action: str, target: str) -> None:
    what, pattern = TARGETS[target]

    @case(f"streaming.sessions_edges.{action}_refusal_says_why_{target}", Level.SHOULD,
          f"A {action} of {what} is refused with an error that says why (matching "
          f"/{pattern}/i: no open session vs. input already closing), not a bare refusal.",
          grounds=REFUSAL_SAYS_WHY, needs=[Capability.STREAMING_INPUT])
    async def run(ctx: CaseContext) -> None:
        long_first = [Emit([100], 0.01), Finish(F.LENGTH, [101], 0.8)]
        rules = [by_prompt(segment_prompt(0, 0),
                           long_first if target == "closed_input"
                           else stream([100, 101], 0.01, F.LENGTH)),
                 by_prompt(prompt(910), stream([300, 301, 302, 303], 0.2))]
        group = await ctx.start([EngineScript(rules=rules)])
        if target == "plain_request":
            handle = await ctx.driver.generate(prompt(910), 4)
            await handle.wait_first(ctx.t(3))
        else:
            handle, _rid = await open_first_segment(ctx, group)
            await ctx.wait_until(lambda: bool(handle.tokens), 3)
            await ctx.driver.close_session(handle)
            if target == "ended_session":
                await ctx.wait_until(lambda: handle.ended, 3)
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
        ctx.require(False, expected=f"the {action} is refused", observed="it was accepted")

    run.__name__ = run.__qualname__ = f"{action}_refusal_{target}"
    globals()[run.__name__] = run


for _action, _target in (("continuation", "plain_request"), ("continuation", "closed_input"),
                         ("continuation", "ended_session"), ("close", "plain_request"),
                         ("close", "closed_input")):
    _make_refusal(_action, _target)


# ---------------------------------------------------------------- the wave before any wave

# With one engine nobody stamps or reads a wave: the ADD keeps the struct default 0.
WAVE0 = both(
    py("vllm/v1/engine/__init__.py:143", "current_wave: int = 0"),
    py("vllm/v1/engine/core_client.py:1340", "request.client_index = self.client_index"),
    rs("rust/src/llm/src/request.rs:118", "current_wave: 0,"),
    rs("rust/src/engine-core-client/src/client.rs:661",
       "if let Some(coordinator) = self.coordinator.as_ref() {"),
    engine("vllm/v1/engine/core.py:518",
           "def add_request(self, request: Request, request_wave: int = 0):"),
    note="the single-engine clients never stamp current_wave (core_client.py:1339-1341; "
    "rust only with a coordinator, client.rs:661-662) and the non-DP engine ignores "
    "request_wave (core.py:518): 0 is an unread default, so INFO only; rust has no sessions")


@case("streaming.sessions_edges.single_engine_add_carries_wave_0", Level.INFO,
      "With one engine (no DP coordinator, so no wave was ever published), a request's ADD "
      "carries current_wave 0, the first wave, not a count from 1.",
      grounds=WAVE0, needs=[Capability.GENERATE])
async def single_engine_add_wave_0(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    handle = await ctx.driver.generate(prompt(940), 2)
    await handle.wait(ctx.t(3))
    waves = [a.current_wave for a in group.transcript.adds()]
    ctx.require(waves == [0], expected="one ADD with current_wave 0",
                observed=f"current_wave of the ADDs: {waves}")


@case("streaming.sessions_edges.single_engine_session_adds_carry_wave_0", Level.INFO,
      "With one engine (no DP coordinator), a session's first ADD, its continuation and its "
      "closing ADD all carry current_wave 0.",
      grounds=WAVE0, needs=[Capability.STREAMING_INPUT])
async def single_engine_session_wave_0(ctx: CaseContext) -> None:
    rules = [by_prompt(segment_prompt(0, s), stream([100 + s], 0.01, F.LENGTH))
             for s in range(2)]
    group = await ctx.start([EngineScript(rules=rules)])
    handle, rid = await open_first_segment(ctx, group)
    await finish_segment(ctx, group, handle, rid, 1, 1)
    await ctx.driver.continue_session(handle, segment_prompt(0, 1), 2)
    await finish_segment(ctx, group, handle, rid, 2, 2)
    await ctx.driver.close_session(handle)
    await ctx.wait_until(lambda: len(session_adds(group, rid)) >= 3, 3)
    waves = [a.request.current_wave for a in session_adds(group, rid)]
    ctx.require(len(waves) >= 3 and set(waves) == {0},
                expected="the session's three ADDs with current_wave 0",
                observed=f"current_wave of the session's ADDs: {waves}")
