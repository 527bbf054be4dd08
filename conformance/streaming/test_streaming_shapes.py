"""Output message shapes a frontend must take apart correctly.

Engines batch several requests' outputs into one message in any order, send empty deltas,
name requests in `finished_requests`, attach ndarrays that travel as aux frames, and send
stats-only messages. Hand-built messages (`MockEngine.send_outputs`) cover the shapes no
script produces: reversed and interleaved batches across engines, an unknown id in the
middle of a batch, a duplicate final output.

Large *inputs* as aux frames (tensors on the ADD) are in test_streaming_inputs.py. Out of
reach: multipart *logprob* outputs need a request that asks for
logprobs (vLLM's Python output processor asserts num_logprobs for any new_logprobs), which
the driver surface cannot express either, so the aux-frame cases carry `routed_experts`
arrays, decoded by both frontends for every request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, differ, engine, py, rs
from harness.cases.helpers import prompt, request_for
from harness.frontends.api import Capability, StreamHandle
from harness.protocol.wire import messages as m
from harness.results.records import Level
from mock_engines.group import EngineGroup
from mock_engines.script import (
    Emit,
    EmitArrays,
    EngineScript,
    Finish,
    FinishedOnly,
    StatsOnly,
    by_prompt,
    stream,
)

F = m.FinishReason
# Each output in a message is routed by its request id, whatever its position or engine.
_PY_LOOP = py("vllm/v1/engine/output_processor.py:757",
              "for engine_core_output in engine_core_outputs:")
_PY_LOOKUP = py("vllm/v1/engine/output_processor.py:759",
                "req_state = self.request_states.get(req_id)")
_PY_SKIP = py("vllm/v1/engine/output_processor.py:761",
              "# Ignore output for already-aborted request.")
_RS_DISPATCH = rs("rust/src/engine-core-client/src/client/imp.rs:464",
                  "for output in inner.send_outputs(outputs) {")
_RS_BY_ID = rs("rust/src/engine-core-client/src/client/state.rs:258",
               "match self.requests.get_mut(output.request_id.as_str()) {")
_RS_DROP = rs("rust/src/engine-core-client/src/client/imp.rs:467",
              '"dropping output for inactive request"')
BATCH_ORDER = both(
    _PY_LOOP, _PY_LOOKUP,
    py("vllm/v1/engine/output_processor.py:79",
       "self.output.add(output, aggregate=self.aggregate)"),
    _RS_DISPATCH, _RS_BY_ID,
    rs("rust/src/engine-core-client/src/client/output_channel.rs:13",
       "Outputs are never merged, reordered, or dropped here"))
UNKNOWN_MID_BATCH = both(_PY_LOOP, _PY_SKIP, _RS_DISPATCH, _RS_DROP,
                         rs("rust/src/engine-core-client/src/client/state.rs:260",
                            "None => return Some(output),"))
DUPLICATE_FINAL = both(
    _PY_SKIP, py("vllm/v1/engine/output_processor.py:919", "self.request_states.pop(req_id)"),
    rs("rust/src/engine-core-client/src/client/state.rs:253",
       "match self.remove(output.request_id.as_str()) {"),
    _RS_DROP)
EMPTY_OUTPUTS = both(
    py("vllm/v1/engine/detokenizer.py:103", "if not new_token_ids:"),
    py("vllm/v1/engine/output_processor.py:869", "if finish_reason is not None:"),
    rs("rust/src/engine-core-client/src/client/state.rs:252", "if output.finished() {"),
    rs("rust/src/text/src/output/decoded.rs:194",
       "for (tok_idx, &token_id) in decodable_token_ids.iter().enumerate() {"))
GEN = [Capability.GENERATE]


def _out(rid: str, tokens: Sequence[int], reason: m.FinishReason | None = None
         ) -> m.EngineCoreOutput:
    return m.EngineCoreOutput(rid, list(tokens), finish_reason=reason)


def _msg(rank: int, outputs: list[m.EngineCoreOutput]) -> m.EngineCoreOutputs:
    return m.EngineCoreOutputs(rank, outputs, None, time.monotonic())


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


def _require_streams(ctx: CaseContext, handles: Sequence[StreamHandle],
                     want: Sequence[Sequence[int]]) -> None:
    pairs = enumerate(zip(handles, want, strict=True))
    bad = [(i, h.tokens, h.finish_reason, h.error) for i, (h, w) in pairs
           if h.tokens != list(w) or h.finish_reason != "length"]
    ctx.require(not bad, expected=f"streams end 'length' with {[list(w) for w in want]}",
                observed=f"differ (index, tokens, finish, error): {bad}")


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
    _require_streams(ctx, handles, [[101, 102, 103], [201, 202, 203], [301, 302, 303]])


def _make_interleaved(engines: int) -> None:
    @case(f"streaming.shape.interleaved_{engines}_engines", Level.MUST,
          f"With {engines} engines sending their requests' outputs in reversed, interleaved "
          "order (last engine first, requests reversed within each message), every stream "
          "gets exactly its own tokens in order.", grounds=BATCH_ORDER, needs=GEN)
    async def run(ctx: CaseContext) -> None:
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
        _require_streams(ctx, handles, [[1000 + 10 * i + s for s in range(3)]
                                        for i in range(len(handles))])

    run.__name__ = run.__qualname__ = f"interleaved_{engines}"
    globals()[run.__name__] = run


for _n in (2, 3, 4):
    _make_interleaved(_n)


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
    _require_streams(ctx, handles, [[101, 102], [201, 202]])


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
    _require_streams(ctx, handles, [[101, 102], [201, 202, 203]])


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
    _require_streams(ctx, [h], [[100, 101]])


# ----------------------------------------------------------------- finished_requests

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


def _make_finished_with_output(engines: int) -> None:
    @case(f"streaming.finished_requests.with_final_output_{engines}_engines", Level.MUST,
          f"With {engines} engine(s) naming every finished request in finished_requests "
          "(in the same message as its final output), each stream completes normally and "
          "later requests are still served.", grounds=FINISHED_WITH_OUTPUT, needs=GEN)
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start([EngineScript(report_finished=True) for _ in range(engines)])
        first = [await ctx.driver.generate(prompt(i), 3) for i in range(2 * engines)]
        await ctx.wait_until(lambda: all(h.ended for h in first), 3)
        second = [await ctx.driver.generate(prompt(50 + i), 2) for i in range(2 * engines)]
        await ctx.wait_until(lambda: all(h.ended for h in second), 3)
        named = sum(len(r.message.finished_requests or [])
                    for r in group.transcript.select(direction="out", channel="output")
                    if isinstance(r.message, m.EngineCoreOutputs))
        ctx.note(f"{named} ids named in finished_requests")
        _require_streams(ctx, [*first, *second],
                         [[100, 101, 102]] * len(first) + [[100, 101]] * len(second))

    run.__name__ = run.__qualname__ = f"finished_with_output_{engines}"
    globals()[run.__name__] = run


for _n in (1, 2):
    _make_finished_with_output(_n)


RETIRED_ENDS_STREAM = differ(
    _PY_FINISHED,
    py("vllm/v1/engine/core_client.py:1259", "if outputs.outputs or outputs.scheduler_stats:"),
    _RS_FINISHED,
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


def _retired_after(tokens: list[int]) -> list[Emit | FinishedOnly]:
    """The engine streams `tokens`, then names the request in finished_requests alone."""
    return [*(Emit([t], 0.02) for t in tokens), FinishedOnly(0.05)]


def _make_finished_without_output(phase: str, tokens: list[int]) -> None:
    @case(f"streaming.finished_requests.without_final_output_{phase}", Level.SHOULD,
          f"A request named in finished_requests without a final output ({phase}) should "
          "end its stream with an error within a bound instead of hanging (vllm-rs: "
          "RequestStreamClosed); its neighbour is unaffected.", grounds=RETIRED_ENDS_STREAM,
          needs=GEN)
    async def run(ctx: CaseContext) -> None:
        p, q = prompt(0), prompt(1)
        await ctx.start([EngineScript(rules=[by_prompt(p, _retired_after(tokens)),
                                             by_prompt(q, stream([300, 301, 302], 0.05))])])
        h = await ctx.driver.generate(p, 10)
        other = await ctx.driver.generate(q, 3)
        await other.wait(ctx.t(3))
        _require_streams(ctx, [other], [[300, 301, 302]])
        ended = await ctx.wait_until(lambda: h.ended, 2)
        ctx.require(ended and h.finish_reason == "error" and bool(h.error),
                    expected=f"the retired stream ends 'error' with an error message after "
                             f"{tokens}",
                    observed=(f"ended: {h.finish_reason} error={h.error} tokens={h.tokens}"
                              if ended else f"still open after 2 s with {h.tokens}"))
        ctx.require(h.tokens == tokens, expected=f"tokens {tokens} before the error",
                    observed=h.tokens)

    run.__name__ = run.__qualname__ = f"finished_without_output_{phase}"
    globals()[run.__name__] = run


_make_finished_without_output("before_first_token", [])
_make_finished_without_output("after_tokens", [100, 101])


def _make_retired_not_aborted(phase: str, tokens: list[int], engines: int = 1) -> None:
    suffix = phase if engines == 1 else f"{phase}_{engines}_engines"
    neighbour = (f"; with {engines} engines a neighbour stream on another engine completes"
                 if engines > 1 else "")

    @case(f"streaming.finished_requests.without_final_output_not_aborted_{suffix}",
          Level.MUST,
          f"A request the engine names in finished_requests without a final output ({phase}) "
          "is retired engine-side: the frontend sends no ABORT for it, to any engine, on its "
          "own, whether it ends the stream with an error (Rust) or keeps it open (Python)"
          f"{neighbour}.", grounds=RETIRED_NOT_ABORTED, needs=GEN)
    async def run(ctx: CaseContext) -> None:
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
            if isinstance(r.message, m.EngineCoreOutputs)), 3)
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
            _require_streams(ctx, [other], [[300, 301]])

    run.__name__ = run.__qualname__ = f"retired_not_aborted_{suffix}"
    globals()[run.__name__] = run


_make_retired_not_aborted("before_first_token", [])
_make_retired_not_aborted("after_tokens", [100, 101])
_make_retired_not_aborted("after_tokens", [100, 101], engines=2)


# ----------------------------------------------------------------- aux frames

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


def _make_aux(engines: int) -> None:
    @case(f"streaming.aux.multipart_outputs_{engines}_engines", Level.MUST,
          f"With {engines} engine(s), outputs carrying ndarrays both inline (ext 3) and as "
          "aux frames (several per message) are decoded, not taken for garbage: every "
          "stream completes with its tokens.",
          grounds=AUX_OUTPUTS, needs=GEN)
    async def run(ctx: CaseContext) -> None:
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
        _require_streams(ctx, handles, [[100, 101, 102, 103, 104]] * len(handles))

    run.__name__ = run.__qualname__ = f"aux_multipart_{engines}"
    globals()[run.__name__] = run


for _n in (1, 2):
    _make_aux(_n)


# ----------------------------------------------------------------- scheduler stats

# Stats-only messages update load/metrics state and touch no stream.
STATS_ONLY = both(
    py("vllm/v1/engine/core_client.py:1259", "if outputs.outputs or outputs.scheduler_stats:"),
    py("vllm/v1/engine/async_llm.py:924",
       "output_processor.update_scheduler_stats(outputs.scheduler_stats)"),
    rs("rust/src/engine-core-client/src/client/imp.rs:490",
       "if !inner.apply_scheduler_stats(batch.engine_index, scheduler_stats) {"),
    rs("rust/src/engine-core-client/src/tests/client.rs:898",
       "async fn coordinator_accepts_stats_only_outputs()"))


def _make_stats_only(engines: int) -> None:
    @case(f"streaming.stats.stats_only_mid_stream_{engines}_engines", Level.MUST,
          f"With {engines} engines each sending stats-only messages (scheduler_stats, no "
          "outputs) between a request's outputs, every stream completes untouched and "
          "later requests are still served.",
          grounds=STATS_ONLY, needs=GEN)
    async def run(ctx: CaseContext) -> None:
        steps = [Emit([100]), StatsOnly(0.02), Emit([101], 0.02), StatsOnly(),
                 Finish(F.LENGTH, [102], 0.02)]
        group = await ctx.start([EngineScript(rules=[by_prompt(prompt(i), steps)
                                                     for i in range(2 * engines)])
                                 for _ in range(engines)])
        handles = [await ctx.driver.generate(prompt(i), 3) for i in range(2 * engines)]
        await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
        later = [await ctx.driver.generate(prompt(50 + i), 2) for i in range(engines)]
        await ctx.wait_until(lambda: all(h.ended for h in later), 3)
        stats_only = [r for r in group.transcript.select(direction="out", channel="output")
                      if isinstance(r.message, m.EngineCoreOutputs) and not r.message.outputs
                      and r.message.scheduler_stats is not None]
        ctx.note(f"{len(stats_only)} stats-only messages")
        _require_streams(ctx, [*handles, *later],
                         [[100, 101, 102]] * len(handles) + [[100, 101]] * len(later))

    run.__name__ = run.__qualname__ = f"stats_only_{engines}"
    globals()[run.__name__] = run


for _n in (2, 3):
    _make_stats_only(_n)
