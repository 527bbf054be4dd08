"""Our codec against frames vLLM 0.33.0 itself produced (fixtures/wire, see its README).

The codec was written from protocol facts; these vectors are the proof that it reads what real
vLLM sends and writes back the identical bytes. No vLLM needed here: the vectors are data.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from harness.protocol.wire import (
    DEFAULT_CODEC,
    AbortRequests,
    AddRequest,
    EngineDead,
    WireCodec,
)
from harness.protocol.wire import messages as m

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "wire"
VECTOR_FILES = sorted(FIXTURES.glob("*.json"))
KINDS = {"engine_input", "outputs", "ready", "handshake_status", "init", "dp_stats", "dead"}


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    doc["frames"] = [bytes.fromhex(h) for h in doc["frames_hex"]]
    return doc


def decode(codec: WireCodec, kind: str, frames: list[bytes]) -> Any:
    """The decoder a receiver of this vector would use."""
    if kind == "engine_input":
        return codec.decode_engine_input(frames)
    if kind in ("outputs", "dead"):
        return codec.decode_outputs(frames)
    assert len(frames) == 1, f"{kind} is a single-frame message"
    if kind == "ready":
        return codec.decode_ready(frames[0])
    if kind == "handshake_status":
        return codec.decode_handshake_status(frames[0])
    if kind == "init":
        return codec.decode_init(frames[0])
    if kind == "dp_stats":
        return codec.decode_dp_stats(frames[0])
    raise AssertionError(f"unknown kind {kind!r}")


def _diff(want: list[bytes], got: list[bytes]) -> str:
    lines = [f"frame count: want {len(want)}, got {len(got)}"]
    for i, (a, b) in enumerate(zip(want, got, strict=False)):
        if a != b:
            at = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]),
                      min(len(a), len(b)))
            lines.append(f"frame {i} differs at byte {at} (len {len(a)} vs {len(b)}):\n"
                         f"  want ...{a[max(0, at - 16):at + 32].hex()}\n"
                         f"  got  ...{b[max(0, at - 16):at + 32].hex()}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- every vector


def test_vectors_present() -> None:
    assert len(VECTOR_FILES) >= 30, f"golden vectors missing in {FIXTURES}"
    kinds = {json.loads(p.read_text(encoding="utf-8"))["kind"] for p in VECTOR_FILES}
    assert kinds == KINDS


@pytest.mark.parametrize("path", VECTOR_FILES, ids=[p.stem for p in VECTOR_FILES])
def test_round_trip_is_byte_exact(path: Path) -> None:
    doc = load(path.stem)
    assert doc["name"] == path.stem
    message = decode(DEFAULT_CODEC, doc["kind"], doc["frames"])
    again = DEFAULT_CODEC.encode_message(message)
    assert again == doc["frames"], _diff(doc["frames"], again)


@pytest.mark.parametrize("path", VECTOR_FILES, ids=[p.stem for p in VECTOR_FILES])
def test_array_lengths_match_profile(path: Path) -> None:
    """The array_like lengths in the profile are what vLLM actually sends."""
    doc = load(path.stem)
    decoded, profile = doc["decoded"], DEFAULT_CODEC.profile
    if doc["kind"] == "engine_input" and doc["frames"][0] == m.RequestType.ADD.value:
        assert len(decoded) == profile.request_array_len
    if doc["kind"] == "outputs":
        assert len(decoded) == profile.outputs_array_len
        for output in decoded[1]:
            assert len(output) == profile.output_array_len


# --------------------------------------------------------------------------- decoded values


def test_add_greedy_values() -> None:
    doc = load("add_greedy")
    msg = DEFAULT_CODEC.decode_engine_input(doc["frames"])
    assert isinstance(msg, AddRequest)
    req, want = msg.request, doc["decoded"]
    assert (req.request_id, req.prompt_token_ids, req.arrival_time) == (want[0], want[1], want[5])
    assert req.external_req_id == want[16] == "a"
    sp, want_sp = req.sampling_params, want[3]
    assert sp is not None
    assert sp.temperature == want_sp["temperature"] == 0.0
    assert sp.max_tokens == want_sp["max_tokens"] == 8
    assert sp._eos_token_id == want_sp["_eos_token_id"] == 2
    assert sp._all_stop_token_ids == set(want_sp["_all_stop_token_ids"]) == {2}
    # Real vLLM normalises stop/stop_token_ids/bad_words to [] in __post_init__, so those
    # non-default empties are on the wire (the protocol doc's derived example omits them).
    assert sp.stop == want_sp["stop"] == []
    assert sp.skip_reading_prefix_cache is False


def test_add_sampling_full_values() -> None:
    doc = load("add_sampling_full")
    msg = DEFAULT_CODEC.decode_engine_input(doc["frames"])
    assert isinstance(msg, AddRequest)
    req, want_sp = msg.request, doc["decoded"][3]
    sp = req.sampling_params
    assert sp is not None
    assert sp.seed == want_sp["seed"] == 1234
    assert sp.stop == want_sp["stop"] == ["\n\n", "END"]
    assert sp.logit_bias == {int(k): v for k, v in want_sp["logit_bias"].items()}
    assert sp.output_kind is m.RequestOutputKind.DELTA
    assert sorted(sp.stop_token_ids or []) == sorted(want_sp["stop_token_ids"])
    assert (req.client_index, req.priority, req.data_parallel_rank) == (1, -2, 1)
    assert req.trace_headers is not None and "traceparent" in req.trace_headers


def test_add_lora_and_pooling_values() -> None:
    msg = DEFAULT_CODEC.decode_engine_input(load("add_lora")["frames"])
    assert isinstance(msg, AddRequest)
    assert msg.request.lora_request == m.LoRARequest("sql", 1, "/loras/sql")
    pooled = DEFAULT_CODEC.decode_engine_input(load("add_pooling")["frames"])
    assert isinstance(pooled, AddRequest)
    assert pooled.request.sampling_params is None
    assert pooled.request.pooling_params is not None
    assert pooled.request.pooling_params.task == "embed"


def test_prompt_embeds_inline_and_aux() -> None:
    doc = load("add_prompt_embeds_aux")
    msg = DEFAULT_CODEC.decode_engine_input(doc["frames"])
    assert isinstance(msg, AddRequest) and msg.request.prompt_embeds is not None
    assert doc["decoded"][9] == ["float32", [8, 16], 1]
    assert msg.request.prompt_embeds == m.WireArray("float32", (8, 16), doc["frames"][2])
    inline = DEFAULT_CODEC.decode_engine_input(load("add_prompt_embeds_inline")["frames"])
    assert isinstance(inline, AddRequest) and inline.request.prompt_embeds is not None
    assert inline.request.prompt_embeds.dtype == "bfloat16"
    assert len(inline.request.prompt_embeds.data) == 8


def test_abort_utility_and_wave_values() -> None:
    abort = DEFAULT_CODEC.decode_engine_input(load("abort")["frames"])
    assert isinstance(abort, AbortRequests)
    assert abort.request_ids == load("abort")["decoded"]
    util = DEFAULT_CODEC.decode_engine_input(load("utility_is_sleeping")["frames"])
    assert util == m.UtilityRequest(0, 0x9F3C2B1A00112233, "is_sleeping", [])
    reset = DEFAULT_CODEC.decode_engine_input(load("utility_reset_prefix_cache")["frames"])
    assert isinstance(reset, m.UtilityRequest) and reset.args == [False, False]
    lora = DEFAULT_CODEC.decode_engine_input(load("utility_add_lora")["frames"])
    assert isinstance(lora, m.UtilityRequest)
    assert lora.args == [["sql", 1, "/loras/sql", None, False, False]]
    wave = DEFAULT_CODEC.decode_engine_input(load("start_dp_wave")["frames"])
    assert wave == m.StartDPWave(5, 1)


def test_outputs_values() -> None:
    doc = load("outputs_token")
    outs = DEFAULT_CODEC.decode_outputs(doc["frames"])
    assert isinstance(outs, m.EngineCoreOutputs)
    assert outs.timestamp == doc["decoded"][3] == 2.0
    assert outs.outputs[0].new_token_ids == [7] and not outs.outputs[0].finished
    assert outs.weight_version == "default"

    stop = DEFAULT_CODEC.decode_outputs(load("outputs_final_stop_token")["frames"])
    assert isinstance(stop, m.EngineCoreOutputs)
    assert stop.outputs[0].finish_reason is m.FinishReason.STOP
    assert stop.outputs[0].stop_reason == 13

    kv = DEFAULT_CODEC.decode_outputs(load("outputs_final_length_kv")["frames"])
    assert isinstance(kv, m.EngineCoreOutputs)
    assert kv.engine_index == 1 and kv.finished_requests == ["b-2"]
    assert kv.outputs[0].finish_reason is m.FinishReason.LENGTH
    assert kv.outputs[0].kv_transfer_params == load("outputs_final_length_kv")["decoded"][1][0][8]

    err = DEFAULT_CODEC.decode_outputs(load("outputs_error_paused")["frames"])
    assert isinstance(err, m.EngineCoreOutputs)
    assert err.outputs[0].finish_reason is m.FinishReason.ERROR
    assert err.outputs[0].error == m.RequestError(
        "engine_paused", "Generation is paused. Please retry after it resumes.", True)

    aborts = load("outputs_abort_finished_set")
    ab = DEFAULT_CODEC.decode_outputs(aborts["frames"])
    assert isinstance(ab, m.EngineCoreOutputs)
    assert ab.finished_requests == aborts["decoded"][5]
    assert sorted(ab.finished_requests or []) == ["r1", "r2"]


def test_routed_experts_inline_and_aux() -> None:
    inline = DEFAULT_CODEC.decode_outputs(load("outputs_routed_experts_inline")["frames"])
    assert isinstance(inline, m.EngineCoreOutputs)
    arr = inline.outputs[0].routed_experts
    assert arr == m.WireArray("<i4", (1, 3), (1).to_bytes(4, "little")
                              + (2).to_bytes(4, "little") + (3).to_bytes(4, "little"))
    doc = load("outputs_routed_experts_aux")
    assert len(doc["frames"]) == 2 and len(doc["frames"][1]) == 512
    assert doc["decoded"][1][0][12] == ["<f4", [64, 2], 1]
    aux = DEFAULT_CODEC.decode_outputs(doc["frames"])
    assert isinstance(aux, m.EngineCoreOutputs)
    assert aux.outputs[0].routed_experts == m.WireArray("<f4", (64, 2), doc["frames"][1])


def test_logprobs_events_and_stats_values() -> None:
    outs = DEFAULT_CODEC.decode_outputs(load("outputs_logprobs_events")["frames"])
    assert isinstance(outs, m.EngineCoreOutputs)
    out = outs.outputs[0]
    assert out.new_logprobs is not None and out.new_logprobs.logprobs.shape == (1, 3)
    assert out.events == [m.EngineCoreEvent(m.EngineCoreEventType.QUEUED, 1.0),
                          m.EngineCoreEvent(m.EngineCoreEventType.SCHEDULED, 1.25)]
    assert out.num_nans_in_logits == 1
    doc = load("outputs_scheduler_stats")
    stats = DEFAULT_CODEC.decode_outputs(doc["frames"])
    assert isinstance(stats, m.EngineCoreOutputs) and stats.scheduler_stats is not None
    assert stats.scheduler_stats == doc["decoded"][2]
    assert stats.scheduler_stats["kv_cache_usage"] == 0.5


def test_utility_reply_values() -> None:
    ok = DEFAULT_CODEC.decode_outputs(load("utility_success_list")["frames"])
    assert isinstance(ok, m.EngineCoreOutputs) and ok.utility_output is not None
    assert ok.utility_output == m.UtilityOutput(42, None, m.UtilityResult(None, ["generate"]))
    none = DEFAULT_CODEC.decode_outputs(load("utility_success_none")["frames"])
    assert isinstance(none, m.EngineCoreOutputs) and none.utility_output is not None
    assert none.utility_output.result == m.UtilityResult(None, None)
    fail = DEFAULT_CODEC.decode_outputs(load("utility_failure")["frames"])
    assert isinstance(fail, m.EngineCoreOutputs) and fail.utility_output is not None
    assert fail.utility_output.failure_message == "Call to foo method failed: boom"
    assert fail.utility_output.result is None


def test_dead_ready_handshake_init_stats_values() -> None:
    assert isinstance(DEFAULT_CODEC.decode_outputs(load("dead")["frames"]), EngineDead)

    doc = load("ready_response")
    ready = DEFAULT_CODEC.decode_ready(doc["frames"][0])
    assert ready is not None
    assert ready.max_model_len == doc["decoded"]["max_model_len"] == 4096
    assert ready.kv_cache_max_concurrency == 39.06
    assert list(doc["decoded"]) == [
        f.name for f in msgspec.structs.fields(m.EngineCoreReadyResponse)]
    dp = DEFAULT_CODEC.decode_ready(load("ready_response_dp")["frames"][0])
    assert dp is not None and dp.kv_events_config is not None
    assert dp.kv_events_config["endpoint"] == "tcp://*:5557"
    assert (dp.data_parallel_rank, dp.coord_store_port) == (3, 29555)

    hello = DEFAULT_CODEC.decode_handshake_status(load("handshake_hello")["frames"][0])
    assert (hello.status, hello.local, hello.headless) == ("HELLO", True, False)
    ready_dp = DEFAULT_CODEC.decode_handshake_status(load("handshake_ready_dp")["frames"][0])
    assert ready_dp.parallel_config_hash == "9c1f0e2a7b"

    init = DEFAULT_CODEC.decode_init(load("init_dp")["frames"][0])
    assert init.addresses.inputs == ["ipc:///tmp/in0", "ipc:///tmp/in1"]
    assert init.parallel_config["_data_parallel_master_port_list"] == [29501, 29502]

    stats = DEFAULT_CODEC.decode_dp_stats(load("dp_stats")["frames"][0])
    assert stats == m.DPStatsUpdate([(0, 3, 0.25), (1, 2, 0.5)], 5, True)
    wave = DEFAULT_CODEC.decode_dp_stats(load("dp_stats_wave_only")["frames"][0])
    assert wave == m.DPStatsUpdate(None, 6, False)
