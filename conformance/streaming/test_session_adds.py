"""Streaming-input sessions (vLLM's resumable requests): what each of a session's ADDs
carries and where it goes.

A session is one request id fed by several ADDs: the first and every continuation carry
`resumable=True`, a final non-resumable ADD closes the input. The engine finds the session
by that id at the engine that holds it, and takes each continuation's sampling and
max_tokens for the rest of the session: a continuation under another id, at another
engine, with default sampling or another length, or overtaking the first ADD, opens the
wrong request or generates the wrong tokens. vllm-rs 0.33.0 exposes no streaming-input
surface over HTTP (`session_id` / X-Session-ID only fills EngineCoreRequest.session_id), so
these cases are UNSUPPORTED there. Also here: the wave a single engine's ADDs carry when no
coordinator ever published one.
"""

from __future__ import annotations

from conformance.streaming.helpers import (
    ASKED,
    GEN,
    NO_RS,
    RS_NEVER_RESUMABLE,
    SESSION_NEEDS,
    F,
    asked_values,
    sampling_values,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineGroup,
    EngineScript,
    Level,
    Sampling,
    both,
    by_prompt,
    case,
    engine,
    messages,
    only,
    prompt,
    py,
    rs,
    stream,
)
from harness.cases.resumable import (
    finish_segment,
    open_first_segment,
    scripts,
    segment_prompt,
    segment_tokens,
    session_adds,
    session_id,
)

_PY_CHUNK_ID = py("vllm/v1/engine/async_llm.py:657", "request_id=internal_req_id,")
_PY_RESUMABLE = py("vllm/v1/engine/async_llm.py:660", "resumable=True,")
_PY_SESSION_PARAMS = py("vllm/v1/engine/async_llm.py:654", "sp = sampling_params")
_PY_FINAL_ADD = py("vllm/v1/engine/async_llm.py:688",
                   "await self._add_request(final_req, None, None, 0, queue)")
_PY_TO_HOLDER = py("vllm/v1/engine/core_client.py:1758",
                   "if (engine := self.reqs_in_flight.get(request.request_id)) is not None:")
_ENGINE_NEW_SESSION = engine("vllm/v1/core/sched/scheduler.py:2946", "if request.resumable:")
_ENGINE_MAX_TOKENS = engine("vllm/v1/core/sched/scheduler.py:1914",
                            "session.max_tokens = update.max_tokens")
_ENGINE_SAMPLING = engine("vllm/v1/core/sched/scheduler.py:1913",
                          "session.sampling_params = update.sampling_params")
SAME_ID = only(
    _PY_CHUNK_ID, _PY_RESUMABLE, _PY_FINAL_ADD, _PY_TO_HOLDER, RS_NEVER_RESUMABLE,
    engine("vllm/v1/core/sched/scheduler.py:2932",
           "existing = self.requests.get(request.request_id)"),
    engine("vllm/v1/core/sched/scheduler.py:2944",
           "self.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)"),
    note=NO_RS + "the engine finds the session by its request id (scheduler.py:2932); a "
    "continuation under another id or at another engine opens a second resumable request "
    "(scheduler.py:2946-2947), and without the non-resumable final ADD (scheduler.py:2944) "
    "the session waits for input forever (engine left in a wrong state)")
SESSION_MAX_TOKENS = only(
    _PY_SESSION_PARAMS, _PY_CHUNK_ID, _PY_RESUMABLE, RS_NEVER_RESUMABLE, _ENGINE_MAX_TOKENS,
    note=NO_RS + "a continuation with another max_tokens sets the session's length "
    "engine-side (scheduler.py:1914), so the engine generates a different number of "
    "tokens than the client asked for (corrupted output)")
# A continuation's own sampling (here its max_tokens) replaces the session's for its ADD.
SESSION_OWN_MAX_TOKENS = only(
    py("vllm/v1/engine/async_llm.py:650", "sp = input_chunk.sampling_params"),
    _PY_CHUNK_ID, RS_NEVER_RESUMABLE, _ENGINE_MAX_TOKENS,
    note=NO_RS + "a continuation asking another max_tokens than the first segment sets the "
    "session's length engine-side (scheduler.py:1914): a continuation sent with the first "
    "segment's value generates a different number of tokens than the client asked for")
SESSION_RANK = only(
    py("vllm/v1/engine/async_llm.py:613", "data_parallel_rank=data_parallel_rank,"),
    _PY_TO_HOLDER,
    py("vllm/v1/engine/core_client.py:1763",
       "if (eng_index := request.data_parallel_rank) is None and ("),
    rs("rust/src/engine-core-client/src/client/state.rs:202",
       "if let Some(rank) = data_parallel_rank {"),
    RS_NEVER_RESUMABLE, _ENGINE_NEW_SESSION,
    note=NO_RS + "(rust routes a plain ADD to its data_parallel_rank, state.rs:202); a "
    "continuation sent to another engine opens a second resumable request there "
    "(scheduler.py:2946-2947) while the session on its own engine waits for input forever "
    "(engine left in a wrong state)")
SESSION_MATCHES_FIRST = only(
    _PY_SESSION_PARAMS, _PY_CHUNK_ID,
    py("vllm/v1/engine/async_llm.py:663", "req.external_req_id = request_id"),
    py("vllm/v1/engine/core_client.py:1611", "request.client_index = self.client_index"),
    RS_NEVER_RESUMABLE, _ENGINE_SAMPLING,
    note=NO_RS + "a continuation's sampling replaces the session's engine-side "
    "(scheduler.py:1913), so one built with default sampling (temperature 1.0, no EOS id) "
    "changes how the rest of the session is generated (corrupted output)")
# A session's continuations carry the first segment's sampling (Python reuses the call's
# SamplingParams for every chunk; the engine replaces the session's with each one's).
SESSION_SAMPLING = only(
    _PY_SESSION_PARAMS,
    py("vllm/v1/engine/async_llm.py:659", "params=sp,"),
    RS_NEVER_RESUMABLE, _ENGINE_SAMPLING,
    note=NO_RS + "a continuation's sampling replaces "
    "the session's engine-side (scheduler.py:1913), so a continuation built with other "
    "values samples the rest of the session differently (corrupted output)")
SESSION_NEW_WAVE = both(
    py("vllm/v1/engine/core_client.py:1610", "request.current_wave = self.current_wave"),
    rs("rust/src/engine-core-client/src/client.rs:662",
       "req.current_wave = coordinator.snapshot().current_wave;"),
    engine("vllm/v1/engine/core.py:2375", "if request_wave > self.current_wave:"),
    note="both stamp every ADD with the coordinator's newest wave (python's continuations "
    "go through the same add_request_async; rust has no continuations in 0.33.0)")
# A session's ADDs leave in the order the client made them, even with no pause between the
# calls: an engine takes an ADD with an id it does not hold as a new request, so a
# continuation that overtook the first ADD would open the wrong session.
SESSION_ADD_ORDER = only(
    py("vllm/v1/engine/async_llm.py:642", "async for input_chunk in input_stream:"),
    py("vllm/v1/engine/async_llm.py:671",
       "await self._add_request(req, prompt_text, None, 0, queue)"),
    _PY_FINAL_ADD, RS_NEVER_RESUMABLE, _ENGINE_NEW_SESSION,
    note=NO_RS + "python sends a session's chunks from one task, awaiting each ADD in turn; "
    "an ADD reordered ahead of the session's first opens a session under the wrong prompt")
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


async def _continued(ctx: CaseContext, engines: int, *, max_tokens: int = 2,
                     continued: int = 2, data_parallel_rank: int | None = None,
                     sampling: Sampling | None = None) -> tuple[EngineGroup, str]:
    """Start `engines` engines, open a session (max_tokens, rank, sampling as given), let
    its first segment finish, continue it (max_tokens `continued`) and wait for the
    continuation's ADD: the group and the session's engine-side id."""
    group = await ctx.start(scripts(engines, 1, 2))
    handle, rid = await open_first_segment(ctx, group, max_tokens=max_tokens,
                                           data_parallel_rank=data_parallel_rank,
                                           sampling=sampling)
    await finish_segment(ctx, group, handle, rid, 1, 2)
    await ctx.driver.continue_session(handle, segment_prompt(0, 1), continued)
    await ctx.wait_until(lambda: len(session_adds(group, rid)) >= 2, 3)
    return group, rid


# ----------------------------------------------------------------- one id, one engine, in order


@case("streaming.resumable.continuation_same_id_{engines}_engines", Level.MUST,
      "With {engines} engine(s), a session's continuation and its final ADD carry the "
      "first ADD's request id and go to the engine that holds the session; the first "
      "and the continuation are resumable, the final one is not.",
      grounds=SAME_ID, needs=SESSION_NEEDS, params=[{"engines": n} for n in (1, 2, 3)])
async def continuation_same_id(ctx: CaseContext, engines: int) -> None:
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


@case("streaming.resumable.explicit_rank_{rank}_of_{engines}", Level.MUST,
      "With {engines} engines, a session opened with data_parallel_rank={rank} sends "
      "its first ADD and its continuation to engine {rank}.",
      grounds=SESSION_RANK, needs=SESSION_NEEDS,
      params=[{"engines": engines, "rank": rank}
              for engines, rank in ((2, 1), (3, 2), (3, 1))])
async def session_rank(ctx: CaseContext, engines: int, rank: int) -> None:
    group, rid = await _continued(ctx, engines, data_parallel_rank=rank)
    ranks = [a.rank for a in session_adds(group, rid)]
    ctx.require(len(ranks) >= 2 and set(ranks) == {rank},
                expected=f"the first ADD and the continuation at engine {rank}",
                observed=f"ADDs of the session at engines {ranks}")


@case("streaming.resumable.continuation_zero_delay_{engines}_engines", Level.MUST,
      "With {engines} engine(s), open_session, then continue_session and close_session "
      "each the instant the previous call returns: the engine holding the session gets "
      "the first segment (resumable), the continuation (resumable) and the close (not "
      "resumable) in that order under one id, and the stream ends after the second "
      "segment's tokens.",
      grounds=SESSION_ADD_ORDER, needs=SESSION_NEEDS, params=[{"engines": n} for n in (1, 2)])
async def continuation_zero_delay(ctx: CaseContext, engines: int) -> None:
    group = await ctx.start(scripts(engines, 1, 2))
    handle = await ctx.driver.open_session(segment_prompt(0, 0), 2)
    await ctx.driver.continue_session(handle, segment_prompt(0, 1), 2)
    await ctx.driver.close_session(handle)
    await ctx.wait_until(lambda: handle.ended, 3)
    rid = session_id(group, segment_prompt(0, 0))
    adds = session_adds(group, rid) if rid is not None else []
    seen = [(a.rank, (a.request.prompt_token_ids or [])[:1], a.request.resumable)
            for a in adds]
    owner = adds[0].rank if adds else None
    want = [(owner, segment_prompt(0, 0)[:1], True), (owner, segment_prompt(0, 1)[:1], True)]
    ctx.require(seen[:2] == want and len(seen) == 3 and seen[2][0] == owner
                and seen[2][2] is False,
                expected="first (resumable), continuation (resumable), close (not "
                         "resumable), in that order, at one engine",
                observed=f"(rank, first prompt id, resumable): {seen}")
    ctx.require(handle.finish_reason == "length" and handle.tokens[-2:] == segment_tokens(1),
                expected=f"the stream ends 'length' after {segment_tokens(1)}",
                observed=f"{handle.finish_reason} error={handle.error} "
                         f"tokens={handle.tokens}")


# ----------------------------------------------------------------- sampling and length


async def _resumable_max_tokens(ctx: CaseContext, engines: int, first: int,
                                continued: int) -> list[int | None]:
    """Open a session with max_tokens `first`, continue it with `continued`: the
    max_tokens of its resumable ADDs."""
    group, rid = await _continued(ctx, engines, max_tokens=first, continued=continued)
    resumable = [a for a in session_adds(group, rid) if a.request.resumable]
    return [a.request.sampling_params.max_tokens if a.request.sampling_params else None
            for a in resumable]


@case("streaming.resumable.max_tokens_{max_tokens}_{engines}_engines", Level.MUST,
      "With {engines} engine(s), a session opened and continued with max_tokens="
      "{max_tokens} sends that max_tokens on its first ADD and on its continuation "
      "(the engine must not fall back to a default length).",
      grounds=SESSION_MAX_TOKENS, needs=SESSION_NEEDS,
      params=[{"engines": n, "max_tokens": k} for n in (1, 2) for k in (3, 7)])
async def session_max_tokens(ctx: CaseContext, engines: int, max_tokens: int) -> None:
    seen = await _resumable_max_tokens(ctx, engines, max_tokens, max_tokens)
    ctx.require(seen == [max_tokens, max_tokens],
                expected=f"max_tokens {max_tokens} on the first ADD and the "
                         "continuation", observed=f"max_tokens of resumable ADDs: {seen}")


@case("streaming.resumable.continuation_own_max_tokens_{engines}_engines", Level.MUST,
      "With {engines} engine(s), a session opened with max_tokens=3 and continued with "
      "max_tokens=7 sends 3 on its first ADD and 7 on its continuation: each segment "
      "carries its own, not the first segment's.",
      grounds=SESSION_OWN_MAX_TOKENS, needs=SESSION_NEEDS,
      params=[{"engines": n} for n in (1, 2)])
async def continuation_own_max_tokens(ctx: CaseContext, engines: int) -> None:
    seen = await _resumable_max_tokens(ctx, engines, 3, 7)
    ctx.require(seen == [3, 7], expected="max_tokens 3 on the first ADD, 7 on the "
                                         "continuation",
                observed=f"max_tokens of resumable ADDs: {seen}")


@case("streaming.resumable.continuation_matches_first_{engines}_engines", Level.MUST,
      "With {engines} engine(s), a session's continuation ADD carries the first ADD's "
      "sampling (temperature, EOS id, stop token ids) and its external request id and "
      "client index: the engine continues the same request, not a default one.",
      grounds=SESSION_MATCHES_FIRST, needs=SESSION_NEEDS,
      params=[{"engines": n} for n in (1, 2)])
async def continuation_matches_first(ctx: CaseContext, engines: int) -> None:
    group, rid = await _continued(ctx, engines)
    adds = [a.request for a in session_adds(group, rid) if a.request.resumable]
    ctx.require(len(adds) >= 2, expected="the first ADD and the continuation",
                observed=f"{len(adds)} resumable ADDs")
    first, cont = adds[0], adds[1]

    def shape(r: messages.EngineCoreRequest) -> dict[str, object]:
        sp = r.sampling_params
        return {"temperature": sp.temperature if sp else None,
                "eos_token_id": sp._eos_token_id if sp else None,
                "all_stop_token_ids": sorted(sp._all_stop_token_ids) if sp else None,
                "external_req_id": r.external_req_id, "client_index": r.client_index}

    ctx.require(first.external_req_id is not None,
                expected="the first ADD names its external request id",
                observed=f"external_req_id {first.external_req_id!r}")
    ctx.require(shape(cont) == shape(first),
                expected=f"the continuation like the first ADD: {shape(first)}",
                observed=f"continuation: {shape(cont)}")


@case("streaming.resumable.continuation_keeps_client_sampling_{engines}_engines",
      Level.MUST,
      "With {engines} engine(s), a session opened with non-greedy sampling "
      "(temperature 0.75, top_p 0.875, top_k 40, min_p 0.0625, seed 1234) sends it on "
      "the first ADD and on the continuation, value for value.",
      grounds=SESSION_SAMPLING, needs=[*SESSION_NEEDS, Capability.SAMPLING],
      params=[{"engines": n} for n in (1, 2)])
async def continuation_keeps_client_sampling(ctx: CaseContext, engines: int) -> None:
    asked = ASKED[0]
    group, rid = await _continued(ctx, engines, sampling=asked)
    adds = [a.request for a in session_adds(group, rid) if a.request.resumable]
    want = asked_values(asked)
    seen = [sampling_values(a.sampling_params) if a.sampling_params else None
            for a in adds[:2]]
    ctx.require(len(seen) == 2 and all(s == want for s in seen),
                expected=f"the first ADD and the continuation with {want}",
                observed=f"{len(adds)} resumable ADDs with {seen}")


# ----------------------------------------------------------------- waves


@case("streaming.resumable.continuation_carries_new_wave", Level.MUST,
      "With 2 engines, a session continuation sent after the coordinator published "
      "current_wave=4 carries current_wave 4 (continuations are stamped like any ADD).",
      grounds=SESSION_NEW_WAVE, needs=SESSION_NEEDS)
async def continuation_carries_new_wave(ctx: CaseContext) -> None:
    group = await ctx.start(scripts(2, 1, 2))
    coordinator = group.coordinator
    ctx.require(coordinator is not None, expected="a DP group with a mock coordinator",
                observed="none (harness fault)")
    assert coordinator is not None
    handle, rid = await open_first_segment(ctx, group)
    await finish_segment(ctx, group, handle, rid, 1, 2)
    coordinator.wave = 4
    published = await ctx.wait_until(
        lambda: any(r.message is not None and r.message.current_wave == 4
                    for r in coordinator.transcript.select(direction="out")), 2)
    ctx.require(published, expected="the mock coordinator publishes wave 4",
                observed="no publication (harness fault)")
    await ctx.quiet(0.3)  # a few publications, every 0.1 s
    await ctx.driver.continue_session(handle, segment_prompt(0, 1), 2)
    await ctx.wait_until(lambda: len(session_adds(group, rid)) >= 2, 3)
    waves = [a.request.current_wave for a in session_adds(group, rid)]
    ctx.require(len(waves) >= 2 and waves[1] == 4,
                expected="the continuation ADD carries current_wave 4",
                observed=f"current_wave of the session's ADDs: {waves}")


@case("streaming.sessions_edges.single_engine_add_carries_wave_0", Level.INFO,
      "With one engine (no DP coordinator, so no wave was ever published), a request's ADD "
      "carries current_wave 0, the first wave, not a count from 1.",
      grounds=WAVE0, needs=GEN)
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
      grounds=WAVE0, needs=SESSION_NEEDS)
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
