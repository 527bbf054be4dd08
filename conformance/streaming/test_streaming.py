"""Streaming outputs (protocol-python.md §6, seed PR #41627 for deferred requests).

Tokens arrive in order across chunks, finish reasons map to their names, outputs for
unknown ids are ignored, a stream ends exactly once, and a request the engine defers for
a while neither blocks its neighbours nor is lost.
"""

from __future__ import annotations

import time

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, py, rs
from harness.cases.helpers import prompt
from harness.frontends.api import Capability
from harness.protocol.wire import messages as m
from harness.results.records import Level
from mock_engines.script import Emit, EngineScript, Finish, Garbage, Step, by_prompt, stream

GEN = [Capability.GENERATE]
F = m.FinishReason

# Each output goes to its own request's stream, appended in arrival order.
_PY_PER_REQUEST = py("vllm/v1/engine/output_processor.py:757",
                     "for engine_core_output in engine_core_outputs:")
_PY_QUEUE = py("vllm/v1/engine/output_processor.py:863", "req_state.queue.put(request_output)")
_RS_DISPATCH = rs("rust/src/engine-core-client/src/client/imp.rs:464",
                  "for output in inner.send_outputs(outputs) {")
_RS_SEND = rs("rust/src/engine-core-client/src/client/state.rs:259",
              "Some(tracked) => tracked.sender.send(output),")
ORDER = both(
    _PY_PER_REQUEST, _PY_QUEUE,
    py("vllm/v1/engine/output_processor.py:79",
       "self.output.add(output, aggregate=self.aggregate)"),
    _RS_DISPATCH, _RS_SEND,
    rs("rust/src/engine-core-client/src/client/output_channel.rs:13",
       "Outputs are never merged, reordered, or dropped here"))
# An engine FinishReason maps to its name.
_PY_FINISH_NAMES = py("vllm/v1/engine/__init__.py:37",
                      'FINISH_REASON_STRINGS = ("stop", "length", "abort", "error", "repetition")')
_PY_FINISH_STR = py("vllm/v1/engine/output_processor.py:525",
                    "finish_reason=str(finish_reason) if finished else None,")
_RS_FINISH_MAP = rs("rust/src/llm/src/output.rs:152", "finish_reason.map(|reason| match reason {")


FINISH_LENGTH = both(_PY_FINISH_NAMES, _PY_FINISH_STR, _RS_FINISH_MAP,
                     rs("rust/src/llm/src/output.rs:154",
                        "EngineCoreFinishReason::Length => FinishReason::Length,"),
                     rs("rust/src/server/src/routes/openai/completions.rs:497",
                        'FinishReason::Length => Ok("length"),'))
FINISH_STOP = both(_PY_FINISH_NAMES, _PY_FINISH_STR, _RS_FINISH_MAP,
                   rs("rust/src/llm/src/output.rs:153",
                      "EngineCoreFinishReason::Stop => FinishReason::Stop(stop_reason),"),
                   rs("rust/src/server/src/routes/openai/completions.rs:495",
                      'FinishReason::Stop(_) => Ok("stop"),'))
FINISH_ABORT = both(_PY_FINISH_NAMES, _PY_FINISH_STR, _RS_FINISH_MAP,
                    rs("rust/src/llm/src/output.rs:155",
                       "EngineCoreFinishReason::Abort => FinishReason::Abort,"),
                    rs("rust/src/server/src/routes/openai/completions.rs:498",
                       'FinishReason::Abort => Ok("abort"),'))
FINISH_REPETITION = both(_PY_FINISH_NAMES, _PY_FINISH_STR, _RS_FINISH_MAP,
                         rs("rust/src/llm/src/output.rs:157",
                            "EngineCoreFinishReason::Repetition => FinishReason::Repetition"),
                         rs("rust/src/server/src/routes/openai/completions.rs:496",
                            'FinishReason::Repetition(_) => Ok("repetition"),'))
# An output for an id the frontend does not track (unknown, or already ended) is dropped.
_PY_UNKNOWN = py("vllm/v1/engine/output_processor.py:761",
                 "# Ignore output for already-aborted request.")
_RS_UNKNOWN = rs("rust/src/engine-core-client/src/client/imp.rs:467",
                 '"dropping output for inactive request"')
UNKNOWN_ID = both(_PY_UNKNOWN, _RS_UNKNOWN,
                  rs("rust/src/engine-core-client/src/client/state.rs:260",
                     "None => return Some(output),"))
END_ONCE = both(_PY_UNKNOWN,
                py("vllm/v1/engine/output_processor.py:919", "self.request_states.pop(req_id)"),
                rs("rust/src/engine-core-client/src/client/state.rs:253",
                   "match self.remove(output.request_id.as_str()) {"),
                _RS_UNKNOWN,
                rs("rust/src/engine-core-client/src/client/stream.rs:164",
                   "if self.is_terminated() {"))
EMPTY_DELTA = both(py("vllm/v1/engine/detokenizer.py:103", "if not new_token_ids:"),
                   _PY_QUEUE, _RS_SEND,
                   rs("rust/src/text/src/output/decoded.rs:194",
                      "for (tok_idx, &token_id) in decodable_token_ids.iter().enumerate() {"))
BATCHED = both(_PY_PER_REQUEST, _PY_QUEUE, _RS_DISPATCH, _RS_SEND)
# A request without output has its own queue/channel: nothing waits on it.
DEFERRED = both(_PY_PER_REQUEST, _PY_QUEUE,
                py("vllm/v1/engine/output_processor.py:759",
                   "req_state = self.request_states.get(req_id)"),
                _RS_SEND,
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
STATS = both(py("vllm/v1/engine/core_client.py:1259",
                "if outputs.outputs or outputs.scheduler_stats:"),
             py("vllm/v1/engine/async_llm.py:924",
                "output_processor.update_scheduler_stats(outputs.scheduler_stats)"),
             rs("rust/src/engine-core-client/src/client/imp.rs:490",
                "if !inner.apply_scheduler_stats(batch.engine_index, scheduler_stats) {"),
             rs("rust/src/engine-core-client/src/client/state.rs:251",
                "self.apply_lora_events(&output.output);"))


async def _one(ctx: CaseContext, steps: list, max_tokens: int = 16):  # type: ignore[no-untyped-def,type-arg]
    p = prompt(0)
    group = await ctx.start([EngineScript(rules=[by_prompt(p, steps)])])
    handle = await ctx.driver.generate(p, max_tokens)
    await handle.wait(ctx.t(3))
    return group, handle


@case("streaming.order.preserved", Level.MUST,
      "Tokens delivered over several chunks reach the client complete and in order.",
      grounds=ORDER, needs=GEN)
async def order_preserved(ctx: CaseContext) -> None:
    steps = [Emit([100, 101]), Emit([102]), Emit([103, 104, 105]), Finish(F.LENGTH, [106])]
    _g, h = await _one(ctx, steps, 7)
    ctx.require(h.tokens == list(range(100, 107)), expected="tokens 100..106 in order",
                observed=h.tokens)


async def _finish_name(ctx: CaseContext, reason: m.FinishReason, name: str, **kw: object
                       ) -> None:
    _g, h = await _one(ctx, [Emit([100]), Finish(reason, [101], **kw)])  # type: ignore[arg-type]
    ctx.require(h.finish_reason == name, expected=f"finish_reason {name!r}",
                observed=f"{h.finish_reason!r} error={h.error}")


@case("streaming.finish.length", Level.MUST, "FinishReason.LENGTH maps to 'length'.",
      grounds=FINISH_LENGTH, needs=GEN)
async def finish_length(ctx: CaseContext) -> None:
    await _finish_name(ctx, F.LENGTH, "length")


@case("streaming.finish.stop", Level.MUST, "FinishReason.STOP maps to 'stop'.",
      grounds=FINISH_STOP, needs=GEN)
async def finish_stop(ctx: CaseContext) -> None:
    await _finish_name(ctx, F.STOP, "stop", stop_reason=101)


@case("streaming.finish.engine_cancelled", Level.MUST,
      "An engine-side FinishReason.ABORT maps to 'abort'.", grounds=FINISH_ABORT, needs=GEN)
async def finish_engine_cancelled(ctx: CaseContext) -> None:
    await _finish_name(ctx, F.ABORT, "abort")


@case("streaming.finish.repetition", Level.MUST,
      "FinishReason.REPETITION maps to 'repetition'.", grounds=FINISH_REPETITION, needs=GEN)
async def finish_repetition(ctx: CaseContext) -> None:
    await _finish_name(ctx, F.REPETITION, "repetition", stop_reason="repetition_detected")


@case("streaming.unknown_id.ignored", Level.MUST,
      "Outputs for request ids the frontend does not know are ignored.", grounds=UNKNOWN_ID,
      needs=GEN)
async def unknown_id(ctx: CaseContext) -> None:
    from harness.protocol.wire import codec_for

    ghost = codec_for(ctx.profile).encode_outputs(m.EngineCoreOutputs(
        0, [m.EngineCoreOutput("ghost-request", [555], finish_reason=F.LENGTH)], None, 1.0))
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
    from harness.protocol.wire import codec_for

    codec = codec_for(ctx.profile)

    def steps(request: m.EngineCoreRequest) -> list[Step]:
        rid = request.request_id
        ghosts = codec.encode_outputs(m.EngineCoreOutputs(0, [
            m.EngineCoreOutput(ghost, [555], finish_reason=F.LENGTH)
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
    late = group.codec.encode_outputs(m.EngineCoreOutputs(
        0, [m.EngineCoreOutput(rid, [777], finish_reason=F.STOP)], None, 2.0))
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


@case("streaming.text.detokenized", Level.MUST,
      "Streamed tokens come with their text (' t100 t101' for the tiny fixture).",
      grounds=TEXT, needs=GEN)
async def text(ctx: CaseContext) -> None:
    _g, h = await _one(ctx, stream([100, 101]), 2)
    ctx.require(h.text.split() == ["t100", "t101"], expected="text ' t100 t101'",
                observed=repr(h.text))


# (variant, engine steps, stop strings asked, tokens, exact text) of an engine STOP.
STOP_TEXT_VARIANTS: tuple[tuple[str, list[Step], list[str] | None, list[int], str], ...] = (
    ("own_output", [Emit([200]), Finish(F.STOP, [201], stop_reason=201)], None,
     [200, 201], " t200"),
    ("in_final_chunk", [Emit([100]), Finish(F.STOP, [200, 201], stop_reason=201)], None,
     [100, 200, 201], " t100 t200"),
    ("stop_strings_asked", [Emit([200]), Finish(F.STOP, [201], stop_reason=201)], ["zzz"],
     [200, 201], " t200"),
    # The left-out text is never searched: " t201" does not match, the text keeps no
    # trailing space (a match would have cut it to " t200 ").
    ("stop_string_in_left_out_text", [Emit([200]), Finish(F.STOP, [201], stop_reason=201)],
     ["t201"], [200, 201], " t200"),
)


def _make_stop_text(variant: str, steps: list[Step], stop: list[str] | None,
                    tokens: list[int], text: str) -> None:
    needs = [*GEN, Capability.STOP_STRINGS] if stop else GEN

    @case(f"streaming.text.stop_finish_last_token_silent_{variant}", Level.MUST,
          "When the engine ends a request with STOP (a stop token id), the client gets every "
          f"token, the stop token too, and the text without the stop token's: tokens {tokens}, "
          f"text {text!r}" + (f" (stop strings {stop} asked)." if stop else "."),
          grounds=STOP_TEXT, needs=needs)
    async def run(ctx: CaseContext) -> None:
        p = prompt(0)
        await ctx.start([EngineScript(rules=[by_prompt(p, steps)])])
        handle = await ctx.driver.generate(p, 8, stop=stop)
        await handle.wait(ctx.t(3))
        seen = (handle.tokens, handle.text, handle.finish_reason)
        ctx.require(seen == (tokens, text, "stop"),
                    expected=f"tokens {tokens}, text {text!r}, finish stop",
                    observed=f"tokens {handle.tokens}, text {handle.text!r}, finish "
                             f"{handle.finish_reason} error={handle.error}")

    run.__name__ = run.__qualname__ = f"stop_finish_text_{variant}"
    globals()[run.__name__] = run


for _variant in STOP_TEXT_VARIANTS:
    _make_stop_text(*_variant)


@case("streaming.stats.tolerated", Level.MUST,
      "Scheduler stats on step messages, request events and stats-only messages (what an "
      "engine under `vllm serve`'s default log_stats sends) do not disturb streams.",
      grounds=STATS, needs=GEN)
async def stats_tolerated(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(log_stats=True)])
    handles = [await ctx.driver.generate(prompt(i), 3) for i in range(2)]
    for h in handles:
        await h.wait(ctx.t(3))
    await ctx.quiet(0.1)
    later = await ctx.driver.generate(prompt(5), 2)
    await later.wait(ctx.t(3))
    stats_only = [r for r in group.transcript.select(direction="out", channel="output")
                  if isinstance(r.message, m.EngineCoreOutputs) and not r.message.outputs
                  and r.message.scheduler_stats is not None]
    ctx.note(f"{len(stats_only)} stats-only messages sent")
    bad = [(h.tokens, h.finish_reason, h.error) for h in [*handles, later]
           if h.finish_reason != "length"]
    ctx.require(not bad, expected="every stream completes with length", observed=bad)
