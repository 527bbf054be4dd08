"""Tensors on the way in: a large one travels as an aux frame, a small one inline, and
only in its own field.

vLLM's msgpack encoder moves a tensor of at least VLLM_MSGPACK_ZERO_COPY_THRESHOLD (256)
bytes out of the payload into a trailing frame and writes its frame index where the data
would be; a smaller one stays inline as ext(3) raw bytes (serial_utils.py, the encoder's
aux buffers; vllm-rs client_sends_large_multimodal_tensor_as_aux_frame). The surface that
carries a tensor onto an ADD without a multimodal model is EngineCoreRequest.prompt_embeds
(field 9): AsyncLLM.generate() accepts a prebuilt EngineCoreRequest. It travels there only:
SamplingParams.extra_args carries the kv/ec transfer params (and the user's vllm_xargs),
never a copy of the tensor. vllm-rs 0.33.0 has no such surface over HTTP with a text-only
model: UNSUPPORTED there.
"""

from __future__ import annotations

import array

import msgspec

from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineScript,
    Level,
    both,
    by_prompt,
    case,
    engine,
    prompt,
    py,
    rs,
    stream,
)
from harness.protocol.wire.codec import AddRequest

# A tensor of at least VLLM_MSGPACK_ZERO_COPY_THRESHOLD (256) bytes leaves the payload for an
# aux frame whose index takes its place; a smaller one stays inline as ext(3) raw bytes.
TENSOR_FRAMES = both(
    py("vllm/v1/serial_utils.py:261", "if obj.nbytes < self.size_threshold and obj.is_cpu:"),
    py("vllm/v1/serial_utils.py:263", "data = msgpack.Ext(CUSTOM_TYPE_RAW_VIEW, tensor_data(obj))"),
    py("vllm/v1/serial_utils.py:269", "data = len(self.aux_buffers)"),
    py("vllm/v1/engine/core_client.py:1290",
       "message = (request_type.value, *self.encoder.encode(request))"),
    rs("rust/src/engine-core-client/src/client/imp.rs:35",
       "const DEFAULT_MSGPACK_ZERO_COPY_THRESHOLD: usize = 256;"),
    rs("rust/src/engine-core-client/src/protocol/tensor.rs:275", "if bytes.len() < threshold {"),
    rs("rust/src/engine-core-client/src/protocol/tensor.rs:279",
       "let index = aux_frames.len() + 1;"),
    rs("rust/src/engine-core-client/src/client/imp.rs:285",
       "let aux_frames = payload.extract_aux_frames(self.msgpack_zero_copy_threshold);"),
    rs("rust/src/engine-core-client/src/tests/client.rs:1908",
       "async fn client_sends_large_multimodal_tensor_as_aux_frame()"),
    engine("vllm/v1/serial_utils.py:407", "buffer = self.aux_buffers[data] if is_aux else data"),
    note="rust applies the same encoding to the tensors it sends (multimodal features, "
    "prompt_logprob_token_ids) but refuses prompt_embeds itself (protocol/request.rs:139), "
    "so it cannot run these cases")
NEEDS = [Capability.GENERATE, Capability.INPUT_TENSORS]
EMBEDS_FIELD = 9  # EngineCoreRequest.prompt_embeds in the 22-element ADD array


def _rows(count: int, width: int) -> list[list[float]]:
    """Values exact in float32, distinct per position."""
    return [[r + c / 64 for c in range(width)] for r in range(count)]


def _embeds(width: int) -> tuple[list[int], list[list[float]], bytes]:
    """The prompt, its rows of `width` float32 values and their raw native-endian bytes."""
    p = prompt(7)
    rows = _rows(len(p), width)
    return p, rows, array.array("f", [v for row in rows for v in row]).tobytes()


def _tensor_form(width: int) -> dict[str, object]:
    """A params entry: the tensor's size and how it must travel."""
    p, _, data = _embeds(width)
    large = len(data) >= 256
    return {"width": width, "form": "aux_frame" if large else "inline", "count": len(p),
            "nbytes": len(data),
            "how": ("as an aux frame: a 3-frame ADD whose tensor data is aux index 1 and whose "
                    "frame 2 is the raw native-endian bytes" if large else
                    "inline: a 2-frame ADD whose tensor data is ext(3) raw native-endian bytes")}


@case("streaming.inputs.prompt_embeds_{form}", Level.MUST,
      "A {count}x{width} float32 prompt_embeds tensor ({nbytes} bytes) goes out {how}; it "
      "decodes to the same values and the request is served.",
      grounds=TENSOR_FRAMES, needs=NEEDS,
      # 3 x 32 x 4 = 384 bytes (aux frame); 3 x 8 x 4 = 96 (inline)
      params=[_tensor_form(width) for width in (32, 8)])
async def prompt_embeds(ctx: CaseContext, width: int) -> None:
    p, rows, data = _embeds(width)
    large = len(data) >= 256
    group = await ctx.start([EngineScript(rules=[by_prompt(p, stream([100, 101]))])])
    handle = await ctx.driver.generate(p, 2, params={"prompt_embeds": rows})
    await ctx.wait_until(lambda: handle.ended, 3)
    records = [r for r in group.transcript.select(direction="in", kind=AddRequest)
               if r.message.request.prompt_token_ids == p]
    ctx.require(len(records) == 1, expected="one ADD with the prompt",
                observed=f"{len(records)}")
    frames = records[0].frames
    main = msgspec.msgpack.decode(frames[1]) if len(frames) > 1 else None
    field = main[EMBEDS_FIELD] if isinstance(main, list) and len(main) > 9 else None
    shape = f"{len(frames)} frames, prompt_embeds on the wire = {field!r:.120}"
    want_frames = 3 if large else 2
    ctx.require(len(frames) == want_frames,
                expected=f"[type, payload{', aux' if large else ''}] "
                         f"({want_frames} frames)", observed=shape)
    ok_ref = (isinstance(field, list) and len(field) == 3 and field[0] == "float32"
              and field[1] == [len(p), width])
    if large:
        ok_ref = ok_ref and field[2] == 1 and frames[2] == data  # type: ignore[index]
    else:
        ok_ref = ok_ref and isinstance(field[2], msgspec.msgpack.Ext) \
            and field[2].code == 3 and field[2].data == data  # type: ignore[index]
    ctx.require(ok_ref, expected=f"[\"float32\", [{len(p)}, {width}], "
                + ("1] with frame 2 = the raw bytes" if large else "ext(3, raw bytes)]"),
                observed=shape)
    decoded = records[0].message.request.prompt_embeds
    ctx.require(decoded is not None and decoded.data == data,
                expected="the tensor decodes to the values sent",
                observed=f"{decoded!r}")
    ctx.require(handle.finish_reason == "length" and handle.tokens == [100, 101],
                expected="the request served: 'length' with [100, 101]",
                observed=f"finish={handle.finish_reason} error={handle.error} "
                         f"tokens={handle.tokens}")


# ----------------------------------------------------------------- tensor beside fields

# prompt_embeds has its own ADD field; extra_args holds only kv/ec transfer params (and the
# user's vllm_xargs).
EMBEDS_ONLY_IN_FIELD = both(
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


@case("streaming.inputs.prompt_embeds_not_in_extra_args_{name}", Level.MUST,
      "prompt_embeds travels only as the ADD's tensor field: SamplingParams.extra_args "
      "carries no copy of it ({beside}).",
      grounds=EMBEDS_ONLY_IN_FIELD,
      params=[{"with_kv": False, "name": "alone", "beside": "nothing at all", "needs": NEEDS},
              {"with_kv": True, "name": "with_kv_transfer_params",
               "beside": "exactly the kv_transfer_params sent beside it",
               "needs": [*NEEDS, Capability.PASS_THROUGH]}])
async def embeds_only_as_tensor(ctx: CaseContext, with_kv: bool) -> None:
    want = {"kv_transfer_params": KV} if with_kv else None
    p, rows, _data = _embeds(8)
    group = await ctx.start([EngineScript(rules=[by_prompt(p, stream([100, 101]))])])
    params: dict[str, object] = {"prompt_embeds": rows}
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
