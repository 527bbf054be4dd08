"""How a request ends: finish reasons, every engine-side ending, and request errors.

An engine FinishReason maps to its name ('length', 'stop', 'abort', 'error',
'repetition'). Each way an engine can end one request (LENGTH, STOP at EOS or a stop token
id, an engine-side ABORT or a per-request ERROR before or after tokens, REPETITION) ends
exactly that stream with its reason and the tokens sent before it, with 1 to 4 engines,
while neighbour streams on every engine complete untouched and the frontend keeps
serving. An engine's per-request RequestError carries a message meant for the user
("Generation is paused, retry"): a port that ends the stream with a bare "error" or with
no error at all throws it away.
"""

from __future__ import annotations

from dataclasses import dataclass

from conformance.streaming.helpers import GEN, F, describe, ended_as
from harness.cases.authoring import (
    EOS_TOKEN_ID,
    Capability,
    CaseContext,
    Emit,
    EngineScript,
    Finish,
    Grounds,
    Level,
    Rule,
    Step,
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

ERR = [Capability.GENERATE, Capability.REQUEST_ERRORS]
# An engine FinishReason maps to its name.
_PY_FINISH_NAMES = py("vllm/v1/engine/__init__.py:37",
                      'FINISH_REASON_STRINGS = ("stop", "length", "abort", "error", "repetition")')
_PY_FINISH_STR = py("vllm/v1/engine/output_processor.py:525",
                    "finish_reason=str(finish_reason) if finished else None,")
_RS_FINISH_MAP = rs("rust/src/llm/src/output.rs:152", "finish_reason.map(|reason| match reason {")
# Rust's name for each reason: the engine's reason mapped, then written for the client.
_RS_NAMED = {
    "length": (rs("rust/src/llm/src/output.rs:154",
                  "EngineCoreFinishReason::Length => FinishReason::Length,"),
               rs("rust/src/server/src/routes/openai/completions.rs:497",
                  'FinishReason::Length => Ok("length"),')),
    "stop": (rs("rust/src/llm/src/output.rs:153",
                "EngineCoreFinishReason::Stop => FinishReason::Stop(stop_reason),"),
             rs("rust/src/server/src/routes/openai/completions.rs:495",
                'FinishReason::Stop(_) => Ok("stop"),')),
    "abort": (rs("rust/src/llm/src/output.rs:155",
                 "EngineCoreFinishReason::Abort => FinishReason::Abort,"),
              rs("rust/src/server/src/routes/openai/completions.rs:498",
                 'FinishReason::Abort => Ok("abort"),')),
    "error": (rs("rust/src/llm/src/output.rs:156",
                 "EngineCoreFinishReason::Error => FinishReason::Error(error),"),
              rs("rust/src/server/src/routes/openai/completions.rs:499",
                 "FinishReason::Error(error) => Err(engine_error(error.as_deref())),")),
    "repetition": (rs("rust/src/llm/src/output.rs:157",
                      "EngineCoreFinishReason::Repetition => FinishReason::Repetition"),
                   rs("rust/src/server/src/routes/openai/completions.rs:496",
                      'FinishReason::Repetition(_) => Ok("repetition"),')),
}


def _named(reason: str) -> Grounds:
    """The grounds of a reason's name: python's strings, rust's mapping of that reason."""
    return both(_PY_FINISH_NAMES, _PY_FINISH_STR, _RS_FINISH_MAP, *_RS_NAMED[reason])


# An engine-side ending finishes its own request's stream with the reason's name; the
# request leaves the frontend's table, its neighbours are untouched.
_PY_OWN = (py("vllm/v1/engine/output_processor.py:759",
              "req_state = self.request_states.get(req_id)"),
           _PY_FINISH_STR, _PY_FINISH_NAMES,
           py("vllm/v1/engine/output_processor.py:877", "self._finish_request(req_state)"))
_RS_OWN = (rs("rust/src/engine-core-client/src/client/state.rs:253",
              "match self.remove(output.request_id.as_str()) {"),
           rs("rust/src/engine-core-client/src/client/state.rs:259",
              "Some(tracked) => tracked.sender.send(output),"))
FINISH = {reason: both(*_PY_OWN, *_RS_OWN, *_RS_NAMED[reason])
          for reason in ("length", "abort", "error", "repetition")}
FINISH["stop"] = both(*_PY_OWN,
                      py("vllm/v1/engine/detokenizer.py:107",
                         "if stop_terminated and not self.include_stop_str_in_output:"),
                      *_RS_OWN, *_RS_NAMED["stop"])
# The engine's RequestError message reaches the caller (python raises it; rust answers a
# retryable one with its message).
REQUEST_ERROR = both(
    py("vllm/v1/engine/output_processor.py:767", "req_state.queue.put(error.to_exception())"),
    py("vllm/outputs.py:34", "return RetryableRequestError(self.message)"),
    _RS_NAMED["error"][0],
    rs("rust/src/server/src/error.rs:124", "message: error.message.clone(),"),
    note="rust forwards the message only for retryable or validation errors (error.rs:126 "
    "answers 'Internal server error' otherwise); the case's error is retryable")


# ----------------------------------------------------------------- finish reason names


async def _finish_name(ctx: CaseContext, reason: messages.FinishReason, name: str,
                       **kw: object) -> None:
    p = prompt(0)
    steps = [Emit([100]), Finish(reason, [101], **kw)]  # type: ignore[arg-type]
    await ctx.start([EngineScript(rules=[by_prompt(p, steps)])])
    h = await ctx.driver.generate(p, 16)
    await h.wait(ctx.t(3))
    ctx.require(h.finish_reason == name, expected=f"finish_reason {name!r}",
                observed=f"{h.finish_reason!r} error={h.error}")


@case("streaming.finish.length", Level.MUST, "FinishReason.LENGTH maps to 'length'.",
      grounds=_named("length"), needs=GEN)
async def finish_length(ctx: CaseContext) -> None:
    await _finish_name(ctx, F.LENGTH, "length")


@case("streaming.finish.stop", Level.MUST, "FinishReason.STOP maps to 'stop'.",
      grounds=_named("stop"), needs=GEN)
async def finish_stop(ctx: CaseContext) -> None:
    await _finish_name(ctx, F.STOP, "stop", stop_reason=101)


@case("streaming.finish.engine_cancelled", Level.MUST,
      "An engine-side FinishReason.ABORT maps to 'abort'.", grounds=_named("abort"),
      needs=GEN)
async def finish_engine_cancelled(ctx: CaseContext) -> None:
    await _finish_name(ctx, F.ABORT, "abort")


@case("streaming.finish.repetition", Level.MUST,
      "FinishReason.REPETITION maps to 'repetition'.", grounds=_named("repetition"),
      needs=GEN)
async def finish_repetition(ctx: CaseContext) -> None:
    await _finish_name(ctx, F.REPETITION, "repetition", stop_reason="repetition_detected")


# ----------------------------------------------------------------- every ending, 1-4 engines


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


@case("streaming.finish_kinds.{ending.name}_{engines}_engines", Level.MUST,
      "With {engines} engine(s), {ending.text} ends exactly that stream with "
      "'{ending.reason}' and the tokens sent before it; neighbour streams on every "
      "engine complete untouched and the frontend keeps serving.",
      params=[{"ending": ending, "engines": engines, "grounds": FINISH[ending.reason],
               "needs": ERR if ending.reason == "error" else GEN}
              for ending in ENDINGS for engines in (1, 2, 3, 4)])
async def finish_kind(ctx: CaseContext, ending: Ending, engines: int) -> None:
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
           if not (h.ended and ended_as(h, ending.reason)
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


# ----------------------------------------------------------------- request errors

ERROR_TEXT = "Generation is paused. Please retry after it resumes."
PHASES: dict[str, list[Step]] = {
    "before_first_token": [],
    "after_tokens": [Emit([100]), Emit([101], 0.02)],
}


@case("streaming.request_error.message_reaches_client_{phase}_{engines}_engines",
      Level.MUST,
      "With {engines} engine(s), a request the engine ends with ERROR and a "
      "RequestError ({phase}) ends with finish_reason 'error' and an error that carries "
      "the engine's message for the user; its neighbour on the same engine completes.",
      grounds=REQUEST_ERROR,
      needs=ERR,
      params=[{"phase": phase, "engines": n} for phase in PHASES for n in (1, 2)])
async def error_message(ctx: CaseContext, phase: str, engines: int) -> None:
    failing = [prompt(i) for i in range(engines)]
    neighbours = [prompt(100 + i) for i in range(engines)]
    steps = [*PHASES[phase], Finish(F.ERROR, delay=0.03, error=messages.RequestError(
        "engine_paused", ERROR_TEXT, True))]
    rules = [*(by_prompt(p, steps) for p in failing),
             *(by_prompt(p, stream([300, 301, 302], 0.03)) for p in neighbours)]
    await ctx.start([EngineScript(rules=list(rules)) for _ in range(engines)])
    bad_h = [await ctx.driver.generate(p, 10) for p in failing]
    ok_h = [await ctx.driver.generate(p, 3) for p in neighbours]
    await ctx.wait_until(lambda: all(h.ended for h in [*bad_h, *ok_h]), 3)
    wrong = [describe(h) for h in bad_h
             if not (h.finish_reason == "error" and ERROR_TEXT in (h.error or ""))]
    ctx.require(not wrong, expected=f"finish_reason 'error', error text containing "
                                    f"{ERROR_TEXT!r}",
                observed="; ".join(wrong[:2]))
    wrong = [describe(h) for h in ok_h
             if not (h.finish_reason == "length" and h.tokens == [300, 301, 302])]
    ctx.require(not wrong, expected="every neighbour completes with [300, 301, 302]",
                observed="; ".join(wrong[:2]))
