"""What a frontend puts on the ADD and what it hands the client when a request fails.

Port authors build the EngineCoreRequest by hand and get the quiet fields wrong: no
external_req_id (the engine's logs and the frontend's abort-by-user-id lose the user's name;
the ADD's sampling: test_streaming_sampling.py). (Pinned ranks on the ADD:
test_dp_routing_slots.py.) On the way back, an engine's per-request RequestError carries a message
meant for the user ("Generation is paused, retry"): a port that ends the stream with a bare
"error" or with no error at all throws it away.
"""

from __future__ import annotations

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, engine, py, rs
from harness.cases.helpers import prompt
from harness.frontends.api import Capability, StreamHandle, UnsupportedOperation
from harness.protocol.wire import messages as m
from harness.results.records import Level
from mock_engines.script import Emit, EngineScript, Finish, Step, by_prompt, stream

F = m.FinishReason
GEN = [Capability.GENERATE]
# external_req_id names the user's id; the engine-side request_id gets a random suffix.
_EXTERNAL_ID = (
    py("vllm/v1/engine/input_processor.py:363", "request.external_req_id = request.request_id"),
    py("vllm/v1/engine/input_processor.py:371",
       'request.request_id = f"{request.external_req_id}-{random_uuid():.8}"'),
    rs("rust/src/llm/src/request.rs:124", "external_req_id: Some(external_request_id),"),
    rs("rust/src/llm/src/request.rs:100",
       'format!("{external_request_id}-{}", &random_suffix[..8])'))
EXTERNAL_ID = both(
    *_EXTERNAL_ID,
    py("vllm/v1/engine/output_processor.py:322", "assert request.external_req_id is not None"))
EXTERNAL_ID_CHOSEN = both(
    *_EXTERNAL_ID,
    py("vllm/entrypoints/openai/completion/serving.py:147",
       'request_id = f"cmpl-{self._base_request_id(raw_request, request.request_id)}"'),
    rs("rust/src/server/src/routes/openai/completions/convert.rs:73",
       'let request_id = format!("cmpl-{}", ctx.request_id);'),
    rs("rust/src/server/src/utils.rs:188",
       "request_id_header.or(request_id).map(ToOwned::to_owned)"))


# ----------------------------------------------------------------- ADD fields


@case("streaming.add_fields.external_req_id_generated", Level.MUST,
      "Every ADD names the user-facing request id in external_req_id (vLLM's frontends set "
      "it; the engine-side request_id may carry a suffix), one distinct id per request.",
      grounds=EXTERNAL_ID, needs=GEN)
async def add_external_generated(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript() for _ in range(2)])
    handles = [await ctx.driver.generate(prompt(i), 2) for i in range(4)]
    for h in handles:
        await h.wait(ctx.t(3))
    ids = [r.external_req_id for r in group.transcript.adds()]
    ctx.require(len(ids) == 4 and None not in ids and len(set(ids)) == 4,
                expected="4 ADDs, each with its own external_req_id",
                observed=f"external_req_id per ADD: {ids}")


@case("streaming.add_fields.external_req_id_client_chosen", Level.MUST,
      "With a client-chosen request id, the ADD's external_req_id names that id (an HTTP "
      "server may prefix it, as vLLM's OpenAI routes do: cmpl-<id>).",
      grounds=EXTERNAL_ID_CHOSEN, needs=[Capability.GENERATE, Capability.CLIENT_REQUEST_ID])
async def add_external_client(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    chosen = ["user-req-a", "user-req-b"]
    try:
        handles = [await ctx.driver.generate(prompt(i), 2, request_id=rid)
                   for i, rid in enumerate(chosen)]
    except UnsupportedOperation as exc:  # it declared client_request_id: a driver fault
        ctx.require(False, expected="generate(request_id=...) honoured by a driver that "
                                    "declares client_request_id", observed=str(exc))
        return
    for h in handles:
        await h.wait(ctx.t(3))
    seen = {tuple(r.prompt_token_ids or []): r.external_req_id
            for r in group.transcript.adds()}
    got = [seen.get(tuple(prompt(i))) for i in range(2)]
    ok = all(g is not None and want in g for g, want in zip(got, chosen, strict=True))
    ctx.require(ok, expected=f"external_req_id naming {chosen}", observed=got)







# ----------------------------------------------------------------- request errors

# The engine's RequestError message reaches the caller (python raises it; rust answers a
# retryable one with its message).
REQUEST_ERROR = both(
    py("vllm/v1/engine/output_processor.py:767", "req_state.queue.put(error.to_exception())"),
    py("vllm/outputs.py:34", "return RetryableRequestError(self.message)"),
    rs("rust/src/llm/src/output.rs:156",
       "EngineCoreFinishReason::Error => FinishReason::Error(error),"),
    rs("rust/src/server/src/error.rs:124", "message: error.message.clone(),"),
    note="rust forwards the message only for retryable or validation errors (error.rs:126 "
    "answers 'Internal server error' otherwise); the case's error is retryable")

ERROR_TEXT = "Generation is paused. Please retry after it resumes."
PHASES: dict[str, list[Step]] = {
    "before_first_token": [],
    "after_tokens": [Emit([100]), Emit([101], 0.02)],
}


def _make_error_message(phase: str, engines: int) -> None:
    @case(f"streaming.request_error.message_reaches_client_{phase}_{engines}_engines",
          Level.MUST,
          f"With {engines} engine(s), a request the engine ends with ERROR and a "
          f"RequestError ({phase}) ends with finish_reason 'error' and an error that carries "
          "the engine's message for the user; its neighbour on the same engine completes.",
          grounds=REQUEST_ERROR,
          needs=[Capability.GENERATE, Capability.REQUEST_ERRORS])
    async def run(ctx: CaseContext) -> None:
        failing = [prompt(i) for i in range(engines)]
        neighbours = [prompt(100 + i) for i in range(engines)]
        steps = [*PHASES[phase], Finish(F.ERROR, delay=0.03, error=m.RequestError(
            "engine_paused", ERROR_TEXT, True))]
        rules = [*(by_prompt(p, steps) for p in failing),
                 *(by_prompt(p, stream([300, 301, 302], 0.03)) for p in neighbours)]
        await ctx.start([EngineScript(rules=list(rules)) for _ in range(engines)])
        bad_h = [await ctx.driver.generate(p, 10) for p in failing]
        ok_h = [await ctx.driver.generate(p, 3) for p in neighbours]
        await ctx.wait_until(lambda: all(h.ended for h in [*bad_h, *ok_h]), 3)
        wrong = [_describe(h) for h in bad_h
                 if not (h.finish_reason == "error" and ERROR_TEXT in (h.error or ""))]
        ctx.require(not wrong, expected=f"finish_reason 'error', error text containing "
                                        f"{ERROR_TEXT!r}",
                    observed="; ".join(wrong[:2]))
        wrong = [_describe(h) for h in ok_h
                 if not (h.finish_reason == "length" and h.tokens == [300, 301, 302])]
        ctx.require(not wrong, expected="every neighbour completes with [300, 301, 302]",
                    observed="; ".join(wrong[:2]))

    run.__name__ = run.__qualname__ = f"error_message_{phase}_{engines}"
    globals()[run.__name__] = run


def _describe(h: StreamHandle) -> str:
    return f"ended={h.ended} finish_reason={h.finish_reason!r} error={h.error!r} " \
           f"tokens={h.tokens}"


for _phase in PHASES:
    for _n in (1, 2):
        _make_error_message(_phase, _n)



# ----------------------------------------------------------------- tensor beside fields

# prompt_embeds has its own ADD field; extra_args holds only kv/ec transfer params (and the
# user's vllm_xargs).
EMBEDS_FIELD = both(
    py("vllm/v1/engine/__init__.py:128", "prompt_embeds: torch.Tensor | None = None"),
    py("vllm/entrypoints/openai/completion/protocol.py:403",
       'extra_args["kv_transfer_params"] = self.kv_transfer_params'),
    rs("rust/src/engine-core-client/src/protocol/request.rs:95",
       "pub prompt_embeds: Option<OpaqueValue>,"),
    rs("rust/src/server/src/routes/openai/completions/convert.rs:151",
       "vllm_xargs: merge_kv_transfer_params("),
    engine("vllm/v1/request.py:120", "self.kv_transfer_params = sampling_params.extra_args.get("),
    note="rust never copies prompt_embeds anywhere: it refuses the field (request.rs:139)")

KV = {"do_remote_prefill": False, "remote_engine_id": "e-1"}
EMBED_ROWS = [[r + c / 64 for c in range(8)] for r in range(3)]


def _make_embeds_only_as_tensor(with_kv: bool) -> None:
    name = "with_kv_transfer_params" if with_kv else "alone"
    want = {"kv_transfer_params": KV} if with_kv else None
    beside = "exactly the kv_transfer_params sent beside it" if with_kv else "nothing at all"

    @case(f"streaming.inputs.prompt_embeds_not_in_extra_args_{name}", Level.MUST,
          "prompt_embeds travels only as the ADD's tensor field: SamplingParams.extra_args "
          f"carries no copy of it ({beside}).",
          grounds=EMBEDS_FIELD,
          needs=[Capability.GENERATE, Capability.INPUT_TENSORS,
                 *([Capability.PASS_THROUGH] if with_kv else [])])
    async def run(ctx: CaseContext) -> None:
        p = prompt(7)
        group = await ctx.start([EngineScript(rules=[by_prompt(p, stream([100, 101]))])])
        params: dict[str, object] = {"prompt_embeds": EMBED_ROWS}
        if with_kv:
            params["kv_transfer_params"] = KV
        handle = await ctx.driver.generate(p, 2, params=params)
        await ctx.wait_until(lambda: handle.ended, 3)
        adds = [r for r in group.transcript.adds() if r.prompt_token_ids == p]
        ctx.require(len(adds) == 1 and adds[0].prompt_embeds is not None,
                    expected="one ADD carrying prompt_embeds",
                    observed=f"{len(adds)} ADD(s)")
        sp = adds[0].sampling_params
        extra = sp.extra_args if sp is not None else "no sampling_params"
        ctx.require((extra or None) == want, expected=f"extra_args {want}",
                    observed=f"extra_args {extra!r:.200}")

    run.__name__ = run.__qualname__ = f"embeds_only_as_tensor_{name}"
    globals()[run.__name__] = run


for _with_kv in (False, True):
    _make_embeds_only_as_tensor(_with_kv)


# ----------------------------------------------------------------- held-back stop text

# A finished output releases the text held back for stop strings, whatever the reason.
HELD_RELEASED = both(
    py("vllm/v1/engine/detokenizer.py:165",
       "buffer_length = 0 if finished else self.stop_buffer_length"),
    py("vllm/v1/engine/output_processor.py:487",
       "text = self.detokenizer.get_next_output_text(finished, delta)"),
    rs("rust/src/text/src/output/decoded.rs:273", "// Flush any remaining buffered text."),
    rs("rust/src/text/src/output/decoded.rs:274",
       "let (last_chunk, full_decoded) = decoder.flush(truncate_output_to)?;"))

HOLD_STOP = "zzzzzz"  # never matched; holds back the last 5 characters of the text


def _make_held_released(kind: F) -> None:
    name = kind.name.lower()
    reason = "abort" if kind is F.ABORT else "error"

    @case(f"streaming.stop_edge.held_text_released_on_engine_{name}", Level.MUST,
          f"A stop-string request the engine ends with {kind.name} in an output carrying no "
          f"new token still gets the text held back for the stop string: the stream ends "
          f"{reason!r} with tokens [100, 101] and text ' t100 t101', nothing lost.",
          grounds=HELD_RELEASED,
          needs=[Capability.GENERATE, Capability.STOP_STRINGS,
                 *([Capability.REQUEST_ERRORS] if kind is F.ERROR else [])])
    async def run(ctx: CaseContext) -> None:
        p = prompt(0)
        steps: list[Step] = [Emit([100], 0.02), Emit([101], 0.02), Finish(kind, delay=0.05)]
        await ctx.start([EngineScript(rules=[by_prompt(p, steps)])])
        h = await ctx.driver.generate(p, 50, stop=[HOLD_STOP])
        ended = await ctx.wait_until(lambda: h.ended, 3)
        ctx.require(ended and h.finish_reason == reason,
                    expected=f"the stream ends {reason!r}", observed=_describe(h))
        ctx.require(h.tokens == [100, 101] and h.text == " t100 t101",
                    expected="tokens [100, 101], text ' t100 t101' (the held-back ' t101' "
                             "delivered at the end)", observed=f"{h.tokens} {h.text!r}")

    run.__name__ = run.__qualname__ = f"held_text_released_{name}"
    globals()[run.__name__] = run


for _kind in (F.ABORT, F.ERROR):
    _make_held_released(_kind)
