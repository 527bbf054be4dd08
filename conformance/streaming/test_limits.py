"""Request limits a frontend enforces itself: min_tokens against stop strings, and the
requests no engine may be sent at all.

Both vLLM 0.33.0 frontends check stop strings only from token min_tokens + 1 on: a stop
string completing inside the first min_tokens tokens is ignored, one that starts there and
completes later counts (the text of the first min_tokens tokens is never searched on its
own). And both refuse at submission, before any ADD: an empty prompt, a prompt longer than
the max_model_len the engines agreed on (the minimum of their ready responses), a request
whose min_tokens exceeds its max_tokens. A port that forwards them sends an engine a
request vLLM's engines were crashed by (vLLM issue #7632, issue #4365).

These cases were written after the round-3 history mutants (docs/mutation-history.md)
were measured against the suite without them.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.cases.authoring import (
    DEFAULT_MAX_MODEL_LEN,
    Capability,
    CaseContext,
    Emit,
    EngineScript,
    FrontendError,
    Level,
    Sampling,
    Step,
    StreamHandle,
    both,
    by_prompt,
    case,
    default_ready,
    prompt,
    py,
    request_for,
    rs,
    stream,
)

_DETOK = "vllm/v1/engine/detokenizer.py"
_DECODED = "rust/src/text/src/output/decoded.rs"
_IP = "vllm/v1/engine/input_processor.py"
_LOWER = "rust/src/text/src/lower.rs"

# Stop strings are checked only from token min_tokens + 1 on; a match must end beyond the
# text of the first min_tokens tokens (it may start inside it).
STOP_AFTER_MIN_TOKENS = both(
    py(f"{_DETOK}:134",
       "if token_offsets is not None and self.num_output_tokens() > self.min_tokens:"),
    py(f"{_DETOK}:136",
       "stop_check_offset = token_offsets[max(self.min_tokens - num_prev_tokens, 0)]"),
    py(f"{_DETOK}:139", "new_char_count=len(self.output_text) - stop_check_offset,"),
    rs(f"{_DECODED}:196",
       "if output_token_count + tok_idx + 1 > decode_options.min_tokens as usize"),
    rs(f"{_DECODED}:198", "matches_stop_string(stops, decoder.output(), new_bytes)"),
    rs(f"{_DECODED}:817", "async fn min_tokens_suppresses_early_stop_string() {"),
    rs("rust/src/server/src/routes/openai/completions/convert.rs:161",
       "min_tokens: request.min_tokens.unwrap_or(0),"),
    py("vllm/v1/engine/async_llm.py:920", "await engine_core.abort_requests_async("),
    rs(f"{_DECODED}:302", "AbortCause::StopStringMatched.drop_as(raw_stream);"))
EMPTY_PROMPT_REFUSED = both(
    py(f"{_IP}:565", 'if prompt_len == 0 and prompt_type == "decoder":'),
    py(f"{_IP}:566", 'raise VLLMValidationError(f"The {prompt_type} prompt cannot be empty")'),
    rs("rust/src/llm/src/request.rs:74", "if self.prompt_token_ids.is_empty() {"),
    rs("rust/src/text/src/request.rs:295",
       "if matches!(&self.prompt, Prompt::TokenIds(ids) if ids.is_empty()) {"),
    note="vLLM issue #7632 (PR #7746): an empty prompt that reached the engine took it down")
PROMPT_OVER_CONTEXT_REFUSED = both(
    py("vllm/renderers/params.py:536", "if len(tokens) > max_input_tokens:"),
    py(f"{_IP}:574", "if prompt_len > max_prompt_len:"),
    py(f"{_IP}:569", "model_config.max_model_len"),
    py("vllm/v1/engine/core_client.py:869", "vllm_config.model_config.max_model_len = min("),
    rs(f"{_LOWER}:372", "match prompt_len.cmp(&max_model_len) {"),
    rs(f"{_LOWER}:374", "return Err(Error::PromptTooLong {"),
    rs("rust/src/engine-core-client/src/client.rs:547",
       ".map(|engine| engine.ready_response.max_model_len as u32)"),
    note="vLLM PR #45035: an over-length prompt is a per-request refusal, never an ADD")
# A prompt exactly max_model_len long leaves no room for the one token a generate request
# must produce: Python refuses it after the over-length check, Rust before resolving
# max_tokens (an ADD would be a request the engine can only cut at once).
PROMPT_FILLS_CONTEXT_REFUSED = both(
    py(f"{_IP}:593",
       'elif prompt_len == max_prompt_len and model_config.runner_type == "generate":'),
    py(f"{_IP}:600", 'f"requested output tokens (at least 1) is longer than the maximum "'),
    rs(f"{_LOWER}:381",
       "Ordering::Equal => return Err(Error::PromptFillsContext { max_model_len }),"),
    rs("rust/src/engine-core-client/src/client.rs:547",
       ".map(|engine| engine.ready_response.max_model_len as u32)"))
MIN_TOKENS_OVER_MAX_REFUSED = both(
    py("vllm/sampling_params.py:701",
       "if self.max_tokens is not None and self.min_tokens > self.max_tokens:"),
    rs(f"{_LOWER}:186", "if min_tokens > max_tokens {"),
    rs(f"{_LOWER}:187", "return Err(Error::MinTokensExceedsMaxTokens {"),
    note="vLLM issue #4365: min_tokens above max_tokens failed in the engine's sampler")

SERVED = (300, 301, 302)  # what a served request's scripted engine streams
STOP_NEEDS = [Capability.GENERATE, Capability.STOP_STRINGS, Capability.SAMPLING]
REFUSAL_NEEDS = [Capability.GENERATE]


# ------------------------------------------------------------ min_tokens and stop strings

async def _min_tokens_stop(ctx: CaseContext, steps: Sequence[Step], stop: str,
                           min_tokens: int, want_text: str, want_tokens: list[int],
                           want_reason: str, aborted: bool) -> None:
    """One stream with stop=[stop] and min_tokens over the scripted steps: exactly
    `want_text`, `want_tokens` and `want_reason`; an ABORT at its engine iff `aborted`."""
    p = prompt(0)
    group = await ctx.start([EngineScript(rules=[by_prompt(p, list(steps))])])
    handle = await ctx.driver.generate(p, 50, stop=[stop],
                                       sampling=Sampling(min_tokens=min_tokens))
    ended = await ctx.wait_until(lambda: handle.ended, 3)
    seen = (handle.finish_reason, handle.error, handle.text, handle.tokens)
    want = (want_reason, None, want_text, want_tokens)
    ctx.require(ended and seen == want,
                expected=f"(finish_reason, error, text, tokens) = {want}",
                observed=f"ended {ended}: {seen}")
    found = request_for(group, p)
    ctx.require(found is not None, expected="the request's ADD", observed="none")
    assert found is not None
    rank, rid = found
    if aborted:
        await group.transcript.wait_for(lambda t: rid in t.aborted_ids(rank), ctx.t(3))
    await ctx.quiet(0.2)  # an ABORT owed to nobody would come now
    count = sum(rid in r.message.request_ids for r in group.transcript.abort_frames())
    ctx.require(count == (1 if aborted else 0),
                expected=(f"one ABORT of {rid} at engine {rank}" if aborted
                          else "no ABORT (the engine finished the request)"),
                observed=f"{count} ABORT(s) naming it")


# ' t21 t22 t23 t24': 't2' completes in every token; with min_tokens 2 the first two are
# ignored and the stream stops in the third, after ' t21 t22 '.
_T2_CHUNKED: list[Step] = [Emit([21], 0.03), Emit([22], 0.03), Emit([23], 0.03),
                           Emit([24], 0.03)]


@case("streaming.stop_min_tokens.within_ignored", Level.MUST,
      "With min_tokens 2 and stop 't2' over ' t21', ' t22', ' t23' (one token per output), "
      "the matches completing in the first two tokens are ignored and the stream stops in "
      "the third: text exactly ' t21 t22 ', tokens [21, 22, 23], 'stop', one ABORT.",
      grounds=STOP_AFTER_MIN_TOKENS, needs=STOP_NEEDS)
async def stop_min_tokens_within_ignored(ctx: CaseContext) -> None:
    await _min_tokens_stop(ctx, _T2_CHUNKED, "t2", 2, " t21 t22 ", [21, 22, 23], "stop",
                           aborted=True)


@case("streaming.stop_min_tokens.within_ignored_one_output", Level.MUST,
      "The same four tokens in ONE output (min_tokens 2, stop 't2'): the threshold is per "
      "token, not per output: text exactly ' t21 t22 ', tokens [21, 22, 23], 'stop', one "
      "ABORT.", grounds=STOP_AFTER_MIN_TOKENS, needs=STOP_NEEDS)
async def stop_min_tokens_within_ignored_one_output(ctx: CaseContext) -> None:
    await _min_tokens_stop(ctx, [Emit([21, 22, 23, 24], 0.03)], "t2", 2, " t21 t22 ",
                           [21, 22, 23], "stop", aborted=True)


@case("streaming.stop_min_tokens.spans_threshold", Level.MUST,
      "A stop string that starts inside the first min_tokens tokens and completes after "
      "them counts (min_tokens 1, stop '1 t' over ' t21', ' t22'): text exactly ' t2', "
      "tokens [21, 22], 'stop', one ABORT.", grounds=STOP_AFTER_MIN_TOKENS, needs=STOP_NEEDS)
async def stop_min_tokens_spans_threshold(ctx: CaseContext) -> None:
    await _min_tokens_stop(ctx, _T2_CHUNKED, "1 t", 1, " t2", [21, 22], "stop",
                           aborted=True)


@case("streaming.stop_min_tokens.spans_threshold_by_one_char", Level.MUST,
      "A stop string completed by the first character after the first min_tokens tokens "
      "counts (min_tokens 1, stop '1 ' over ' t21', ' t22': it ends one character into the "
      "second token): text exactly ' t2', tokens [21, 22], 'stop', one ABORT.",
      grounds=STOP_AFTER_MIN_TOKENS, needs=STOP_NEEDS)
async def stop_min_tokens_spans_threshold_by_one_char(ctx: CaseContext) -> None:
    await _min_tokens_stop(ctx, _T2_CHUNKED, "1 ", 1, " t2", [21, 22], "stop",
                           aborted=True)


@case("streaming.stop_min_tokens.never_reached", Level.MUST,
      "min_tokens 4 over a three-token stream whose every token completes stop 't2': no "
      "match counts, the engine's LENGTH ends it and the held-back text is released: text "
      "exactly ' t21 t22 t23', 'length', no ABORT.", grounds=STOP_AFTER_MIN_TOKENS,
      needs=STOP_NEEDS)
async def stop_min_tokens_never_reached(ctx: CaseContext) -> None:
    await _min_tokens_stop(ctx, stream([21, 22, 23], 0.03), "t2", 4, " t21 t22 t23",
                           [21, 22, 23], "length", aborted=False)


# --------------------------------------------------------------- refused before any ADD

async def _submit(ctx: CaseContext, prompt_ids: Sequence[int], max_tokens: int,
                  sampling: Sampling | None = None) -> StreamHandle | None:
    """generate(); None when it was refused (FrontendError, or a stream that ended with an
    error and no tokens, which is how an HTTP frontend refuses a streamed request)."""
    try:
        handle = await ctx.driver.generate(prompt_ids, max_tokens, sampling=sampling)
    except FrontendError as exc:
        ctx.note(f"refused: {exc}")
        return None
    await ctx.wait_until(lambda: handle.ended, 3)
    if handle.ended and handle.error is not None and not handle.tokens:
        ctx.note(f"refused as a stream error: {handle.error}")
        return None
    return handle


async def _require_refused(ctx: CaseContext, engines: int, prompt_ids: Sequence[int],
                           max_tokens: int, what: str,
                           sampling: Sampling | None = None) -> None:
    """The request is refused and no engine receives an ADD for it."""
    group = ctx.engines
    handle = await _submit(ctx, prompt_ids, max_tokens, sampling)
    await ctx.quiet(0.1)  # an ADD already sent would have arrived
    adds = sum(len(group.transcript.adds(rank)) for rank in range(engines))
    ctx.require(handle is None, expected=f"{what}: refused at submission",
                observed=(None if handle is None else
                          f"accepted: finish {handle.finish_reason!r}, tokens "
                          f"{handle.tokens}, error {handle.error!r}"))
    ctx.require(adds == 0, expected=f"{what}: no ADD at any engine",
                observed=f"{adds} ADD(s)")


async def _require_served(ctx: CaseContext, prompt_ids: Sequence[int], max_tokens: int,
                          what: str, sampling: Sampling | None = None,
                          tokens: Sequence[int] = SERVED) -> None:
    """The request is accepted, its ADD carries the prompt, it completes 'length'."""
    handle = await _submit(ctx, prompt_ids, max_tokens, sampling)
    ctx.require(handle is not None and handle.finish_reason == "length"
                and handle.error is None and handle.tokens == list(tokens),
                expected=f"{what}: served, tokens {list(tokens)}, 'length'",
                observed=("refused" if handle is None else
                          f"finish {handle.finish_reason!r}, tokens {handle.tokens}, "
                          f"error {handle.error!r}"))
    found = request_for(ctx.engines, prompt_ids)
    ctx.require(found is not None, expected=f"{what}: its ADD with the whole prompt",
                observed="no ADD with that prompt")


def _served_scripts(engines: int, *prompts: Sequence[int],
                    max_model_len: Sequence[int] | None = None,
                    tokens: Sequence[int] = SERVED) -> list[EngineScript]:
    lens = max_model_len or [DEFAULT_MAX_MODEL_LEN] * engines
    return [EngineScript(ready=default_ready(rank, engines, max_model_len=lens[rank]),
                         rules=[by_prompt(p, stream(list(tokens), 0.02)) for p in prompts])
            for rank in range(engines)]


@case("streaming.refused.empty_prompt", Level.MUST,
      "generate() with an empty prompt is refused at submission: no ADD reaches the "
      "engine; a one-token prompt right after it is served.",
      grounds=EMPTY_PROMPT_REFUSED, needs=REFUSAL_NEEDS)
async def refused_empty_prompt(ctx: CaseContext) -> None:
    await ctx.start(_served_scripts(1, [11]))
    await _require_refused(ctx, 1, [], 3, "an empty prompt")
    await _require_served(ctx, [11], 3, "a one-token prompt")


def _context_limit(engines: int) -> dict[str, object]:
    """A params entry: the engines' max_model_len values, their minimum, how it is said."""
    lens = [DEFAULT_MAX_MODEL_LEN] if engines == 1 else [DEFAULT_MAX_MODEL_LEN, 64]
    limit = min(lens)
    what = (f"max_model_len {limit}" if engines == 1 else
            f"max_model_len {limit}, the minimum of the ready responses {lens}")
    return {"engines": engines, "lens": lens, "limit": limit, "what": what,
            "over_len": limit + 1, "fits_len": limit - 8, "fits_full_len": limit - 1}


@case("streaming.refused.prompt_over_max_model_len_{engines}_engines", Level.MUST,
      "With {engines} engine(s) ({what}): a prompt of {over_len} tokens is refused "
      "at submission, no ADD reaches any engine; one of {fits_len} tokens with "
      "max_tokens 3 is served.",
      grounds=PROMPT_OVER_CONTEXT_REFUSED, needs=REFUSAL_NEEDS,
      params=[_context_limit(n) for n in (1, 2)])
async def refused_prompt_over_max_model_len(ctx: CaseContext, engines: int, lens: list[int],
                                            limit: int, what: str) -> None:
    fits = [11, *([12] * (limit - 9))]
    over = [11, *([13] * limit)]
    await ctx.start(_served_scripts(engines, fits, over, max_model_len=lens))
    await _require_refused(ctx, engines, over, 3,
                           f"a prompt of {len(over)} tokens over {what}")
    await _require_served(ctx, fits, 3, f"a prompt of {len(fits)} tokens")


@case("streaming.refused.prompt_fills_max_model_len_{engines}_engines", Level.MUST,
      "With {engines} engine(s) ({what}): a prompt of exactly {limit} tokens (no room "
      "left for one output token) is refused at submission, no ADD reaches any engine; "
      "one of {fits_full_len} tokens with max_tokens 1 is served.",
      grounds=PROMPT_FILLS_CONTEXT_REFUSED, needs=REFUSAL_NEEDS,
      params=[_context_limit(n) for n in (1, 2)])
async def refused_prompt_fills_max_model_len(ctx: CaseContext, engines: int, lens: list[int],
                                             limit: int, what: str) -> None:
    fits = [11, *([12] * (limit - 2))]
    full = [11, *([13] * (limit - 1))]
    await ctx.start(_served_scripts(engines, fits, full, max_model_len=lens, tokens=[300]))
    await _require_refused(ctx, engines, full, 1,
                           f"a prompt of {len(full)} tokens filling {what}")
    await _require_served(ctx, fits, 1, f"a prompt of {len(fits)} tokens", tokens=[300])


@case("streaming.refused.min_tokens_above_max_tokens", Level.MUST,
      "A request with min_tokens 4 and max_tokens 3 is refused at submission (no ADD); one "
      "with min_tokens 3 and max_tokens 3 is served.",
      grounds=MIN_TOKENS_OVER_MAX_REFUSED, needs=[*REFUSAL_NEEDS, Capability.SAMPLING])
async def refused_min_tokens_above_max_tokens(ctx: CaseContext) -> None:
    await ctx.start(_served_scripts(1, prompt(0), prompt(1)))
    await _require_refused(ctx, 1, prompt(0), 3, "min_tokens 4 above max_tokens 3",
                           Sampling(min_tokens=4))
    await _require_served(ctx, prompt(1), 3, "min_tokens 3 with max_tokens 3",
                          Sampling(min_tokens=3))
