"""Stop strings at the edges of the text: where a match starts, how much text is held back.

A frontend matching stop strings holds back the last max(len(stop)) - 1 characters of the
text (vLLM's stop_buffer_length) so no part of a match is ever released, truncates at the
EARLIEST occurrence in the new text, and releases everything it held when the engine
finishes the request without a match. Port authors get the edges wrong: a match starting
at character 0 (a stop string that includes the leading space), a match completed by a
single character of the next token, two occurrences inside one token, a match spanning the
tokens of the engine's final output, and the tail of a stream that never matched.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, engine, only, py, rs
from harness.cases.helpers import prompt, request_for
from harness.cases.resumable import (
    finish_segment,
    open_first_segment,
    scripts,
    segment_prompt,
    segment_tokens,
    session_adds,
    session_id,
)
from harness.frontends.api import Capability, FrontendError
from harness.protocol.wire import messages as m
from harness.results.records import Level
from mock_engines.script import Emit, EngineScript, Finish, Step, by_prompt, stream

F = m.FinishReason
# Stop strings: the earliest match in the new text, text and tokens cut at it, the held-back
# tail released at the finish, and one ABORT to the owner unless the engine had finished.
STOP_EDGES = both(
    py("vllm/v1/engine/detokenizer.py:351",
       "stop_index = output_text.find(stop_str, 1 - new_char_count - stop_string_len)"),
    py("vllm/v1/engine/detokenizer.py:357", "if end < best_end:"),
    py("vllm/v1/engine/detokenizer.py:151",
       "del self.token_ids[first_new_token_index + num_kept :]"),
    py("vllm/v1/engine/detokenizer.py:165",
       "buffer_length = 0 if finished else self.stop_buffer_length"),
    py("vllm/v1/engine/output_processor.py:878",
       "if req_state.streaming_input or not engine_core_output.finished:"),
    py("vllm/v1/engine/async_llm.py:920", "await engine_core.abort_requests_async("),
    rs("rust/src/text/src/output/decoded.rs:198",
       "matches_stop_string(stops, decoder.output(), new_bytes)"),
    rs("rust/src/text/src/output/decoded.rs:371", ".min_by_key(|&(_, _, end)| end)"),
    rs("rust/src/text/src/output/decoded.rs:206", "truncate_tokens_to = Some(tok_idx + 1);"),
    rs("rust/src/text/src/output/decoded.rs:274",
       "let (last_chunk, full_decoded) = decoder.flush(truncate_output_to)?;"),
    rs("rust/src/text/src/output/decoded.rs:302",
       "AbortCause::StopStringMatched.drop_as(raw_stream);"),
    rs("rust/src/engine-core-client/src/client/stream.rs:224", "if self.is_terminated() {"),
    rs("rust/src/engine-core-client/src/client/imp.rs:406",
       "by_engine.entry(engine_id).or_default().push(request_id);"))
# Mid-stream, exactly max(len(stop)) - 1 characters are held back.
HOLD_BACK = both(
    py("vllm/v1/engine/detokenizer.py:88",
       "self.stop_buffer_length = max(len(s) for s in self.stop) - 1"),
    py("vllm/v1/engine/detokenizer.py:171", "length = len(self.output_text) - buffer_length"),
    rs("rust/src/text/src/output/decoded.rs:152",
       ".and_then(|stops| stops.iter().map(|ss| ss.len()).max())"),
    rs("rust/src/text/src/output/decoded.rs:154", ".saturating_sub(1),"),
    rs("rust/src/tokenizer/src/incremental.rs:232",
       "let cutoff = self.decoded.len().saturating_sub(self.min_bytes_to_buffer);"))
STOP_NEEDS = [Capability.GENERATE, Capability.STOP_STRINGS]


@dataclass(frozen=True)
class EdgeShape:
    """A stop string against a scripted chunking, with the exact text the client must see."""

    name: str
    text: str
    chunks: tuple[tuple[int, ...], ...]
    final: bool  # the last chunk is the engine's final output (LENGTH)
    stop: str
    want_text: str  # the exact text (leading space included)
    want_tokens: tuple[int, ...]
    want_reason: str


EDGE_SHAPES = [
    EdgeShape("at_text_start_one_token", "a stop string that starts at the text's first "
              "character (it includes the leading space) and is completed by the first token",
              ((100,), (101,), (102,)), False, " t100", "", (100,), "stop"),
    EdgeShape("at_text_start_two_tokens", "a stop string that starts at the text's first "
              "character and is completed by the second token", ((100,), (101,), (102,)),
              False, " t100 t1", "", (100, 101), "stop"),
    EdgeShape("completed_by_one_char", "a stop string completed by the first character of "
              "the next token (' ' of ' t101')", ((100,), (101,), (102,)), False, "t100 ",
              " ", (100, 101), "stop"),
    EdgeShape("twice_in_one_token", "a stop string that occurs twice inside one token "
              "(truncated at the earliest)", ((100,), (101,)), False, "0", " t1", (100,),
              "stop"),
    EdgeShape("spans_final_chunk", "a stop string spanning two tokens of the engine's "
              "final multi-token output", ((100,), (101, 102)), True, "t101 t102", " t100 ",
              (100, 101, 102), "stop"),
    EdgeShape("never_matched_tail", "a stop string whose prefix ends the stream but never "
              "completes: the held-back tail is released at the finish",
              ((100,), (101,), (102,)), True, "t102 t9", " t100 t101 t102", (100, 101, 102),
              "length"),
    EdgeShape("never_matched_final_chunk", "a stop string never matched, the engine's final "
              "output carrying several tokens", ((100,), (101, 102, 103)), True, "t103 t9",
              " t100 t101 t102 t103", (100, 101, 102, 103), "length"),
]


def _steps(shape: EdgeShape) -> list[Step]:
    steps: list[Step] = [Emit(list(c), 0.03) for c in shape.chunks]
    if shape.final:
        steps[-1] = Finish(F.LENGTH, list(shape.chunks[-1]), 0.03)
    return steps


def _make_edge_case(shape: EdgeShape) -> None:
    ends = ("exactly one ABORT to its engine" if not shape.final else "no ABORT")
    @case(f"streaming.stop_edge.{shape.name}", Level.MUST,
          f"For {shape.text}, the stream ends with {shape.want_reason!r}, the client sees "
          f"exactly {shape.want_text!r} and tokens {list(shape.want_tokens)}, and {ends}.",
          grounds=STOP_EDGES, needs=STOP_NEEDS)
    async def run(ctx: CaseContext) -> None:
        p = prompt(0)
        group = await ctx.start([EngineScript(rules=[by_prompt(p, _steps(shape))])])
        h = await ctx.driver.generate(p, 50, stop=[shape.stop])
        ended = await ctx.wait_until(lambda: h.ended, 3)
        ctx.require(ended, expected=f"the stream ends {shape.want_reason!r}",
                    observed=f"still open after 3 s with text {h.text!r}")
        ctx.require(h.finish_reason == shape.want_reason and h.error is None,
                    expected=f"finish_reason {shape.want_reason!r}",
                    observed=f"{h.finish_reason} error={h.error} tokens={h.tokens}")
        ctx.require(h.text == shape.want_text,
                    expected=f"text exactly {shape.want_text!r} (no part of the stop string, "
                    "nothing held back at the end)", observed=repr(h.text))
        ctx.require(tuple(h.tokens) == shape.want_tokens,
                    expected=f"tokens {list(shape.want_tokens)}", observed=h.tokens)
        found = request_for(group, p)
        ctx.require(found is not None, expected="the request's ADD", observed="none")
        assert found is not None
        if not shape.final:
            await group.transcript.wait_for(lambda t: found[1] in t.aborted_ids(),
                                            ctx.t(3))
        await ctx.quiet(0.2)
        frames = [(r.rank, r.message.request_ids) for r in group.transcript.abort_frames()]
        want = [] if shape.final else [(found[0], [found[1]])]
        ctx.require(frames == want, expected=f"ABORT frames {want}", observed=frames)

    run.__name__ = run.__qualname__ = f"stop_edge_{shape.name}"
    globals()[run.__name__] = run


for _shape in EDGE_SHAPES:
    _make_edge_case(_shape)


def _make_hold_back(stops: tuple[str, ...]) -> None:
    hold = max(len(s) for s in stops) - 1
    full = " t100 t101 t102"
    want = full[:len(full) - hold]
    name = "_".join(str(len(s)) for s in stops)

    @case(f"streaming.stop_edge.holds_back_{name}", Level.MUST,
          f"Mid-stream, with stop strings of lengths {[len(s) for s in stops]} not yet "
          f"matched, the client has all text but the last {hold} characters (max stop "
          f"length - 1): {want!r} of {full!r}; nothing more is withheld.",
          grounds=HOLD_BACK, needs=STOP_NEEDS)
    async def run(ctx: CaseContext) -> None:
        p = prompt(0)
        steps: list[Step] = [Emit([100], 0.02), Emit([101], 0.02), Emit([102], 0.02)]
        await ctx.start([EngineScript(rules=[by_prompt(p, steps)])])
        h = await ctx.driver.generate(p, 50, stop=list(stops))
        await ctx.wait_until(lambda: len(h.tokens) >= 3 and h.text == want, 3)
        await ctx.quiet(0.2)
        ctx.require(not h.ended, expected="the stream still open (no stop matched)",
                    observed=f"ended {h.finish_reason!r} ({h.error})")
        ctx.require(h.tokens == [100, 101, 102], expected="tokens [100, 101, 102]",
                    observed=h.tokens)
        ctx.require(h.text == want, expected=f"text exactly {want!r} ({hold} characters "
                    "held back)", observed=repr(h.text))

    run.__name__ = run.__qualname__ = f"stop_edge_holds_back_{name}"
    globals()[run.__name__] = run


for _stops in (("zz",), ("zzzzzz",), ("z", "zzzz")):
    _make_hold_back(_stops)


# ----------------------------------------------------------------- two stop strings, one token

# Of several stop strings matched by one step, both 0.33.0 frontends take the one that
# completes earliest in the text, ties by stop-list order, and truncate at its start: Python's
# check_stop_strings keeps the smallest end (`end < best_end`), the Rust matches_stop_string
# the first minimum of `end` (PR #50200 fixed its list-order pick, the Rust test
# stop_string_earliest_completing_wins_regardless_of_list_order runs both orders).
STOP_EARLIEST_COMPLETING = both(
    py("vllm/v1/engine/detokenizer.py:351",
       "stop_index = output_text.find(stop_str, 1 - new_char_count - stop_string_len)"),
    py("vllm/v1/engine/detokenizer.py:356", "end = stop_index + stop_string_len"),
    py("vllm/v1/engine/detokenizer.py:357", "if end < best_end:"),
    py("vllm/v1/engine/detokenizer.py:373", "return best_stop_str, best_stop_index"),
    rs("rust/src/text/src/output/decoded.rs:198",
       "matches_stop_string(stops, decoder.output(), new_bytes)"),
    rs("rust/src/text/src/output/decoded.rs:368",
       ".map(|pos| (ss_idx, start_off + pos, start_off + pos + len))"),
    rs("rust/src/text/src/output/decoded.rs:371", ".min_by_key(|&(_, _, end)| end)"),
    rs("rust/src/text/src/output/decoded.rs:869",
       "fn stop_string_earliest_completing_wins_regardless_of_list_order() {"),
    py("vllm/v1/engine/detokenizer.py:151",
       "del self.token_ids[first_new_token_index + num_kept :]"),
    py("vllm/v1/engine/async_llm.py:920", "await engine_core.abort_requests_async("),
    rs("rust/src/text/src/output/decoded.rs:206", "truncate_tokens_to = Some(tok_idx + 1);"),
    rs("rust/src/text/src/output/decoded.rs:302",
       "AbortCause::StopStringMatched.drop_as(raw_stream);"))


async def _two_stops_one_token(ctx: CaseContext, orders: tuple[list[str], ...],
                               want_text: str) -> None:
    """One stream per stop list, each ' t50' then ' t12' (which completes both stop strings):
    every stream ends 'stop' with `want_text`, tokens [50, 12], one ABORT at its engine."""
    prompts = [prompt(i) for i in range(len(orders))]
    steps: list[Step] = [Emit([50], 0.03), Emit([12], 0.03), Emit([13], 0.03)]
    group = await ctx.start([EngineScript(rules=[by_prompt(p, list(steps)) for p in prompts])])
    handles = [await ctx.driver.generate(p, 50, stop=stops)
               for p, stops in zip(prompts, orders, strict=True)]
    ended = await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    seen = {str(stops): (h.finish_reason, h.error, h.text, h.tokens)
            for stops, h in zip(orders, handles, strict=True)}
    ctx.require(ended, expected="every stream ends 'stop'", observed=f"after 3 s: {seen}")
    want = ("stop", None, want_text, [50, 12])
    wrong = {k: v for k, v in seen.items() if v != want}
    ctx.require(not wrong, expected=f"for every stop list (finish_reason, error, text, "
                f"tokens) = {want}", observed=f"{wrong}")
    owners: dict[str, int] = {}
    for p in prompts:
        found = request_for(group, p)
        ctx.require(found is not None, expected="the request's ADD", observed="none")
        assert found is not None
        owners[found[1]] = found[0]
    await group.transcript.wait_for(lambda t: set(owners) <= set(t.aborted_ids()), ctx.t(3))
    await ctx.quiet(0.2)
    frames = sorted((r.rank, tuple(r.message.request_ids))
                    for r in group.transcript.abort_frames())
    ids = sorted(rid for _rank, rids in frames for rid in rids)
    ctx.require(ids == sorted(owners) and all(owners[rid] == rank for rank, rids in frames
                                              for rid in rids),
                expected=f"one ABORT of each request at its engine {owners}",
                observed=frames)


@case("streaming.stop_edge.two_complete_in_one_token", Level.MUST,
      "Two stop strings both completed by one token (' t12' after ' t50', stops '2' and "
      "'t1'): whatever their order in the stop list, the stream stops at the one that "
      "completes first ('t1', which also starts first): text exactly ' t50 ', tokens [50, 12], "
      "'stop', and one ABORT to its engine.",
      grounds=STOP_EARLIEST_COMPLETING, needs=STOP_NEEDS)
async def stop_edge_two_complete_in_one_token(ctx: CaseContext) -> None:
    # The earlier-completing one listed last, then first.
    await _two_stops_one_token(ctx, (["2", "t1"], ["t1", "2"]), " t50 ")


@case("streaming.stop_edge.nested_in_one_token", Level.MUST,
      "A stop string inside another, both completed by one token (' t12' after ' t50', stops "
      "'t12' and '1'): whatever their order in the stop list, the stream stops at the inner "
      "one, which completes first though it starts later: text exactly ' t50 t', tokens "
      "[50, 12], 'stop', and one ABORT to its engine.",
      grounds=STOP_EARLIEST_COMPLETING, needs=STOP_NEEDS)
async def stop_edge_nested_in_one_token(ctx: CaseContext) -> None:
    await _two_stops_one_token(ctx, (["t12", "1"], ["1", "t12"]), " t50 t")


# ----------------------------------------------------------------- session ADDs

# vllm-rs 0.33.0 has no streaming-input sessions: only the Python frontend holds these rules.
_RS_NO_SESSIONS = rs("rust/src/llm/src/request.rs:121", "resumable: false,")
_NO_RS = ("rust lacks streaming-input sessions in 0.33.0 (every ADD resumable=false, "
          "rust/src/llm/src/request.rs:121), python holds it; ")
_PY_SESSION_PARAMS = py("vllm/v1/engine/async_llm.py:654", "sp = sampling_params")
_PY_CHUNK_ADD = py("vllm/v1/engine/async_llm.py:657", "request_id=internal_req_id,")
SESSION_MAX_TOKENS = only(
    _PY_SESSION_PARAMS, _PY_CHUNK_ADD,
    py("vllm/v1/engine/async_llm.py:660", "resumable=True,"),
    _RS_NO_SESSIONS,
    engine("vllm/v1/core/sched/scheduler.py:1914", "session.max_tokens = update.max_tokens"),
    note=_NO_RS + "a continuation with another max_tokens sets the session's length "
    "engine-side (scheduler.py:1914), so the engine generates a different number of "
    "tokens than the client asked for (corrupted output)")
SESSION_RANK = only(
    py("vllm/v1/engine/async_llm.py:613", "data_parallel_rank=data_parallel_rank,"),
    py("vllm/v1/engine/core_client.py:1758",
       "if (engine := self.reqs_in_flight.get(request.request_id)) is not None:"),
    py("vllm/v1/engine/core_client.py:1763",
       "if (eng_index := request.data_parallel_rank) is None and ("),
    rs("rust/src/engine-core-client/src/client/state.rs:202",
       "if let Some(rank) = data_parallel_rank {"),
    _RS_NO_SESSIONS,
    engine("vllm/v1/core/sched/scheduler.py:2946", "if request.resumable:"),
    note=_NO_RS + "(rust routes a plain ADD to its data_parallel_rank, state.rs:202); a "
    "continuation sent to another engine opens a second resumable request there "
    "(scheduler.py:2946-2947) while the session on its own engine waits for input forever "
    "(engine left in a wrong state)")
SESSION_MATCHES_FIRST = only(
    _PY_SESSION_PARAMS, _PY_CHUNK_ADD,
    py("vllm/v1/engine/async_llm.py:663", "req.external_req_id = request_id"),
    py("vllm/v1/engine/core_client.py:1611", "request.client_index = self.client_index"),
    _RS_NO_SESSIONS,
    engine("vllm/v1/core/sched/scheduler.py:1913",
           "session.sampling_params = update.sampling_params"),
    note=_NO_RS + "a continuation's sampling replaces the session's engine-side "
    "(scheduler.py:1913), so one built with default sampling (temperature 1.0, no EOS id) "
    "changes how the rest of the session is generated (corrupted output)")
SESSION_NEW_WAVE = both(
    py("vllm/v1/engine/core_client.py:1610", "request.current_wave = self.current_wave"),
    rs("rust/src/engine-core-client/src/client.rs:662",
       "req.current_wave = coordinator.snapshot().current_wave;"),
    engine("vllm/v1/engine/core.py:2375", "if request_wave > self.current_wave:"),
    note="both stamp every ADD with the coordinator's newest wave (python's continuations "
    "go through the same add_request_async; rust has no continuations in 0.33.0)")
SESSION_ENGINE_END = only(
    py("vllm/v1/engine/output_processor.py:845",
       "finish_reason not in (FinishReason.ABORT, FinishReason.ERROR)"),
    py("vllm/v1/engine/output_processor.py:878",
       "if req_state.streaming_input or not engine_core_output.finished:"),
    py("vllm/v1/engine/async_llm.py:646",
       "if any_added and not self.output_processor.has_request("),
    _RS_NO_SESSIONS,
    engine("vllm/v1/core/sched/scheduler.py:2946", "if request.resumable:"),
    note=_NO_RS + "a frontend that takes an engine ABORT/ERROR for a segment boundary keeps "
    "the client feeding a session the engine has ended: its next chunk re-creates the "
    "request engine-side (scheduler.py:2946-2947; output_processor.py:879-881) and the "
    "client waits on a dead session (hang)")
SESSION_QUEUED_CHUNKS = only(
    py("vllm/v1/engine/output_processor.py:709", "req_state.input_chunk_queue[-1].final = True"),
    py("vllm/v1/engine/output_processor.py:872",
       "update = req_state.input_chunk_queue.popleft()"),
    py("vllm/v1/engine/output_processor.py:859", "request_output.finished = False"),
    py("vllm/v1/engine/async_llm.py:688",
       "await self._add_request(final_req, None, None, 0, queue)"),
    _RS_NO_SESSIONS,
    engine("vllm/v1/core/sched/scheduler.py:2938", "existing.streaming_queue.append(update)"),
    note=_NO_RS + "the engine queues the continuation and the close behind the running "
    "segment (scheduler.py:2938); ending the stream at the first segment's finish loses the "
    "second segment's tokens (lost data)")
SESSION_NO_LATE_CHUNK = only(
    py("vllm/v1/engine/async_llm.py:642", "async for input_chunk in input_stream:"),
    py("vllm/v1/engine/async_llm.py:646",
       "if any_added and not self.output_processor.has_request("),
    _RS_NO_SESSIONS,
    engine("vllm/v1/core/sched/scheduler.py:2936",
           'assert existing.streaming_queue is not None, "duplicate request id"'),
    engine("vllm/v1/core/sched/scheduler.py:2946", "if request.resumable:"),
    note=_NO_RS + "its chunks come only from the session's own input generator, so none "
    "exists for a plain request or after the input closed (the error itself is the "
    "driver's); a continuation ADD for a running plain request trips the engine's "
    "duplicate-id assertion (scheduler.py:2936: crash), one after the session's close "
    "re-creates a resumable request nobody closes (scheduler.py:2946-2947: engine left in "
    "a wrong state)")
SESSION_NEEDS = [Capability.STREAMING_INPUT]


def _make_session_max_tokens(engines: int, max_tokens: int) -> None:
    @case(f"streaming.resumable.max_tokens_{max_tokens}_{engines}_engines", Level.MUST,
          f"With {engines} engine(s), a session opened and continued with max_tokens="
          f"{max_tokens} sends that max_tokens on its first ADD and on its continuation "
          "(the engine must not fall back to a default length).",
          grounds=SESSION_MAX_TOKENS, needs=SESSION_NEEDS)
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start(scripts(engines, 1, 2))
        handle, rid = await open_first_segment(ctx, group, max_tokens=max_tokens)
        await finish_segment(ctx, group, handle, rid, 1, 2)
        await ctx.driver.continue_session(handle, segment_prompt(0, 1), max_tokens)
        await ctx.wait_until(lambda: len(session_adds(group, rid)) >= 2, 3)
        resumable = [a for a in session_adds(group, rid) if a.request.resumable]
        seen = [a.request.sampling_params.max_tokens if a.request.sampling_params else None
                for a in resumable]
        ctx.require(seen == [max_tokens, max_tokens],
                    expected=f"max_tokens {max_tokens} on the first ADD and the "
                             "continuation", observed=f"max_tokens of resumable ADDs: {seen}")

    run.__name__ = run.__qualname__ = f"session_max_tokens_{max_tokens}_{engines}"
    globals()[run.__name__] = run


for _engines in (1, 2):
    for _max in (3, 7):
        _make_session_max_tokens(_engines, _max)


# A continuation's own sampling (here its max_tokens) replaces the session's for its ADD.
SESSION_OWN_MAX_TOKENS = only(
    py("vllm/v1/engine/async_llm.py:650", "sp = input_chunk.sampling_params"),
    _PY_CHUNK_ADD,
    _RS_NO_SESSIONS,
    engine("vllm/v1/core/sched/scheduler.py:1914", "session.max_tokens = update.max_tokens"),
    note=_NO_RS + "a continuation asking another max_tokens than the first segment sets the "
    "session's length engine-side (scheduler.py:1914): a continuation sent with the first "
    "segment's value generates a different number of tokens than the client asked for")


def _make_own_max_tokens(engines: int) -> None:
    @case(f"streaming.resumable.continuation_own_max_tokens_{engines}_engines", Level.MUST,
          f"With {engines} engine(s), a session opened with max_tokens=3 and continued with "
          "max_tokens=7 sends 3 on its first ADD and 7 on its continuation: each segment "
          "carries its own, not the first segment's.",
          grounds=SESSION_OWN_MAX_TOKENS, needs=SESSION_NEEDS)
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start(scripts(engines, 1, 2))
        handle, rid = await open_first_segment(ctx, group, max_tokens=3)
        await finish_segment(ctx, group, handle, rid, 1, 2)
        await ctx.driver.continue_session(handle, segment_prompt(0, 1), 7)
        await ctx.wait_until(lambda: len(session_adds(group, rid)) >= 2, 3)
        resumable = [a for a in session_adds(group, rid) if a.request.resumable]
        seen = [a.request.sampling_params.max_tokens if a.request.sampling_params else None
                for a in resumable]
        ctx.require(seen == [3, 7], expected="max_tokens 3 on the first ADD, 7 on the "
                                             "continuation",
                    observed=f"max_tokens of resumable ADDs: {seen}")

    run.__name__ = run.__qualname__ = f"continuation_own_max_tokens_{engines}"
    globals()[run.__name__] = run


for _engines in (1, 2):
    _make_own_max_tokens(_engines)


def _make_session_rank(engines: int, rank: int) -> None:
    @case(f"streaming.resumable.explicit_rank_{rank}_of_{engines}", Level.MUST,
          f"With {engines} engines, a session opened with data_parallel_rank={rank} sends "
          f"its first ADD and its continuation to engine {rank}.",
          grounds=SESSION_RANK, needs=SESSION_NEEDS)
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start(scripts(engines, 1, 2))
        handle, rid = await open_first_segment(ctx, group, data_parallel_rank=rank)
        await finish_segment(ctx, group, handle, rid, 1, 2)
        await ctx.driver.continue_session(handle, segment_prompt(0, 1), 2)
        await ctx.wait_until(lambda: len(session_adds(group, rid)) >= 2, 3)
        ranks = [a.rank for a in session_adds(group, rid)]
        ctx.require(len(ranks) >= 2 and set(ranks) == {rank},
                    expected=f"the first ADD and the continuation at engine {rank}",
                    observed=f"ADDs of the session at engines {ranks}")

    run.__name__ = run.__qualname__ = f"session_rank_{rank}_of_{engines}"
    globals()[run.__name__] = run


for _engines, _rank in ((2, 1), (3, 2), (3, 1)):
    _make_session_rank(_engines, _rank)


def _make_continuation_matches(engines: int) -> None:
    @case(f"streaming.resumable.continuation_matches_first_{engines}_engines", Level.MUST,
          f"With {engines} engine(s), a session's continuation ADD carries the first ADD's "
          "sampling (temperature, EOS id, stop token ids) and its external request id and "
          "client index: the engine continues the same request, not a default one.",
          grounds=SESSION_MATCHES_FIRST, needs=SESSION_NEEDS)
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start(scripts(engines, 1, 2))
        handle, rid = await open_first_segment(ctx, group)
        await finish_segment(ctx, group, handle, rid, 1, 2)
        await ctx.driver.continue_session(handle, segment_prompt(0, 1), 2)
        await ctx.wait_until(lambda: len(session_adds(group, rid)) >= 2, 3)
        adds = [a.request for a in session_adds(group, rid) if a.request.resumable]
        ctx.require(len(adds) >= 2, expected="the first ADD and the continuation",
                    observed=f"{len(adds)} resumable ADDs")
        if len(adds) < 2:
            return
        first, cont = adds[0], adds[1]

        def shape(r: m.EngineCoreRequest) -> dict[str, object]:
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

    run.__name__ = run.__qualname__ = f"continuation_matches_first_{engines}"
    globals()[run.__name__] = run


for _engines in (1, 2):
    _make_continuation_matches(_engines)


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


def _make_segment_failure(kind: m.FinishReason, segment: int) -> None:
    want = "abort" if kind is F.ABORT else "error"
    phase = "first_segment" if segment == 0 else "continuation"

    @case(f"streaming.resumable.engine_{want}_ends_session_{phase}", Level.MUST,
          f"An engine-side {kind.name} finishing a session's {phase.replace('_', ' ')} is "
          f"not a segment boundary: the client's stream ends {want!r} without waiting for "
          "the input to close.",
          grounds=SESSION_ENGINE_END, needs=SESSION_NEEDS)
    async def run(ctx: CaseContext) -> None:
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
        ok = (handle.finish_reason == want and handle.error is None) if want == "abort" else (
            handle.finish_reason == "error" or (handle.error is not None and
                                                handle.finish_reason not in
                                                ("length", "stop", "abort")))
        ctx.require(ended and ok, expected=f"the session's stream ends {want!r}",
                    observed=(f"ended {handle.finish_reason!r} error={handle.error}" if ended
                              else f"still open after 3 s with {handle.tokens}"))

    run.__name__ = run.__qualname__ = f"segment_{want}_{phase}"
    globals()[run.__name__] = run


for _kind in (F.ABORT, F.ERROR):
    for _segment in (0, 1):
        _make_segment_failure(_kind, _segment)


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


# A session's ADDs leave in the order the client made them, even with no pause between the
# calls: an engine takes an ADD with an id it does not hold as a new request, so a
# continuation that overtook the first ADD would open the wrong session.
SESSION_ADD_ORDER = only(
    py("vllm/v1/engine/async_llm.py:642", "async for input_chunk in input_stream:"),
    py("vllm/v1/engine/async_llm.py:671",
       "await self._add_request(req, prompt_text, None, 0, queue)"),
    py("vllm/v1/engine/async_llm.py:688",
       "await self._add_request(final_req, None, None, 0, queue)"),
    _RS_NO_SESSIONS,
    engine("vllm/v1/core/sched/scheduler.py:2946", "if request.resumable:"),
    note=_NO_RS + "python sends a session's chunks from one task, awaiting each ADD in turn; "
    "an ADD reordered ahead of the session's first opens a session under the wrong prompt")


def _make_continuation_zero_delay(engines: int) -> None:
    @case(f"streaming.resumable.continuation_zero_delay_{engines}_engines", Level.MUST,
          f"With {engines} engine(s), open_session, then continue_session and close_session "
          "each the instant the previous call returns: the engine holding the session gets "
          "the first segment (resumable), the continuation (resumable) and the close (not "
          "resumable) in that order under one id, and the stream ends after the second "
          "segment's tokens.",
          grounds=SESSION_ADD_ORDER, needs=SESSION_NEEDS)
    async def run(ctx: CaseContext) -> None:
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

    run.__name__ = run.__qualname__ = f"continuation_zero_delay_{engines}"
    globals()[run.__name__] = run


for _n in (1, 2):
    _make_continuation_zero_delay(_n)


def _make_continuation_rejected(target: str) -> None:
    what = {"plain_request": "a plain (non-session) request's stream",
            "closed_input": "a session whose input was closed (its segment still runs)",
            "ended_session": "a session that has ended"}[target]

    @case(f"streaming.resumable.continuation_rejected_{target}", Level.MUST,
          f"A continuation of {what} is rejected with a frontend error, and no ADD for it "
          "reaches any engine.",
          grounds=SESSION_NO_LATE_CHUNK, needs=SESSION_NEEDS)
    async def run(ctx: CaseContext) -> None:
        long_first = [Emit([100], 0.01), Finish(F.LENGTH, [101], 0.8)]
        rules = [by_prompt(segment_prompt(0, 0),
                           long_first if target == "closed_input"
                           else stream(segment_tokens(0), 0.01, F.LENGTH)),
                 by_prompt(prompt(900), stream([300, 301, 302, 303], 0.2))]
        group = await ctx.start([EngineScript(rules=rules)])
        if target == "plain_request":
            handle = await ctx.driver.generate(prompt(900), 4)
            await handle.wait_first(ctx.t(3))
        else:
            handle, rid = await open_first_segment(ctx, group)
            await ctx.wait_until(lambda: bool(handle.tokens), 3)
            await ctx.driver.close_session(handle)
            if target == "ended_session":
                await ctx.wait_until(lambda: handle.ended, 3)
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

    run.__name__ = run.__qualname__ = f"continuation_rejected_{target}"
    globals()[run.__name__] = run


for _target in ("plain_request", "closed_input", "ended_session"):
    _make_continuation_rejected(_target)
