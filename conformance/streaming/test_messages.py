"""What engine output messages carry beside the outputs' tokens.

Engines name requests in `finished_requests`, attach ndarrays that travel as aux frames,
put scheduler stats on step messages and send stats-only messages (what an engine under
`vllm serve`'s default log_stats does). None of it may disturb a stream; a request retired
in `finished_requests` without a final output is where the two 0.33.0 frontends differ.

Large *inputs* as aux frames (tensors on the ADD) are in test_inputs.py. Out of
reach: multipart *logprob* outputs need a request that asks for
logprobs (vLLM's Python output processor asserts num_logprobs for any new_logprobs), which
the driver surface cannot express either, so the aux-frame cases carry `routed_experts`
arrays, decoded by both frontends for every request.
"""

from __future__ import annotations

from conformance.streaming.helpers import GEN, F, require_streams
from harness.cases.authoring import (
    CaseContext,
    Emit,
    EmitArrays,
    EngineGroup,
    EngineScript,
    Finish,
    FinishedOnly,
    Level,
    StatsOnly,
    both,
    by_prompt,
    case,
    differ,
    engine,
    messages,
    prompt,
    py,
    request_for,
    rs,
    stream,
)

# finished_requests: python frees DP routing state by it (and never ends a stream by it);
# rust drops the ids from its registry as a safety net.
_PY_FINISHED = py("vllm/v1/engine/core_client.py:1823",
                  "for req_id in outputs.finished_requests:")
_RS_FINISHED = rs("rust/src/engine-core-client/src/client/imp.rs:486",
                  "drop(inner.finish_requests(finished_requests));")
FINISHED_WITH_OUTPUT = both(
    _PY_FINISHED, py("vllm/v1/engine/output_processor.py:877", "self._finish_request(req_state)"),
    _RS_FINISHED,
    rs("rust/src/engine-core-client/src/client/state.rs:252", "if output.finished() {"),
    engine("vllm/v1/engine/core.py:2257",
           "eco = EngineCoreOutputs(finished_requests=req_ids, outputs=outputs)"))
# A message is queued only when it carries outputs or scheduler stats.
_PY_QUEUED = py("vllm/v1/engine/core_client.py:1259",
                "if outputs.outputs or outputs.scheduler_stats:")
RETIRED_ENDS_STREAM = differ(
    _PY_FINISHED, _PY_QUEUED, _RS_FINISHED,
    rs("rust/src/engine-core-client/src/client/stream.rs:208",
       "Poll::Ready(Some(Err(Error::RequestStreamClosed {"),
    rs("rust/src/engine-core-client/src/tests/client.rs:1154",
       "async fn finished_requests_without_final_output_is_treated_as_unexpected_close()"),
    note="python keeps the stream open: finished_requests only frees DP routing state "
    "(core_client.py:1822-1825), a finished_requests-only message is not even queued "
    "(:1259), and OutputProcessor ends a stream only on a final output; rust removes the id "
    "(imp.rs:486) so the stream ends with RequestStreamClosed (stream.rs:208)")
RETIRED_NOT_ABORTED = both(
    _PY_FINISHED,
    py("vllm/v1/engine/core_client.py:1824",
       "if (engine := self.reqs_in_flight.pop(req_id, None)) is not None:"),
    _RS_FINISHED,
    rs("rust/src/engine-core-client/src/client/stream.rs:224", "if self.is_terminated() {"),
    rs("rust/src/engine-core-client/src/client/imp.rs:335",
       "let (_, engine_id) = registry.remove(request_id)?;"),
    note="python sends nothing for it (the stream stays open); rust ends the stream, and a "
    "terminated or unregistered stream is never auto-aborted")
# Output ndarrays: inline ext(3) raw bytes or an index into the message's aux frames.
AUX_OUTPUTS = both(
    py("vllm/v1/engine/core_client.py:1219",
       "outputs: EngineCoreOutputs = decoder.decode(frames)"),
    py("vllm/v1/serial_utils.py:392",
       "buffer = self.aux_buffers[data] if isinstance(data, int) else data"),
    py("vllm/v1/engine/output_processor.py:786", "req_state.routed_experts_chunks.append("),
    rs("rust/src/engine-core-client/src/protocol/output.rs:464",
       "outputs.resolve_in_place(frames)?;"),
    rs("rust/src/engine-core-client/src/protocol/tensor.rs:255",
       "pub(crate) fn resolve_aux_frame(&mut self, frames: &[Bytes]) -> Result<(), String> {"),
    rs("rust/src/engine-core-client/src/protocol/tensor.rs:294",
       "Value::Ext(tag, bytes) if tag == CUSTOM_TYPE_RAW_VIEW => {"),
    rs("rust/src/engine-core-client/src/tests/client.rs:1856",
       "async fn client_decodes_multipart_logprob_outputs()"))
# Stats-only messages update load/metrics state and touch no stream.
_PY_STATS = py("vllm/v1/engine/async_llm.py:924",
               "output_processor.update_scheduler_stats(outputs.scheduler_stats)")
_RS_STATS = rs("rust/src/engine-core-client/src/client/imp.rs:490",
               "if !inner.apply_scheduler_stats(batch.engine_index, scheduler_stats) {")
STATS = both(_PY_QUEUED, _PY_STATS, _RS_STATS,
             rs("rust/src/engine-core-client/src/client/state.rs:251",
                "self.apply_lora_events(&output.output);"))
STATS_ONLY = both(
    _PY_QUEUED, _PY_STATS, _RS_STATS,
    rs("rust/src/engine-core-client/src/tests/client.rs:898",
       "async fn coordinator_accepts_stats_only_outputs()"))


# ----------------------------------------------------------------- finished_requests


@case("streaming.finished_requests.with_final_output_{engines}_engines", Level.MUST,
      "With {engines} engine(s) naming every finished request in finished_requests "
      "(in the same message as its final output), each stream completes normally and "
      "later requests are still served.", grounds=FINISHED_WITH_OUTPUT, needs=GEN,
      params=[{"engines": n} for n in (1, 2)])
async def finished_with_output(ctx: CaseContext, engines: int) -> None:
    group = await ctx.start([EngineScript(report_finished=True) for _ in range(engines)])
    first = [await ctx.driver.generate(prompt(i), 3) for i in range(2 * engines)]
    await ctx.wait_until(lambda: all(h.ended for h in first), 3)
    second = [await ctx.driver.generate(prompt(50 + i), 2) for i in range(2 * engines)]
    await ctx.wait_until(lambda: all(h.ended for h in second), 3)
    named = sum(len(r.message.finished_requests or [])
                for r in group.transcript.select(direction="out", channel="output")
                if isinstance(r.message, messages.EngineCoreOutputs))
    ctx.note(f"{named} ids named in finished_requests")
    require_streams(ctx, [*first, *second],
                     [[100, 101, 102]] * len(first) + [[100, 101]] * len(second))


def _retired_after(tokens: list[int]) -> list[Emit | FinishedOnly]:
    """The engine streams `tokens`, then names the request in finished_requests alone."""
    return [*(Emit([t], 0.02) for t in tokens), FinishedOnly(0.05)]


@case("streaming.finished_requests.without_final_output_{phase}", Level.SHOULD,
      "A request named in finished_requests without a final output ({phase}) should "
      "end its stream with an error within a bound instead of hanging (vllm-rs: "
      "RequestStreamClosed); its neighbour is unaffected.", grounds=RETIRED_ENDS_STREAM,
      needs=GEN, params=[{"phase": "before_first_token", "tokens": []},
                         {"phase": "after_tokens", "tokens": [100, 101]}])
async def finished_without_output(ctx: CaseContext, tokens: list[int]) -> None:
    p, q = prompt(0), prompt(1)
    await ctx.start([EngineScript(rules=[by_prompt(p, _retired_after(tokens)),
                                         by_prompt(q, stream([300, 301, 302], 0.05))])])
    h = await ctx.driver.generate(p, 10)
    other = await ctx.driver.generate(q, 3)
    await other.wait(ctx.t(3))
    require_streams(ctx, [other], [[300, 301, 302]])
    ended = await ctx.wait_until(lambda: h.ended, 2)
    ctx.require(ended and h.finish_reason == "error" and bool(h.error),
                expected=f"the retired stream ends 'error' with an error message after "
                         f"{tokens}",
                observed=(f"ended: {h.finish_reason} error={h.error} tokens={h.tokens}"
                          if ended else f"still open after 2 s with {h.tokens}"))
    ctx.require(h.tokens == tokens, expected=f"tokens {tokens} before the error",
                observed=h.tokens)


def _retired(phase: str, tokens: list[int], engines: int = 1) -> dict[str, object]:
    return {"phase": phase, "tokens": tokens, "engines": engines,
            "suffix": phase if engines == 1 else f"{phase}_{engines}_engines",
            "neighbour": (f"; with {engines} engines a neighbour stream on another engine "
                          "completes" if engines > 1 else "")}


@case("streaming.finished_requests.without_final_output_not_aborted_{suffix}", Level.MUST,
      "A request the engine names in finished_requests without a final output ({phase}) "
      "is retired engine-side: the frontend sends no ABORT for it, to any engine, on its "
      "own, whether it ends the stream with an error (Rust) or keeps it open (Python)"
      "{neighbour}.", grounds=RETIRED_NOT_ABORTED, needs=GEN,
      params=[_retired("before_first_token", []), _retired("after_tokens", [100, 101]),
              _retired("after_tokens", [100, 101], engines=2)])
async def retired_not_aborted(ctx: CaseContext, tokens: list[int], engines: int) -> None:
    p, q = prompt(0), prompt(1)
    rules = [by_prompt(p, _retired_after(tokens)), by_prompt(q, stream([300, 301], 0.05))]
    group = await ctx.start([EngineScript(rules=list(rules)) for _ in range(engines)])
    h = await ctx.driver.generate(p, 10)
    other = await ctx.driver.generate(q, 2) if engines > 1 else None
    found = await ctx.wait_until(lambda: request_for(group, p) is not None, 3)
    ctx.require(found, expected="the request's ADD", observed="no ADD within 3 s")
    owner = request_for(group, p)
    assert owner is not None
    rid = owner[1]
    named = await ctx.wait_until(lambda: any(
        rid in (r.message.finished_requests or [])
        for r in group.transcript.select(direction="out", channel="output")
        if isinstance(r.message, messages.EngineCoreOutputs)), 3)
    ctx.require(named, expected="the engine named the request in finished_requests",
                observed="not sent within 3 s (harness fault)")
    await ctx.wait_until(lambda: h.ended, 1.0)  # a frontend that ends it does so now
    await ctx.quiet(0.5)  # an ABORT sent on the stream's close lands by now
    aborted = group.transcript.aborted_ids()
    ctx.note(f"stream {'ended ' + repr(h.finish_reason) if h.ended else 'still open'}, "
             f"tokens {h.tokens}")
    ctx.require(rid not in aborted,
                expected=f"no ABORT for the retired request {rid}",
                observed=f"ABORTed ids {aborted}")
    if other is not None:
        await other.wait(ctx.t(3))
        require_streams(ctx, [other], [[300, 301]])


# ----------------------------------------------------------------- aux frames


@case("streaming.aux.multipart_outputs_{engines}_engines", Level.MUST,
      "With {engines} engine(s), outputs carrying ndarrays both inline (ext 3) and as "
      "aux frames (several per message) are decoded, not taken for garbage: every "
      "stream completes with its tokens.",
      grounds=AUX_OUTPUTS, needs=GEN, params=[{"engines": n} for n in (1, 2)])
async def aux_multipart(ctx: CaseContext, engines: int) -> None:
    steps = [EmitArrays([100], 32), EmitArrays([101, 102, 103], 32, 0.03),
             Finish(F.LENGTH, [104], 0.03)]
    group = await ctx.start([EngineScript(rules=[by_prompt(prompt(i), steps)
                                                 for i in range(3 * engines)])
                             for _ in range(engines)])
    handles = [await ctx.driver.generate(prompt(i), 5) for i in range(3 * engines)]
    await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    multipart = [len(r.frames) for r in group.transcript.select(direction="out",
                                                                 channel="output")
                 if len(r.frames) > 1]
    ctx.note(f"{len(multipart)} multipart messages, frame counts {sorted(set(multipart))}")
    ctx.require(bool(multipart), expected="the engines sent multipart messages",
                observed="none (harness fault)")
    require_streams(ctx, handles, [[100, 101, 102, 103, 104]] * len(handles))


# ----------------------------------------------------------------- scheduler stats


def _stats_only_messages(group: EngineGroup) -> int:
    """How many messages the engines sent with scheduler_stats and no outputs."""
    return len([r for r in group.transcript.select(direction="out", channel="output")
                if isinstance(r.message, messages.EngineCoreOutputs) and not r.message.outputs
                and r.message.scheduler_stats is not None])


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
    ctx.note(f"{_stats_only_messages(group)} stats-only messages sent")
    bad = [(h.tokens, h.finish_reason, h.error) for h in [*handles, later]
           if h.finish_reason != "length"]
    ctx.require(not bad, expected="every stream completes with length", observed=bad)


@case("streaming.stats.stats_only_mid_stream_{engines}_engines", Level.MUST,
      "With {engines} engines each sending stats-only messages (scheduler_stats, no "
      "outputs) between a request's outputs, every stream completes untouched and "
      "later requests are still served.",
      grounds=STATS_ONLY, needs=GEN, params=[{"engines": n} for n in (2, 3)])
async def stats_only(ctx: CaseContext, engines: int) -> None:
    steps = [Emit([100]), StatsOnly(0.02), Emit([101], 0.02), StatsOnly(),
             Finish(F.LENGTH, [102], 0.02)]
    group = await ctx.start([EngineScript(rules=[by_prompt(prompt(i), steps)
                                                 for i in range(2 * engines)])
                             for _ in range(engines)])
    handles = [await ctx.driver.generate(prompt(i), 3) for i in range(2 * engines)]
    await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    later = [await ctx.driver.generate(prompt(50 + i), 2) for i in range(engines)]
    await ctx.wait_until(lambda: all(h.ended for h in later), 3)
    ctx.note(f"{_stats_only_messages(group)} stats-only messages")
    require_streams(ctx, [*handles, *later],
                     [[100, 101, 102]] * len(handles) + [[100, 101]] * len(later))
