"""Finish kinds x phases x engine counts, and frontend-side stop strings across chunks.

Every engine-side ending (length, EOS, a stop token id, an engine abort and a per-request
error, each before any token and after some) must end exactly its own stream with its own
reason while neighbouring streams on the same and on other engines keep streaming; the
frontend keeps serving afterwards. Stop strings are the frontend's own ending: matched
across chunk boundaries (two, three chunks, mid-token), at the very first token, inside a
multi-token chunk (later tokens dropped) and in the engine's final output (no ABORT owed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, py, rs
from harness.cases.helpers import prompt, request_for
from harness.frontends.api import Capability, StreamHandle
from harness.protocol.vocab import EOS_TOKEN_ID
from harness.protocol.wire import messages as m
from harness.results.records import Level
from mock_engines.script import Emit, EngineScript, Finish, Rule, Step, by_prompt

F = m.FinishReason
# An engine-side ending finishes its own request's stream with the reason's name; the
# request leaves the frontend's table, its neighbours are untouched.
_PY_OWN = (py("vllm/v1/engine/output_processor.py:759",
              "req_state = self.request_states.get(req_id)"),
           py("vllm/v1/engine/output_processor.py:525",
              "finish_reason=str(finish_reason) if finished else None,"),
           py("vllm/v1/engine/__init__.py:37",
              'FINISH_REASON_STRINGS = ("stop", "length", "abort", "error", "repetition")'),
           py("vllm/v1/engine/output_processor.py:877", "self._finish_request(req_state)"))
_RS_OWN = (rs("rust/src/engine-core-client/src/client/state.rs:253",
              "match self.remove(output.request_id.as_str()) {"),
           rs("rust/src/engine-core-client/src/client/state.rs:259",
              "Some(tracked) => tracked.sender.send(output),"))
FINISH = {
    "length": both(*_PY_OWN, *_RS_OWN,
                   rs("rust/src/llm/src/output.rs:154",
                      "EngineCoreFinishReason::Length => FinishReason::Length,"),
                   rs("rust/src/server/src/routes/openai/completions.rs:497",
                      'FinishReason::Length => Ok("length"),')),
    "stop": both(*_PY_OWN,
                 py("vllm/v1/engine/detokenizer.py:107",
                    "if stop_terminated and not self.include_stop_str_in_output:"),
                 *_RS_OWN,
                 rs("rust/src/llm/src/output.rs:153",
                    "EngineCoreFinishReason::Stop => FinishReason::Stop(stop_reason),"),
                 rs("rust/src/server/src/routes/openai/completions.rs:495",
                    'FinishReason::Stop(_) => Ok("stop"),')),
    "abort": both(*_PY_OWN, *_RS_OWN,
                  rs("rust/src/llm/src/output.rs:155",
                     "EngineCoreFinishReason::Abort => FinishReason::Abort,"),
                  rs("rust/src/server/src/routes/openai/completions.rs:498",
                     'FinishReason::Abort => Ok("abort"),')),
    "error": both(*_PY_OWN, *_RS_OWN,
                  rs("rust/src/llm/src/output.rs:156",
                     "EngineCoreFinishReason::Error => FinishReason::Error(error),"),
                  rs("rust/src/server/src/routes/openai/completions.rs:499",
                     "FinishReason::Error(error) => Err(engine_error(error.as_deref())),")),
    "repetition": both(*_PY_OWN, *_RS_OWN,
                       rs("rust/src/llm/src/output.rs:157",
                          "EngineCoreFinishReason::Repetition => FinishReason::Repetition"),
                       rs("rust/src/server/src/routes/openai/completions.rs:496",
                          'FinishReason::Repetition(_) => Ok("repetition"),')),
}
# Stop strings: the earliest match, text and tokens cut at it, and one ABORT to the owning
# engine unless the engine had finished the request itself.
_STOP_CITES = (
    py("vllm/v1/engine/detokenizer.py:351",
       "stop_index = output_text.find(stop_str, 1 - new_char_count - stop_string_len)"),
    py("vllm/v1/engine/detokenizer.py:373", "return best_stop_str, best_stop_index"),
    py("vllm/v1/engine/detokenizer.py:151",
       "del self.token_ids[first_new_token_index + num_kept :]"),
    py("vllm/v1/engine/output_processor.py:878",
       "if req_state.streaming_input or not engine_core_output.finished:"),
    py("vllm/v1/engine/async_llm.py:920", "await engine_core.abort_requests_async("),
    rs("rust/src/text/src/output/decoded.rs:198",
       "matches_stop_string(stops, decoder.output(), new_bytes)"),
    rs("rust/src/text/src/output/decoded.rs:203", "false => Some(off),"),
    rs("rust/src/text/src/output/decoded.rs:206", "truncate_tokens_to = Some(tok_idx + 1);"),
    rs("rust/src/text/src/output/decoded.rs:302",
       "AbortCause::StopStringMatched.drop_as(raw_stream);"),
    rs("rust/src/engine-core-client/src/client/stream.rs:224", "if self.is_terminated() {"))
STOP = both(*_STOP_CITES)
STOP_OWNERS = both(
    *_STOP_CITES,
    py("vllm/v1/engine/core_client.py:1895", "elif engine := self.reqs_in_flight.get(req_id):"),
    rs("rust/src/engine-core-client/src/client/imp.rs:388",
       "let Some(engine_id) = inner.take_auto_abort_target(&request_id) else {"),
    rs("rust/src/engine-core-client/src/client/imp.rs:406",
       "by_engine.entry(engine_id).or_default().push(request_id);"))
GEN = [Capability.GENERATE]
ERR = [Capability.GENERATE, Capability.REQUEST_ERRORS]


@dataclass(frozen=True)
class Ending:
    """One engine-side way a request ends: its steps and what the client must see."""

    name: str
    steps: tuple[Step, ...]
    reason: str  # the client-visible finish_reason ("error": error ending)
    tokens: tuple[int, ...]
    text: str


ENDINGS = [
    Ending("length", (Emit([200]), Finish(F.LENGTH, [201], 0.05)), "length", (200, 201),
           "length with the last token in the final output"),
    Ending("stop_eos", (Emit([200]), Finish(F.STOP, [EOS_TOKEN_ID], 0.05)), "stop",
           (200, EOS_TOKEN_ID), "stop at EOS (stop_reason None)"),
    Ending("stop_token_id", (Emit([200]), Finish(F.STOP, [201], 0.05, stop_reason=201)),
           "stop", (200, 201), "stop at a stop_token_ids token (stop_reason = the token)"),
    Ending("abort_first", (Finish(F.ABORT, delay=0.05),), "abort", (),
           "an engine-side ABORT before any token"),
    Ending("abort_mid", (Emit([200]), Emit([201], 0.02), Finish(F.ABORT, delay=0.03)),
           "abort", (200, 201), "an engine-side ABORT after two tokens"),
    Ending("error_first", (Finish(F.ERROR, delay=0.05),), "error", (),
           "a per-request ERROR before any token"),
    Ending("error_mid", (Emit([200]), Emit([201], 0.02), Finish(F.ERROR, delay=0.03)),
           "error", (200, 201), "a per-request ERROR after two tokens"),
    Ending("repetition", (Emit([200]), Finish(F.REPETITION, [201], 0.05,
                                                stop_reason="repetition_detected")),
           "repetition", (200, 201),
           "a REPETITION finish with the last token in the final output"),
]


def _neighbour_steps(i: int) -> list[Step]:
    """Three tokens spread over ~0.15 s, so each target ends while its neighbours stream."""
    base = 300 + 10 * i
    return [Emit([base], 0.02), Emit([base + 1], 0.06), Finish(F.LENGTH, [base + 2], 0.06)]


def _ended_as(h: StreamHandle, reason: str) -> bool:
    if reason == "error":
        return h.finish_reason == "error" or (h.error is not None and h.finish_reason
                                              not in ("length", "stop", "abort"))
    return h.finish_reason == reason and h.error is None


def _make_finish_case(ending: Ending, engines: int) -> None:
    case_id = f"streaming.finish_kinds.{ending.name}_{engines}_engines"

    @case(case_id, Level.MUST,
          f"With {engines} engine(s), {ending.text} ends exactly that stream with "
          f"'{ending.reason}' and the tokens sent before it; neighbour streams on every "
          "engine complete untouched and the frontend keeps serving.",
          grounds=FINISH[ending.reason], needs=ERR if ending.reason == "error" else GEN)
    async def run(ctx: CaseContext) -> None:
        targets = [prompt(i) for i in range(engines)]
        neighbours = [prompt(100 + i) for i in range(engines)]
        rules: list[Rule] = [by_prompt(p, list(ending.steps)) for p in targets]
        rules += [by_prompt(p, _neighbour_steps(i)) for i, p in enumerate(neighbours)]
        group = await ctx.start([EngineScript(rules=list(rules)) for _ in range(engines)])
        t_handles = [await ctx.driver.generate(p, 8) for p in targets]
        n_handles = [await ctx.driver.generate(p, 3) for p in neighbours]
        await ctx.wait_until(lambda: all(h.ended for h in [*t_handles, *n_handles]), 3)
        owners = [request_for(group, p) for p in targets]
        ctx.note(f"targets on engines {[o[0] if o else None for o in owners]}")
        bad = [(h.finish_reason, h.error, h.tokens) for h in t_handles
               if not (h.ended and _ended_as(h, ending.reason)
                       and tuple(h.tokens) == ending.tokens)]
        ctx.require(not bad, expected=f"every target ends '{ending.reason}' with tokens "
                                      f"{list(ending.tokens)}",
                    observed=f"{len(bad)} of {engines} differ, e.g. {bad[:2]}")
        bad = [(h.finish_reason, h.error, h.tokens) for i, h in enumerate(n_handles)
               if not (h.ended and h.finish_reason == "length"
                       and h.tokens == [300 + 10 * i + k for k in range(3)])]
        ctx.require(not bad, expected="every neighbour completes with its 3 tokens, 'length'",
                    observed=f"{len(bad)} of {engines} differ, e.g. {bad[:2]}")
        later = await ctx.driver.generate(prompt(500), 2)
        await later.wait(ctx.t(3))
        ctx.require(later.finish_reason == "length" and later.tokens == [100, 101],
                    expected="a later request completes normally",
                    observed=f"{later.finish_reason} {later.tokens} error={later.error}")

    run.__name__ = run.__qualname__ = f"finish_{ending.name}_{engines}"
    globals()[run.__name__] = run


for _ending in ENDINGS:
    for _engines in (1, 2, 3, 4):
        _make_finish_case(_ending, _engines)


# ----------------------------------------------------------------- stop strings

STOP_NEEDS = [Capability.GENERATE, Capability.STOP_STRINGS]


@dataclass(frozen=True)
class StopShape:
    """A stop string against a scripted chunking: expected text, tokens, ABORT owed."""

    name: str
    text: str
    chunks: tuple[tuple[int, ...], ...]
    final: bool  # the last chunk is the engine's final output (LENGTH)
    stop: str
    want_text: str  # stripped text the client must see
    want_tokens: tuple[int, ...]


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


def _stop_steps(shape: StopShape) -> list[Step]:
    steps: list[Step] = [Emit(list(c), 0.03) for c in shape.chunks]
    if shape.final:
        steps[-1] = Finish(F.LENGTH, list(shape.chunks[-1]), 0.03)
    # Not final: the script ends without Finish and the request stays open until aborted.
    return steps


def _make_stop_case(shape: StopShape) -> None:
    @case(f"streaming.stop_string.{shape.name}", Level.MUST,
          f"For {shape.text}, the stream ends with 'stop', text up to the stop string "
          f"({shape.want_text!r}), tokens up to the one completing it, and "
          + ("no ABORT." if shape.final else "exactly one ABORT to its engine."),
          grounds=STOP, needs=STOP_NEEDS)
    async def run(ctx: CaseContext) -> None:
        p = prompt(0)
        group = await ctx.start([EngineScript(rules=[by_prompt(p, _stop_steps(shape))])])
        h = await ctx.driver.generate(p, 50, stop=[shape.stop])
        ended = await ctx.wait_until(lambda: h.ended, 3)
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

    run.__name__ = run.__qualname__ = f"stop_{shape.name}"
    globals()[run.__name__] = run


for _shape in STOP_SHAPES:
    _make_stop_case(_shape)


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
