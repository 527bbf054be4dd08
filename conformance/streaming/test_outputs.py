"""Outputs reach their streams: complete, in order, each to its own request, with its text
(protocol-python.md §6, seed PR #41627 for deferred requests).

Tokens arrive in order across chunks, outputs for unknown ids are ignored, a stream ends
exactly once, and a request the engine defers for a while neither blocks its neighbours nor
is lost. Engines batch several requests' outputs into one message in any order and send
empty deltas; hand-built messages (`MockEngine.send_outputs`) cover the shapes no script
produces: reversed and interleaved batches across engines, an unknown id in the middle of
a batch, a duplicate final output. Streamed tokens come with their text, and an engine STOP
leaves the stop token's text out.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from conformance.streaming.helpers import GEN, F, require_streams
from harness.cases.authoring import (
    Capability,
    CaseContext,
    Emit,
    EngineGroup,
    EngineScript,
    Finish,
    Garbage,
    Level,
    Step,
    StreamHandle,
    both,
    by_prompt,
    case,
    messages,
    prompt,
    py,
    request_for,
    rs,
    stream,
)
from harness.protocol.wire import codec_for

# Each output goes to its own request's stream, appended in arrival order.
_PY_PER_REQUEST = py("vllm/v1/engine/output_processor.py:757",
                     "for engine_core_output in engine_core_outputs:")
_PY_QUEUE = py("vllm/v1/engine/output_processor.py:863", "req_state.queue.put(request_output)")
_PY_LOOKUP = py("vllm/v1/engine/output_processor.py:759",
                "req_state = self.request_states.get(req_id)")
_PY_AGGREGATE = py("vllm/v1/engine/output_processor.py:79",
                   "self.output.add(output, aggregate=self.aggregate)")
_RS_DISPATCH = rs("rust/src/engine-core-client/src/client/imp.rs:464",
                  "for output in inner.send_outputs(outputs) {")
_RS_SEND = rs("rust/src/engine-core-client/src/client/state.rs:259",
              "Some(tracked) => tracked.sender.send(output),")
_RS_NEVER_REORDERED = rs("rust/src/engine-core-client/src/client/output_channel.rs:13",
                         "Outputs are never merged, reordered, or dropped here")
ORDER = both(_PY_PER_REQUEST, _PY_QUEUE, _PY_AGGREGATE, _RS_DISPATCH, _RS_SEND,
             _RS_NEVER_REORDERED)
# Each output in a message is routed by its request id, whatever its position or engine.
BATCH_ORDER = both(
    _PY_PER_REQUEST, _PY_LOOKUP, _PY_AGGREGATE, _RS_DISPATCH,
    rs("rust/src/engine-core-client/src/client/state.rs:258",
       "match self.requests.get_mut(output.request_id.as_str()) {"),
    _RS_NEVER_REORDERED)
# An output for an id the frontend does not track (unknown, or already ended) is dropped.
_PY_UNKNOWN = py("vllm/v1/engine/output_processor.py:761",
                 "# Ignore output for already-aborted request.")
_RS_UNKNOWN = rs("rust/src/engine-core-client/src/client/imp.rs:467",
                 '"dropping output for inactive request"')
_RS_UNTRACKED = rs("rust/src/engine-core-client/src/client/state.rs:260",
                   "None => return Some(output),")
_PY_POP = py("vllm/v1/engine/output_processor.py:919", "self.request_states.pop(req_id)")
_RS_REMOVE = rs("rust/src/engine-core-client/src/client/state.rs:253",
                "match self.remove(output.request_id.as_str()) {")
UNKNOWN_ID = both(_PY_UNKNOWN, _RS_UNKNOWN, _RS_UNTRACKED)
UNKNOWN_MID_BATCH = both(_PY_PER_REQUEST, _PY_UNKNOWN, _RS_DISPATCH, _RS_UNKNOWN,
                         _RS_UNTRACKED)
END_ONCE = both(_PY_UNKNOWN, _PY_POP, _RS_REMOVE, _RS_UNKNOWN,
                rs("rust/src/engine-core-client/src/client/stream.rs:164",
                   "if self.is_terminated() {"))
DUPLICATE_FINAL = both(_PY_UNKNOWN, _PY_POP, _RS_REMOVE, _RS_UNKNOWN)
_PY_NO_NEW_TOKENS = py("vllm/v1/engine/detokenizer.py:103", "if not new_token_ids:")
_RS_EACH_TOKEN = rs("rust/src/text/src/output/decoded.rs:194",
                    "for (tok_idx, &token_id) in decodable_token_ids.iter().enumerate() {")
EMPTY_DELTA = both(_PY_NO_NEW_TOKENS, _PY_QUEUE, _RS_SEND, _RS_EACH_TOKEN)
EMPTY_OUTPUTS = both(
    _PY_NO_NEW_TOKENS,
    py("vllm/v1/engine/output_processor.py:869", "if finish_reason is not None:"),
    rs("rust/src/engine-core-client/src/client/state.rs:252", "if output.finished() {"),
    _RS_EACH_TOKEN)
BATCHED = both(_PY_PER_REQUEST, _PY_QUEUE, _RS_DISPATCH, _RS_SEND)
# A request without output has its own queue/channel: nothing waits on it.
DEFERRED = both(_PY_PER_REQUEST, _PY_QUEUE, _PY_LOOKUP, _RS_SEND,
                rs("rust/src/engine-core-client/src/client/output_channel.rs:30",
                   "let (tx, rx) = mpsc::unbounded_channel();"))
TEXT = both(py("vllm/v1/engine/detokenizer.py:122",
               "self.output_text += self.decode_next(new_token_id)"),
            py("vllm/v1/engine/output_processor.py:487",
               "text = self.detokenizer.get_next_output_text(finished, delta)"),
            rs("rust/src/text/src/output/decoded.rs:195",
               "let new_bytes = decoder.push_token(token_id)?;"))
# An engine STOP (EOS or a stop token id): the last token stays among the tokens, its text
# is left out (before stop strings are looked for).
STOP_TEXT = both(
    py("vllm/v1/engine/detokenizer.py:107",
       "if stop_terminated and not self.include_stop_str_in_output:"),
    py("vllm/v1/engine/detokenizer.py:111", "new_token_ids = new_token_ids[:-1]"),
    py("vllm/v1/engine/output_processor.py:826",
       "new_token_ids, finish_reason == FinishReason.STOP"),
    rs("rust/src/text/src/output/decoded.rs:181",
       "let suppress_terminal_stop_token = finish_reason.as_ref().is_some_and(|r| r.is_stop())"),
    rs("rust/src/text/src/output/decoded.rs:186",
       "output.token_ids.split_last().map(|(_, rest)| rest).unwrap_or(&[])"))


async def _one(ctx: CaseContext, steps: list, max_tokens: int = 16):  # type: ignore[no-untyped-def,type-arg]
    p = prompt(0)
    group = await ctx.start([EngineScript(rules=[by_prompt(p, steps)])])
    handle = await ctx.driver.generate(p, max_tokens)
    await handle.wait(ctx.t(3))
    return group, handle


def _out(rid: str, tokens: Sequence[int], reason: messages.FinishReason | None = None
         ) -> messages.EngineCoreOutput:
    return messages.EngineCoreOutput(rid, list(tokens), finish_reason=reason)


def _msg(rank: int, outputs: list[messages.EngineCoreOutput]) -> messages.EngineCoreOutputs:
    return messages.EngineCoreOutputs(rank, outputs, None, time.monotonic())


async def _silent_requests(ctx: CaseContext, engines: int, count: int
                           ) -> tuple[EngineGroup, list[StreamHandle], list[tuple[int, str]]]:
    """`count` requests the engines accept but never answer on their own; returns the
    handles and each request's (owning rank, engine-side id)."""
    prompts = [prompt(i) for i in range(count)]
    group = await ctx.start([EngineScript(rules=[by_prompt(p, []) for p in prompts])
                             for _ in range(engines)])
    handles = [await ctx.driver.generate(p, 10) for p in prompts]
    seen = await ctx.wait_until(lambda: all(request_for(group, p) for p in prompts), 3)
    ctx.require(seen, expected=f"{count} ADDs at the engines",
                observed=f"{len(group.transcript.adds())} ADDs")
    owners = [request_for(group, p) for p in prompts]
    return group, handles, [o for o in owners if o is not None]


# ----------------------------------------------------------------- order and routing


@case("streaming.order.preserved", Level.MUST,
      "Tokens delivered over several chunks reach the client complete and in order.",
      grounds=ORDER, needs=GEN)
async def order_preserved(ctx: CaseContext) -> None:
    steps = [Emit([100, 101]), Emit([102]), Emit([103, 104, 105]), Finish(F.LENGTH, [106])]
    _g, h = await _one(ctx, steps, 7)
    ctx.require(h.tokens == list(range(100, 107)), expected="tokens 100..106 in order",
                observed=h.tokens)


@case("streaming.unknown_id.ignored", Level.MUST,
      "Outputs for request ids the frontend does not know are ignored.", grounds=UNKNOWN_ID,
      needs=GEN)
async def unknown_id(ctx: CaseContext) -> None:
    ghost = codec_for(ctx.profile).encode_outputs(messages.EngineCoreOutputs(
        0, [messages.EngineCoreOutput("ghost-request", [555], finish_reason=F.LENGTH)], None,
        1.0))
    steps = [Garbage(ghost), Emit([100], 0.02), Finish(F.LENGTH, [101], 0.02)]
    _g, h = await _one(ctx, steps, 2)
    ctx.require(h.tokens == [100, 101] and h.finish_reason == "length",
                expected="the real request completes with [100, 101]",
                observed=f"{h.tokens} {h.finish_reason} error={h.error}")


@case("streaming.unknown_id.related_ids_ignored", Level.MUST,
      "Outputs for ids related to a live request's id but not equal to it (the id minus "
      "its last character, the id with a character appended, the id with one prepended) "
      "are ignored: the live stream gets exactly its own tokens.", grounds=UNKNOWN_ID,
      needs=GEN)
async def related_ids(ctx: CaseContext) -> None:
    codec = codec_for(ctx.profile)

    def steps(request: messages.EngineCoreRequest) -> list[Step]:
        rid = request.request_id
        ghosts = codec.encode_outputs(messages.EngineCoreOutputs(0, [
            messages.EngineCoreOutput(ghost, [555], finish_reason=F.LENGTH)
            for ghost in (rid[:-1], rid + "0", "x" + rid)], None, 1.0))
        return [Emit([100]), Garbage(ghosts, 0.02), Emit([101], 0.02),
                Finish(F.LENGTH, [102], 0.02)]

    _g, h = await _one(ctx, steps, 3)  # type: ignore[arg-type]
    ctx.require(h.tokens == [100, 101, 102] and h.finish_reason == "length"
                and h.error is None,
                expected="the live request completes with exactly [100, 101, 102]",
                observed=f"{h.tokens} {h.finish_reason} error={h.error}")


@case("streaming.end.exactly_once", Level.MUST,
      "Outputs arriving after a request's final output do not change the ended stream.",
      grounds=END_ONCE, needs=GEN)
async def end_once(ctx: CaseContext) -> None:
    p = prompt(0)
    group = await ctx.start([EngineScript(rules=[by_prompt(p, stream([100, 101]))])])
    h = await ctx.driver.generate(p, 2)
    await h.wait(ctx.t(3))
    rid = group.transcript.adds(0)[0].request_id
    late = group.codec.encode_outputs(messages.EngineCoreOutputs(
        0, [messages.EngineCoreOutput(rid, [777], finish_reason=F.STOP)], None, 2.0))
    group[0].send_garbage(late)
    await ctx.quiet(0.2)
    ctx.require(h.tokens == [100, 101] and h.finish_reason == "length",
                expected="tokens [100, 101], finish length, unchanged",
                observed=f"{h.tokens} {h.finish_reason}")
    h2 = await ctx.driver.generate(prompt(1), 2)
    await h2.wait(ctx.t(3))
    ctx.require(h2.finish_reason == "length", expected="the frontend keeps serving",
                observed=f"{h2.finish_reason} error={h2.error}")


@case("streaming.empty_delta.tolerated", Level.MUST,
      "An output with no new tokens (a step without progress) is harmless.",
      grounds=EMPTY_DELTA,
      needs=GEN)
async def empty_delta(ctx: CaseContext) -> None:
    _g, h = await _one(ctx, [Emit([100]), Emit([]), Emit([101]), Finish(F.LENGTH, [102])], 3)
    ctx.require(h.tokens == [100, 101, 102] and h.finish_reason == "length",
                expected="tokens [100, 101, 102]", observed=f"{h.tokens} {h.finish_reason}")


@case("streaming.batched.two_requests", Level.MUST,
      "One engine message carrying outputs of several requests feeds each stream.",
      grounds=BATCHED, needs=GEN)
async def batched(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[])])
    handles = [await ctx.driver.generate(prompt(i), 5) for i in range(4)]
    for h in handles:
        await h.wait(ctx.t(3))
    multi = [r for r in group.transcript.select(direction="out", channel="output")
             if r.message is not None and len(r.message.outputs) > 1]
    ctx.note(f"{len(multi)} engine messages carried several requests")
    bad = [(h.tokens, h.finish_reason) for h in handles
           if len(h.tokens) != 5 or h.finish_reason != "length"]
    ctx.require(not bad, expected="every stream gets its 5 tokens", observed=bad)


@case("streaming.deferred.no_head_of_line", Level.MUST,
      "A request the engine defers (no output for a while) does not delay its neighbours "
      "and completes once the engine resumes it.", grounds=DEFERRED, needs=GEN)
async def deferred(ctx: CaseContext) -> None:
    p_slow, p_fast = prompt(0), prompt(1)
    hold_for = ctx.t(1.0)  # the deferral and the window below scale together
    slow = [Emit([200], hold_for), Finish(F.LENGTH, [201], 0.05)]
    fast = [Emit([100], 0.02), Emit([101], 0.02), Finish(F.LENGTH, [102], 0.02)]
    await ctx.start([EngineScript(rules=[by_prompt(p_slow, slow), by_prompt(p_fast, fast)])])
    began = time.monotonic()
    h_slow = await ctx.driver.generate(p_slow, 2)
    h_fast = await ctx.driver.generate(p_fast, 3)
    await h_fast.wait(ctx.t(3))
    fast_done = time.monotonic() - began
    ctx.require(fast_done < 0.8 * hold_for and not h_slow.first_output.is_set(),
                expected="the neighbour completes while the deferred one still waits",
                observed=f"neighbour done after {fast_done:.2f}s; deferred started: "
                         f"{h_slow.first_output.is_set()}")
    await h_slow.wait(ctx.t(4))
    ctx.require(h_slow.tokens == [200, 201] and h_slow.finish_reason == "length",
                expected="the deferred request completes with [200, 201]",
                observed=f"{h_slow.tokens} {h_slow.finish_reason} error={h_slow.error}")


# ----------------------------------------------------------------- hand-built batches


@case("streaming.shape.batch_reversed_interleaved", Level.MUST,
      "Outputs of three requests batched in one message in reverse ADD order, then in an "
      "interleaved order, then their final outputs in a third order, each reach their own "
      "stream in order.", grounds=BATCH_ORDER, needs=GEN)
async def batch_reversed(ctx: CaseContext) -> None:
    group, handles, owners = await _silent_requests(ctx, 1, 3)
    a, b, c = (rid for _rank, rid in owners)
    group[0].send_outputs(_msg(0, [_out(c, [301]), _out(b, [201]), _out(a, [101])]))
    group[0].send_outputs(_msg(0, [_out(b, [202]), _out(a, [102]), _out(c, [302])]))
    group[0].send_outputs(_msg(0, [_out(c, [303], F.LENGTH), _out(a, [103], F.LENGTH),
                                   _out(b, [203], F.LENGTH)]))
    await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    require_streams(ctx, handles, [[101, 102, 103], [201, 202, 203], [301, 302, 303]])


@case("streaming.shape.interleaved_{engines}_engines", Level.MUST,
      "With {engines} engines sending their requests' outputs in reversed, interleaved "
      "order (last engine first, requests reversed within each message), every stream "
      "gets exactly its own tokens in order.", grounds=BATCH_ORDER, needs=GEN,
      params=[{"engines": n} for n in (2, 3, 4)])
async def interleaved(ctx: CaseContext, engines: int) -> None:
    group, handles, owners = await _silent_requests(ctx, engines, 2 * engines)
    ranks = sorted({rank for rank, _ in owners})
    ctx.note(f"requests spread over engines {[rank for rank, _ in owners]}")
    for step in range(3):
        for rank in reversed(ranks):
            mine = [(i, rid) for i, (r, rid) in enumerate(owners) if r == rank]
            outs = [_out(rid, [1000 + 10 * i + step], F.LENGTH if step == 2 else None)
                    for i, rid in reversed(mine)]
            group[rank].send_outputs(_msg(rank, outs))
    await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    require_streams(ctx, handles, [[1000 + 10 * i + s for s in range(3)]
                                    for i in range(len(handles))])


@case("streaming.shape.unknown_id_mid_batch", Level.MUST,
      "An output for an unknown id in the middle of a batched message is skipped; the "
      "outputs after it in the same message still reach their streams.",
      grounds=UNKNOWN_MID_BATCH, needs=GEN)
async def unknown_mid_batch(ctx: CaseContext) -> None:
    group, handles, owners = await _silent_requests(ctx, 1, 2)
    a, b = (rid for _rank, rid in owners)
    group[0].send_outputs(_msg(0, [_out(a, [101]), _out("ghost-1", [555]), _out(b, [201])]))
    group[0].send_outputs(_msg(0, [_out("ghost-2", [556], F.LENGTH), _out(b, [202], F.LENGTH),
                                   _out(a, [102], F.LENGTH)]))
    await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    require_streams(ctx, handles, [[101, 102], [201, 202]])


@case("streaming.shape.duplicate_final", Level.MUST,
      "A final output repeated in the same message and again in the next one ends the "
      "stream once: its tokens are not appended twice and the neighbour is unaffected.",
      grounds=DUPLICATE_FINAL, needs=GEN)
async def duplicate_final(ctx: CaseContext) -> None:
    group, handles, owners = await _silent_requests(ctx, 1, 2)
    a, b = (rid for _rank, rid in owners)
    group[0].send_outputs(_msg(0, [_out(a, [101]), _out(b, [201])]))
    group[0].send_outputs(_msg(0, [_out(a, [102], F.LENGTH), _out(b, [202]),
                                   _out(a, [102], F.LENGTH)]))
    group[0].send_outputs(_msg(0, [_out(a, [102], F.STOP), _out(b, [203], F.LENGTH)]))
    await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    await ctx.quiet(0.1)
    require_streams(ctx, handles, [[101, 102], [201, 202, 203]])


@case("streaming.shape.empty_outputs", Level.MUST,
      "Outputs without tokens (an empty first output, an empty delta mid-stream, an empty "
      "final output) neither end nor corrupt the stream; the empty final one ends it.",
      grounds=EMPTY_OUTPUTS, needs=GEN)
async def empty_outputs(ctx: CaseContext) -> None:
    p = prompt(0)
    steps = [Emit([]), Emit([100], 0.02), Emit([], 0.02), Emit([101], 0.02),
             Finish(F.LENGTH, delay=0.02)]
    await ctx.start([EngineScript(rules=[by_prompt(p, steps)])])
    h = await ctx.driver.generate(p, 5)
    await h.wait(ctx.t(3))
    require_streams(ctx, [h], [[100, 101]])


# ----------------------------------------------------------------- text


@case("streaming.text.detokenized", Level.MUST,
      "Streamed tokens come with their text (' t100 t101' for the tiny fixture).",
      grounds=TEXT, needs=GEN)
async def text(ctx: CaseContext) -> None:
    _g, h = await _one(ctx, stream([100, 101]), 2)
    ctx.require(h.text.split() == ["t100", "t101"], expected="text ' t100 t101'",
                observed=repr(h.text))


def _stop_text(variant: str, steps: list[Step], stop: list[str] | None, tokens: list[int],
               text: str) -> dict[str, object]:
    """One engine STOP: its steps, the stop strings asked, the tokens and exact text."""
    return {"variant": variant, "steps": steps, "stop": stop, "tokens": tokens, "text": text,
            "asked": f" (stop strings {stop} asked)." if stop else ".",
            "needs": [*GEN, Capability.STOP_STRINGS] if stop else GEN}


STOP_TEXT_VARIANTS = [
    _stop_text("own_output", [Emit([200]), Finish(F.STOP, [201], stop_reason=201)], None,
               [200, 201], " t200"),
    _stop_text("in_final_chunk", [Emit([100]), Finish(F.STOP, [200, 201], stop_reason=201)],
               None, [100, 200, 201], " t100 t200"),
    _stop_text("stop_strings_asked", [Emit([200]), Finish(F.STOP, [201], stop_reason=201)],
               ["zzz"], [200, 201], " t200"),
    # The left-out text is never searched: " t201" does not match, the text keeps no
    # trailing space (a match would have cut it to " t200 ").
    _stop_text("stop_string_in_left_out_text",
               [Emit([200]), Finish(F.STOP, [201], stop_reason=201)], ["t201"], [200, 201],
               " t200"),
]


@case("streaming.text.stop_finish_last_token_silent_{variant}", Level.MUST,
      "When the engine ends a request with STOP (a stop token id), the client gets every "
      "token, the stop token too, and the text without the stop token's: tokens {tokens}, "
      "text {text!r}{asked}", grounds=STOP_TEXT, params=STOP_TEXT_VARIANTS)
async def stop_finish_text(ctx: CaseContext, steps: list[Step], stop: list[str] | None,
                           tokens: list[int], text: str) -> None:
    p = prompt(0)
    await ctx.start([EngineScript(rules=[by_prompt(p, steps)])])
    handle = await ctx.driver.generate(p, 8, stop=stop)
    await handle.wait(ctx.t(3))
    seen = (handle.tokens, handle.text, handle.finish_reason)
    ctx.require(seen == (tokens, text, "stop"),
                expected=f"tokens {tokens}, text {text!r}, finish stop",
                observed=f"tokens {handle.tokens}, text {handle.text!r}, finish "
                         f"{handle.finish_reason} error={handle.error}")
