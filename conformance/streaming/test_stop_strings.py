"""Stop strings: where a match is found, what text and tokens the client keeps, which
engine is told, and how much text is held back meanwhile.

A frontend matching stop strings truncates text and tokens at the EARLIEST occurrence in
the new text (across chunks, inside a multi-token chunk, in the final output), sends one
ABORT to the owning engine unless the engine had finished the request itself, holds back
the last max(len(stop)) - 1 characters of the text (vLLM's stop_buffer_length) so no part
of a match is ever released, and releases everything it held when the engine finishes the
request without a match, whatever the finish. Port authors get the edges wrong: a match
starting at character 0 (a stop string that includes the leading space), a match completed
by a single character of the next token, two occurrences inside one token, a match
spanning the tokens of the engine's final output, and the tail of a stream that never
matched. (Stop strings against min_tokens: test_limits.py.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conformance.streaming.helpers import F, describe
from harness.cases.authoring import (
    Capability,
    CaseContext,
    Emit,
    EngineGroup,
    EngineScript,
    Finish,
    Level,
    Step,
    StreamHandle,
    both,
    by_prompt,
    case,
    prompt,
    py,
    request_for,
    rs,
)

STOP_NEEDS = [Capability.GENERATE, Capability.STOP_STRINGS]
_DETOK = "vllm/v1/engine/detokenizer.py"
_DECODED = "rust/src/text/src/output/decoded.rs"

# Stop strings: the earliest match in the new text, text and tokens cut at it, the held-back
# tail released at the finish, and one ABORT to the owner unless the engine had finished.
_PY_FIND = py(f"{_DETOK}:351",
              "stop_index = output_text.find(stop_str, 1 - new_char_count - stop_string_len)")
_PY_EARLIEST = py(f"{_DETOK}:357", "if end < best_end:")
_PY_BEST = py(f"{_DETOK}:373", "return best_stop_str, best_stop_index")
_PY_CUT_TOKENS = py(f"{_DETOK}:151", "del self.token_ids[first_new_token_index + num_kept :]")
_PY_HOLD_UNLESS_FINISHED = py(f"{_DETOK}:165",
                              "buffer_length = 0 if finished else self.stop_buffer_length")
_PY_ABORT_UNLESS_FINISHED = py(
    "vllm/v1/engine/output_processor.py:878",
    "if req_state.streaming_input or not engine_core_output.finished:")
_PY_ABORT = py("vllm/v1/engine/async_llm.py:920", "await engine_core.abort_requests_async(")
_RS_MATCH = rs(f"{_DECODED}:198", "matches_stop_string(stops, decoder.output(), new_bytes)")
_RS_EARLIEST = rs(f"{_DECODED}:371", ".min_by_key(|&(_, _, end)| end)")
_RS_CUT_TOKENS = rs(f"{_DECODED}:206", "truncate_tokens_to = Some(tok_idx + 1);")
_RS_FLUSH = rs(f"{_DECODED}:274",
               "let (last_chunk, full_decoded) = decoder.flush(truncate_output_to)?;")
_RS_ABORT = rs(f"{_DECODED}:302", "AbortCause::StopStringMatched.drop_as(raw_stream);")
_RS_TERMINATED = rs("rust/src/engine-core-client/src/client/stream.rs:224",
                    "if self.is_terminated() {")
_RS_ABORT_AT_OWNER = rs("rust/src/engine-core-client/src/client/imp.rs:406",
                        "by_engine.entry(engine_id).or_default().push(request_id);")
_STOP_CITES = (_PY_FIND, _PY_BEST, _PY_CUT_TOKENS, _PY_ABORT_UNLESS_FINISHED, _PY_ABORT,
               _RS_MATCH, rs(f"{_DECODED}:203", "false => Some(off),"), _RS_CUT_TOKENS,
               _RS_ABORT, _RS_TERMINATED)
STOP = both(*_STOP_CITES)
STOP_OWNERS = both(
    *_STOP_CITES,
    py("vllm/v1/engine/core_client.py:1895", "elif engine := self.reqs_in_flight.get(req_id):"),
    rs("rust/src/engine-core-client/src/client/imp.rs:388",
       "let Some(engine_id) = inner.take_auto_abort_target(&request_id) else {"),
    _RS_ABORT_AT_OWNER)
STOP_EDGES = both(
    _PY_FIND, _PY_EARLIEST, _PY_CUT_TOKENS, _PY_HOLD_UNLESS_FINISHED, _PY_ABORT_UNLESS_FINISHED,
    _PY_ABORT, _RS_MATCH, _RS_EARLIEST, _RS_CUT_TOKENS, _RS_FLUSH, _RS_ABORT, _RS_TERMINATED,
    _RS_ABORT_AT_OWNER)
# Mid-stream, exactly max(len(stop)) - 1 characters are held back.
HOLD_BACK = both(
    py(f"{_DETOK}:88", "self.stop_buffer_length = max(len(s) for s in self.stop) - 1"),
    py(f"{_DETOK}:171", "length = len(self.output_text) - buffer_length"),
    rs(f"{_DECODED}:152", ".and_then(|stops| stops.iter().map(|ss| ss.len()).max())"),
    rs(f"{_DECODED}:154", ".saturating_sub(1),"),
    rs("rust/src/tokenizer/src/incremental.rs:232",
       "let cutoff = self.decoded.len().saturating_sub(self.min_bytes_to_buffer);"))
# A finished output releases the text held back for stop strings, whatever the reason.
HELD_RELEASED = both(
    _PY_HOLD_UNLESS_FINISHED,
    py("vllm/v1/engine/output_processor.py:487",
       "text = self.detokenizer.get_next_output_text(finished, delta)"),
    rs(f"{_DECODED}:273", "// Flush any remaining buffered text."),
    _RS_FLUSH)
# Of several stop strings matched by one step, both 0.33.0 frontends take the one that
# completes earliest in the text, ties by stop-list order, and truncate at its start: Python's
# check_stop_strings keeps the smallest end (`end < best_end`), the Rust matches_stop_string
# the first minimum of `end` (PR #50200 fixed its list-order pick, the Rust test
# stop_string_earliest_completing_wins_regardless_of_list_order runs both orders).
STOP_EARLIEST_COMPLETING = both(
    _PY_FIND,
    py(f"{_DETOK}:356", "end = stop_index + stop_string_len"),
    _PY_EARLIEST, _PY_BEST, _RS_MATCH,
    rs(f"{_DECODED}:368", ".map(|pos| (ss_idx, start_off + pos, start_off + pos + len))"),
    _RS_EARLIEST,
    rs(f"{_DECODED}:869",
       "fn stop_string_earliest_completing_wins_regardless_of_list_order() {"),
    _PY_CUT_TOKENS, _PY_ABORT, _RS_CUT_TOKENS, _RS_ABORT)


@dataclass(frozen=True)
class StopShape:
    """A stop string against a scripted chunking: what the client must see, ABORT owed."""

    name: str
    text: str
    chunks: tuple[tuple[int, ...], ...]
    final: bool  # the last chunk is the engine's final output (LENGTH)
    stop: str
    want_text: str  # the client's text (stop_string: stripped; stop_edge: exactly)
    want_tokens: tuple[int, ...]
    want_reason: str = "stop"


def _shape_case(shape: StopShape) -> dict[str, object]:
    """A params entry: the shape, and its tokens and ABORT as the requirement says them."""
    return {"shape": shape, "tokens": list(shape.want_tokens),
            "ends": "no ABORT" if shape.final else "exactly one ABORT to its engine"}


def _steps(shape: StopShape) -> list[Step]:
    steps: list[Step] = [Emit(list(c), 0.03) for c in shape.chunks]
    if shape.final:
        steps[-1] = Finish(F.LENGTH, list(shape.chunks[-1]), 0.03)
    # Not final: the script ends without Finish and the request stays open until aborted.
    return steps


async def _stream_to_stop(ctx: CaseContext, shape: StopShape
                          ) -> tuple[EngineGroup, list[int], StreamHandle, bool]:
    """One stream over the shape's chunks with its stop string; (group, prompt, handle,
    whether it ended within 3 s)."""
    p = prompt(0)
    group = await ctx.start([EngineScript(rules=[by_prompt(p, _steps(shape))])])
    h = await ctx.driver.generate(p, 50, stop=[shape.stop])
    ended = await ctx.wait_until(lambda: h.ended, 3)
    return group, p, h, ended


async def _require_abort_frames(ctx: CaseContext, group: EngineGroup, p: list[int],
                                final: bool) -> None:
    """No ABORT when the engine had finished the request; else exactly one, at its engine."""
    found = request_for(group, p)
    ctx.require(found is not None, expected="the request's ADD", observed="none")
    assert found is not None
    if not final:
        await group.transcript.wait_for(lambda t: found[1] in t.aborted_ids(), ctx.t(3))
    await ctx.quiet(0.2)
    frames = [(r.rank, r.message.request_ids) for r in group.transcript.abort_frames()]
    want = [] if final else [(found[0], [found[1]])]
    ctx.require(frames == want, expected=f"ABORT frames {want}", observed=frames)


# ----------------------------------------------------------------- where a match ends it

STOP_SHAPES = [
    StopShape("spans_two_chunks", "a stop string split across two one-token chunks",
              ((100,), (101,), (102,), (103,)), False, "t101 t10", "t100", (100, 101, 102)),
    StopShape("spans_three_chunks", "a stop string spanning three chunks, ending mid-token",
              ((100,), (101,), (102,), (103,), (104,)), False, "1 t102 t", "t100 t10",
              (100, 101, 102, 103)),
    StopShape("first_token", "a stop string in the very first token",
              ((100,), (101,), (102,)), False, "t100", "", (100,)),
    StopShape("inside_chunk", "a stop string inside a multi-token chunk (later tokens of "
              "that chunk are dropped)", ((100,), (101, 102, 103, 104)), False, "t102",
              "t100 t101", (100, 101, 102)),
    StopShape("in_final_output", "a stop string in the engine's final output (the engine "
              "already finished: no ABORT is owed)", ((100,), (101,), (102,)), True, "t102",
              "t100 t101", (100, 101, 102)),
]


@case("streaming.stop_string.{shape.name}", Level.MUST,
      "For {shape.text}, the stream ends with 'stop', text up to the stop string "
      "({shape.want_text!r}), tokens up to the one completing it, and {ends}.",
      grounds=STOP, needs=STOP_NEEDS, params=[_shape_case(s) for s in STOP_SHAPES])
async def stop_string(ctx: CaseContext, shape: StopShape) -> None:
    group, p, h, ended = await _stream_to_stop(ctx, shape)
    ctx.require(ended, expected="the stream ends at the stop string",
                observed=f"still open after 3 s with text {h.text!r}")
    ctx.require(h.finish_reason == "stop" and h.error is None,
                expected="finish_reason 'stop'",
                observed=f"{h.finish_reason} error={h.error} tokens={h.tokens}")
    ctx.require(h.text.strip() == shape.want_text,
                expected=f"text {shape.want_text!r} (stop string excluded)",
                observed=repr(h.text))
    ctx.require(tuple(h.tokens) == shape.want_tokens,
                expected=f"tokens {list(shape.want_tokens)}", observed=h.tokens)
    await _require_abort_frames(ctx, group, p, shape.final)


@case("streaming.stop_string.owner_engines", Level.MUST,
      "With 3 engines, each stream ended by a stop string is aborted once at its own "
      "engine, while a neighbour on every engine streams on untouched.",
      grounds=STOP_OWNERS, needs=STOP_NEEDS)
async def stop_owner_engines(ctx: CaseContext) -> None:
    stops = [prompt(i) for i in range(3)]
    others = [prompt(100 + i) for i in range(3)]
    hold_steps: Sequence[Step] = [Emit([100], 0.02), Emit([101], 0.03), Emit([102], 0.03)]
    rules = [by_prompt(p, list(hold_steps)) for p in stops]
    rules += [by_prompt(p, [Emit([300], 0.02), Emit([301], 0.1), Finish(F.LENGTH, [302], 0.1)])
              for p in others]
    group = await ctx.start([EngineScript(rules=list(rules)) for _ in range(3)])
    s_handles = [await ctx.driver.generate(p, 50, stop=["t101"]) for p in stops]
    o_handles = [await ctx.driver.generate(p, 3) for p in others]
    await ctx.wait_until(lambda: all(h.ended for h in [*s_handles, *o_handles]), 3)
    bad = [(h.finish_reason, h.text) for h in s_handles if h.finish_reason != "stop"]
    ctx.require(not bad, expected="every stop-string stream ends 'stop'", observed=bad)
    bad = [(h.finish_reason, h.tokens) for h in o_handles
           if h.finish_reason != "length" or h.tokens != [300, 301, 302]]
    ctx.require(not bad, expected="neighbours complete [300, 301, 302]", observed=bad)
    owners = {}
    for p in stops:
        found = request_for(group, p)
        if found is not None:
            owners[found[1]] = found[0]
    await group.transcript.wait_for(lambda t: set(owners) <= set(t.aborted_ids()), ctx.t(3))
    await ctx.quiet(0.2)
    sent = [(rid, r.rank) for r in group.transcript.abort_frames()
            for rid in r.message.request_ids]
    ctx.require(sorted(sent) == sorted(owners.items()),
                expected=f"each id once at its owner {sorted(owners.items())}",
                observed=sorted(sent))


# ----------------------------------------------------------------- at the edges of the text

EDGE_SHAPES = [
    StopShape("at_text_start_one_token", "a stop string that starts at the text's first "
              "character (it includes the leading space) and is completed by the first token",
              ((100,), (101,), (102,)), False, " t100", "", (100,), "stop"),
    StopShape("at_text_start_two_tokens", "a stop string that starts at the text's first "
              "character and is completed by the second token", ((100,), (101,), (102,)),
              False, " t100 t1", "", (100, 101), "stop"),
    StopShape("completed_by_one_char", "a stop string completed by the first character of "
              "the next token (' ' of ' t101')", ((100,), (101,), (102,)), False, "t100 ",
              " ", (100, 101), "stop"),
    StopShape("twice_in_one_token", "a stop string that occurs twice inside one token "
              "(truncated at the earliest)", ((100,), (101,)), False, "0", " t1", (100,),
              "stop"),
    StopShape("spans_final_chunk", "a stop string spanning two tokens of the engine's "
              "final multi-token output", ((100,), (101, 102)), True, "t101 t102", " t100 ",
              (100, 101, 102), "stop"),
    StopShape("never_matched_tail", "a stop string whose prefix ends the stream but never "
              "completes: the held-back tail is released at the finish",
              ((100,), (101,), (102,)), True, "t102 t9", " t100 t101 t102", (100, 101, 102),
              "length"),
    StopShape("never_matched_final_chunk", "a stop string never matched, the engine's final "
              "output carrying several tokens", ((100,), (101, 102, 103)), True, "t103 t9",
              " t100 t101 t102 t103", (100, 101, 102, 103), "length"),
]


@case("streaming.stop_edge.{shape.name}", Level.MUST,
      "For {shape.text}, the stream ends with {shape.want_reason!r}, the client sees "
      "exactly {shape.want_text!r} and tokens {tokens}, and {ends}.",
      grounds=STOP_EDGES, needs=STOP_NEEDS, params=[_shape_case(s) for s in EDGE_SHAPES])
async def stop_edge(ctx: CaseContext, shape: StopShape) -> None:
    group, p, h, ended = await _stream_to_stop(ctx, shape)
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
    await _require_abort_frames(ctx, group, p, shape.final)


# ----------------------------------------------------------------- text held back

HELD_FULL = " t100 t101 t102"  # the text of the three tokens the hold-back cases stream


def _hold_back(stops: tuple[str, ...]) -> dict[str, object]:
    """A params entry: the stop strings, the characters held back, the text shown."""
    hold = max(len(s) for s in stops) - 1
    return {"stops": stops, "name": "_".join(str(len(s)) for s in stops),
            "lengths": [len(s) for s in stops], "hold": hold,
            "want": HELD_FULL[:len(HELD_FULL) - hold], "full": HELD_FULL}


@case("streaming.stop_edge.holds_back_{name}", Level.MUST,
      "Mid-stream, with stop strings of lengths {lengths} not yet matched, the client has "
      "all text but the last {hold} characters (max stop length - 1): {want!r} of "
      "{full!r}; nothing more is withheld.",
      grounds=HOLD_BACK, needs=STOP_NEEDS,
      params=[_hold_back(stops) for stops in (("zz",), ("zzzzzz",), ("z", "zzzz"))])
async def stop_edge_holds_back(ctx: CaseContext, stops: tuple[str, ...], hold: int,
                               want: str) -> None:
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


HOLD_STOP = "zzzzzz"  # never matched; holds back the last 5 characters of the text


@case("streaming.stop_edge.held_text_released_on_engine_{name}", Level.MUST,
      "A stop-string request the engine ends with {kind.name} in an output carrying no "
      "new token still gets the text held back for the stop string: the stream ends "
      "{reason!r} with tokens [100, 101] and text ' t100 t101', nothing lost.",
      grounds=HELD_RELEASED,
      params=[{"kind": F.ABORT, "name": "abort", "reason": "abort", "needs": STOP_NEEDS},
              {"kind": F.ERROR, "name": "error", "reason": "error",
               "needs": [*STOP_NEEDS, Capability.REQUEST_ERRORS]}])
async def held_text_released(ctx: CaseContext, kind: F, reason: str) -> None:
    p = prompt(0)
    steps: list[Step] = [Emit([100], 0.02), Emit([101], 0.02), Finish(kind, delay=0.05)]
    await ctx.start([EngineScript(rules=[by_prompt(p, steps)])])
    h = await ctx.driver.generate(p, 50, stop=[HOLD_STOP])
    ended = await ctx.wait_until(lambda: h.ended, 3)
    ctx.require(ended and h.finish_reason == reason,
                expected=f"the stream ends {reason!r}", observed=describe(h))
    ctx.require(h.tokens == [100, 101] and h.text == " t100 t101",
                expected="tokens [100, 101], text ' t100 t101' (the held-back ' t101' "
                         "delivered at the end)", observed=f"{h.tokens} {h.text!r}")


# ----------------------------------------------------------------- two stop strings, one token


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
