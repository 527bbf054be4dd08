"""Regenerate fixtures/wire: golden frame vectors produced by vLLM 0.33.0 itself.

Our codec (harness/protocol/wire) was written from protocol facts; these
vectors are the check that it
matches the real implementation byte for byte. Every vector is built from real vLLM objects
(EngineCoreRequest, SamplingParams, EngineCoreOutputs, UtilityResult, the ready-response and
handshake dataclasses, ...) and encoded the way vLLM encodes it on that socket: with
``vllm.v1.serial_utils.MsgpackEncoder`` for S2/S3 traffic, with ``msgspec.msgpack.encode``
where vLLM calls that directly (ready response, HELLO/INIT/READY, coordinator messages). The
HELLO vector is captured from vLLM's own ``EngineCoreProc.startup_handshake`` over a real ipc
socket pair.

tests/test_golden_vectors.py (no vLLM needed) decodes every vector with our codec, re-encodes
it and demands identical frames.

Runs only where vLLM 0.33.0 is importable (the vllm lane venv):

    VLLM_TARGET_DEVICE=cpu VLLM_HOST_IP=127.0.0.1 .venv/bin/python scripts/gen_golden_vectors.py
    ... scripts/gen_golden_vectors.py --check   # exit 1 if the checked-in files differ

Output is deterministic: fixed ids, call ids and timestamps, and the script re-executes itself
with PYTHONHASHSEED=0 so encoded sets of strings iterate in a fixed order.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "fixtures" / "wire"
EXPECTED_VLLM = "0.33.0"

# Which decode function of harness.protocol.wire.WireCodec applies to a vector.
KINDS = ("engine_input", "outputs", "ready", "handshake_status", "init", "dp_stats", "dead")


@dataclass(frozen=True)
class Vector:
    name: str
    kind: str
    description: str
    frames: list[bytes]
    # Index of the msgpack frame shown as "decoded" (1 for engine inputs: after the type byte).
    main: int


def _reexec_with_fixed_hash_seed() -> None:
    """Sets of strings (finished_requests) encode in hash order; pin it for reproducibility."""
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def _jsonable(obj: Any) -> Any:
    """A JSON view of a raw msgpack decode: bytes as hex, ext values tagged, keys as str."""
    import msgspec

    if isinstance(obj, msgspec.msgpack.Ext):
        return {"$ext": obj.code, "hex": bytes(obj.data).hex()}
    if isinstance(obj, bytes | bytearray | memoryview):
        return {"$bytes": bytes(obj).hex()}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj


def _frames(encoded: Sequence[Any]) -> list[bytes]:
    return [bytes(f) for f in encoded]


# --------------------------------------------------------------------------- builders


def build_vectors() -> list[Vector]:
    """Every golden vector, built from real vLLM 0.33.0 objects."""
    import msgspec
    import numpy as np
    import torch
    from vllm.config.kv_events import KVEventsConfig
    from vllm.lora.request import LoRARequest
    from vllm.outputs import RequestError
    from vllm.pooling_params import PoolingParams
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import (
        EngineCoreEvent,
        EngineCoreEventType,
        EngineCoreOutput,
        EngineCoreOutputs,
        EngineCoreReadyResponse,
        EngineCoreRequest,
        EngineCoreRequestType,
        FinishReason,
        UtilityOutput,
    )
    from vllm.v1.engine.coordinator import EngineState
    from vllm.v1.engine.core import EngineCoreProc
    from vllm.v1.engine.utils import EngineHandshakeMetadata, EngineZmqAddresses
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.outputs import LogprobsLists
    from vllm.v1.serial_utils import MsgpackEncoder, UtilityResult

    enc = MsgpackEncoder()
    assert enc.size_threshold == 256, "set VLLM_MSGPACK_ZERO_COPY_THRESHOLD back to default"
    vectors: list[Vector] = []

    def engine_input(name: str, description: str, rtype: Any, payload: Any) -> None:
        # What the frontend ROUTER sends minus the identity frame = what the engine receives.
        frames = [rtype.value, *_frames(enc.encode(payload))]
        vectors.append(Vector(name, "engine_input", description, frames, 1))

    def outputs(name: str, description: str, outs: Any) -> None:
        # encode_into (what the engine output thread uses) yields the same bytes as encode.
        buf = bytearray()
        frames = _frames(enc.encode_into(outs, buf))
        assert frames == _frames(enc.encode(outs))
        vectors.append(Vector(name, "outputs", description, frames, 0))

    def single(name: str, kind: str, description: str, payload: bytes) -> None:
        vectors.append(Vector(name, kind, description, [payload], 0))

    # ------------------------------------------------------------------ ADD

    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    # What InputProcessor does with the model's EOS: sets _eos_token_id, _all_stop_token_ids.
    greedy.update_from_generation_config({}, eos_token_id=2)
    assert greedy._eos_token_id == 2 and greedy._all_stop_token_ids == {2}
    engine_input(
        "add_greedy", "ADD: greedy, max_tokens 8, EOS 2 (set by update_from_generation_config)",
        EngineCoreRequestType.ADD,
        EngineCoreRequest(
            request_id="a-1", prompt_token_ids=[1, 2], mm_features=None,
            sampling_params=greedy, pooling_params=None, arrival_time=1.5,
            lora_request=None, cache_salt=None, data_parallel_rank=None,
            external_req_id="a",
        ),
    )

    sampled = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=40, seed=1234, max_tokens=32, min_tokens=2,
        stop=["\n\n", "END"], stop_token_ids=[13, 7], logit_bias={5: -1.5, 9: 2.0},
        output_kind=RequestOutputKind.DELTA, presence_penalty=0.5, logprobs=2,
        extra_args={"kv_transfer_params": {"do_remote_prefill": True}},
    )
    sampled.update_from_generation_config({"eos_token_id": [2, 3]}, eos_token_id=2)
    engine_input(
        "add_sampling_full",
        "ADD: seeded sampling with stop strings, stop_token_ids, logit_bias, logprobs, "
        "extra_args; client 1, priority, trace headers, DP rank hint",
        EngineCoreRequestType.ADD,
        EngineCoreRequest(
            request_id="chatcmpl-7-deadbeef", prompt_token_ids=[10, 11, 12, 300, 999],
            mm_features=None, sampling_params=sampled, pooling_params=None,
            arrival_time=1700000000.25, lora_request=None, cache_salt="salt-1",
            data_parallel_rank=1, client_index=1, current_wave=3, priority=-2,
            trace_headers={
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
            external_req_id="chatcmpl-7", reasoning_ended=False,
        ),
    )

    lora = LoRARequest("sql", 1, "/loras/sql")
    lora_params = SamplingParams(max_tokens=4, ignore_eos=True)
    lora_params.update_from_generation_config({}, eos_token_id=2)
    engine_input(
        "add_lora", "ADD with a LoRARequest (array_like, 6 fields); ignore_eos keeps "
        "_eos_token_id unset but _all_stop_token_ids gets the EOS",
        EngineCoreRequestType.ADD,
        EngineCoreRequest(
            request_id="l-1", prompt_token_ids=[5, 6, 7], mm_features=None,
            sampling_params=lora_params, pooling_params=None, arrival_time=2.0,
            lora_request=lora, cache_salt=None, data_parallel_rank=None,
            external_req_id="l",
        ),
    )

    embeds = torch.arange(8 * 16, dtype=torch.float32).reshape(8, 16) / 16.0  # 512 bytes
    engine_input(
        "add_prompt_embeds_aux",
        "ADD with an 8x16 float32 prompt_embeds tensor (512 bytes -> aux frame, index 1)",
        EngineCoreRequestType.ADD,
        EngineCoreRequest(
            request_id="e-1", prompt_token_ids=None, mm_features=None,
            sampling_params=SamplingParams(max_tokens=2), pooling_params=None,
            arrival_time=3.0, lora_request=None, cache_salt=None,
            data_parallel_rank=None, prompt_embeds=embeds, external_req_id="e",
        ),
    )
    small = torch.tensor([[0.5, -1.0], [2.0, 0.25]], dtype=torch.bfloat16)
    engine_input(
        "add_prompt_embeds_inline",
        "ADD with a 2x2 bfloat16 prompt_embeds tensor (8 bytes inline as ext 3)",
        EngineCoreRequestType.ADD,
        EngineCoreRequest(
            request_id="e-2", prompt_token_ids=None, mm_features=None,
            sampling_params=SamplingParams(max_tokens=2), pooling_params=None,
            arrival_time=3.0, lora_request=None, cache_salt=None,
            data_parallel_rank=None, prompt_embeds=small, external_req_id="e2",
        ),
    )
    engine_input(
        "add_pooling", "ADD for a pooling model: sampling_params nil, PoolingParams array",
        EngineCoreRequestType.ADD,
        EngineCoreRequest(
            request_id="p-1", prompt_token_ids=[4, 5], mm_features=None,
            sampling_params=None, pooling_params=PoolingParams(task="embed", dimensions=8),
            arrival_time=4.0, lora_request=None, cache_salt=None, data_parallel_rank=None,
        ),
    )

    # ------------------------------------------------------------ ABORT / UTILITY / WAVE

    engine_input("abort", "ABORT of two internal request ids", EngineCoreRequestType.ABORT,
                 ["req-0-abcd1234", "req-1-efgh5678"])
    # (client_index, call_id, method, args): args is the *args tuple of call_utility_async.
    engine_input("utility_is_sleeping", "UTILITY is_sleeping() from client 0",
                 EngineCoreRequestType.UTILITY, (0, 0x9F3C2B1A00112233, "is_sleeping", ()))
    engine_input("utility_reset_prefix_cache",
                 "UTILITY reset_prefix_cache(False, False) from client 0",
                 EngineCoreRequestType.UTILITY,
                 (0, 0x9F3C2B1A00112234, "reset_prefix_cache", (False, False)))
    engine_input("utility_add_lora", "UTILITY add_lora(LoRARequest) from client 1",
                 EngineCoreRequestType.UTILITY,
                 (1, 0x9F3C2B1A00112235, "add_lora", (lora,)))
    # The coordinator encodes START_DP_WAVE with plain msgspec (coordinator._send_start_wave).
    vectors.append(Vector(
        "start_dp_wave", "engine_input", "START_DP_WAVE wave 5 excluding engine 1 (S4)",
        [EngineCoreRequestType.START_DP_WAVE.value, msgspec.msgpack.encode((5, 1))], 1))
    vectors.append(Vector(
        "start_dp_wave_no_exclude", "engine_input", "START_DP_WAVE wave 6, nobody excluded",
        [EngineCoreRequestType.START_DP_WAVE.value, msgspec.msgpack.encode((6, None))], 1))

    # ------------------------------------------------------------------ outputs

    outputs("outputs_token", "one generated token 7 for a-1 at engine time 2.0",
            EngineCoreOutputs(engine_index=0, outputs=[EngineCoreOutput("a-1", [7])],
                              timestamp=2.0, weight_version="default"))
    outputs("outputs_final_stop", "final token (EOS 2), FinishReason.STOP",
            EngineCoreOutputs(
                outputs=[EngineCoreOutput("a-1", [2], finish_reason=FinishReason.STOP)],
                timestamp=2.5, weight_version="default"))
    outputs("outputs_final_stop_token",
            "final via a stop_token_ids hit: STOP with stop_reason = the token id",
            EngineCoreOutputs(
                outputs=[EngineCoreOutput("a-1", [13], finish_reason=FinishReason.STOP,
                                          stop_reason=13)],
                timestamp=2.5, weight_version="default"))
    outputs("outputs_final_length_kv",
            "final LENGTH with kv_transfer_params and finished_requests (internal-LB DP)",
            EngineCoreOutputs(
                engine_index=1,
                outputs=[EngineCoreOutput(
                    "b-2", [44, 45], finish_reason=FinishReason.LENGTH,
                    kv_transfer_params={"do_remote_decode": False, "remote_block_ids": [1, 2],
                                        "remote_engine_id": "e1", "remote_port": 5600})],
                timestamp=7.125, finished_requests={"b-2"}, weight_version="default"))
    outputs("outputs_error_paused",
            "ERROR with RequestError (paused engine rejecting an ADD)",
            EngineCoreOutputs(
                outputs=[EngineCoreOutput(
                    "c-3", [], finish_reason=FinishReason.ERROR,
                    error=RequestError("engine_paused", "Generation is paused. Please retry "
                                       "after it resumes.", True))],
                timestamp=8.0, finished_requests={"c-3"}))
    outputs("outputs_error_validation",
            "ERROR with a non-retryable validation RequestError (default retryable=False)",
            EngineCoreOutputs(
                outputs=[EngineCoreOutput(
                    "c-4", [], finish_reason=FinishReason.ERROR,
                    error=RequestError("validation_error", "max_tokens too large"))],
                timestamp=8.5))
    outputs("outputs_abort_finished_set",
            "two aborts reported in finished_requests (a set; PYTHONHASHSEED=0 order)",
            EngineCoreOutputs(
                outputs=[EngineCoreOutput("r1", [], finish_reason=FinishReason.ABORT),
                         EngineCoreOutput("r2", [], finish_reason=FinishReason.ABORT)],
                timestamp=2.0, finished_requests={"r1", "r2"}))
    outputs("outputs_routed_experts_inline",
            "routed_experts: a 1x3 int32 ndarray (12 bytes inline, ext 3)",
            EngineCoreOutputs(
                outputs=[EngineCoreOutput(
                    "d-1", [9], routed_experts=np.array([[1, 2, 3]], dtype=np.int32))],
                timestamp=9.0, weight_version="default"))
    outputs("outputs_routed_experts_aux",
            "routed_experts: a 64x2 float32 ndarray (512 bytes -> aux frame 1)",
            EngineCoreOutputs(
                outputs=[EngineCoreOutput(
                    "d-2", [9], finish_reason=FinishReason.LENGTH,
                    routed_experts=(np.arange(128, dtype=np.float32) / 4).reshape(64, 2))],
                timestamp=9.5, weight_version="default"))
    outputs("outputs_logprobs_events",
            "LogprobsLists (NamedTuple of ndarrays), events, prefill_stats, num_nans",
            EngineCoreOutputs(
                outputs=[EngineCoreOutput(
                    "f-1", [17],
                    new_logprobs=LogprobsLists(
                        np.array([[17, 3, 4]], dtype=np.int32),
                        np.array([[-0.25, -1.5, -2.0]], dtype=np.float32),
                        np.array([1], dtype=np.int32), None),
                    events=[EngineCoreEvent(EngineCoreEventType.QUEUED, 1.0),
                            EngineCoreEvent(EngineCoreEventType.SCHEDULED, 1.25)],
                    num_nans_in_logits=1)],
                timestamp=10.0, weight_version="v2"))
    stats = SchedulerStats(num_running_reqs=2, num_waiting_reqs=1, step_counter=3,
                           current_wave=1, kv_cache_usage=0.5)
    outputs("outputs_scheduler_stats", "engine 1 step with SchedulerStats (dataclass map)",
            EngineCoreOutputs(engine_index=1, scheduler_stats=stats, timestamp=4.0,
                              weight_version="default"))
    outputs("outputs_wave_complete", "engine 1 reports wave 5 complete",
            EngineCoreOutputs(engine_index=1, timestamp=4.0, wave_complete=5))
    outputs("outputs_start_wave", "engine 1 -> coordinator start_wave 5 (S5)",
            EngineCoreOutputs(engine_index=1, timestamp=4.0, start_wave=5))

    # UtilityOutput replies, as EngineCoreProc builds them: result wrapped in UtilityResult.
    outputs("utility_success_list", "utility reply call 42 -> ['generate']",
            EngineCoreOutputs(utility_output=UtilityOutput(
                42, result=UtilityResult(["generate"])), timestamp=3.0))
    outputs("utility_success_none", "utility reply for a method returning None",
            EngineCoreOutputs(utility_output=UtilityOutput(
                0x9F3C2B1A00112236, result=UtilityResult(None)), timestamp=3.0))
    outputs("utility_success_bool", "is_sleeping reply False for a 64-bit call id",
            EngineCoreOutputs(engine_index=2, utility_output=UtilityOutput(
                0x9F3C2B1A00112233, result=UtilityResult(False)), timestamp=3.0))
    outputs("utility_failure", "utility failure reply",
            EngineCoreOutputs(utility_output=UtilityOutput(
                5, failure_message="Call to foo method failed: boom"), timestamp=1.0))

    vectors.append(Vector("dead", "dead", "ENGINE_CORE_DEAD sentinel (EngineCoreProc constant)",
                          [EngineCoreProc.ENGINE_CORE_DEAD], 0))

    # ------------------------------------------------------------------ ready response

    ready = EngineCoreReadyResponse(
        max_model_len=4096, num_gpu_blocks=10000, block_size=16, dp_stats_address=None,
        dtype="bfloat16", vllm_version="0.33.0", world_size=1, data_parallel_size=1,
        tensor_parallel_size=1, pipeline_parallel_size=1, decode_context_parallel_size=1,
        data_parallel_rank=0, max_num_seqs=256, max_num_batched_tokens=8192,
        instance_id="abc12", supports_lora=False, max_loras=0,
        kv_cache_size_tokens=160000, kv_cache_max_concurrency=39.06,
        effective_attention_block_size=16,
    )
    single("ready_response", "ready", "EngineCoreReadyResponse, DP=1, defaults for optionals",
           msgspec.msgpack.encode(ready))
    ready_dp = EngineCoreReadyResponse(
        max_model_len=2048, num_gpu_blocks=512, block_size=32,
        dp_stats_address="tcp://10.0.0.1:5570", dtype="float16", vllm_version="0.33.0",
        world_size=2, data_parallel_size=4, tensor_parallel_size=2, pipeline_parallel_size=1,
        decode_context_parallel_size=1, data_parallel_rank=3, max_num_seqs=128,
        max_num_batched_tokens=4096, instance_id="1730000000000000000", supports_lora=True,
        max_loras=4, mamba_block_size=64, kv_cache_size_tokens=None,
        kv_cache_max_concurrency=None,
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                        endpoint="tcp://*:5557"),
        weight_transfer_backend="nccl", enable_sleep_mode=True,
        supports_draft_weight_updates=False, effective_attention_block_size=None,
        coord_store_port=29555, coordinator_input_address="ipc:///tmp/coord-in",
        coordinator_output_address="ipc:///tmp/coord-out",
    )
    single("ready_response_dp", "ready",
           "EngineCoreReadyResponse, DP rank 3, LoRA, KVEventsConfig, coordinator addresses",
           msgspec.msgpack.encode(ready_dp))

    # ------------------------------------------------------------------ handshake

    init = EngineHandshakeMetadata(
        addresses=EngineZmqAddresses(inputs=["ipc:///tmp/in"], outputs=["ipc:///tmp/out"]),
        parallel_config={})
    hello = _capture_hello(EngineCoreProc.startup_handshake, msgspec.msgpack.encode(init),
                           init.addresses)
    single("handshake_hello", "handshake_status",
           "HELLO captured from EngineCoreProc.startup_handshake over a real ipc socket",
           hello)
    # READY is a dict literal inside EngineCoreProc._perform_handshakes; same keys, same order.
    single("handshake_ready", "handshake_status", "READY, DP=1",
           msgspec.msgpack.encode({"status": "READY", "local": True, "headless": False}))
    single("handshake_ready_dp", "handshake_status",
           "READY from a headless DP engine with parallel_config_hash",
           msgspec.msgpack.encode({"status": "READY", "local": False, "headless": True,
                                   "parallel_config_hash": "9c1f0e2a7b"}))
    single("init", "init", "INIT for one client over ipc, no coordinator",
           msgspec.msgpack.encode(init))
    init_dp = EngineHandshakeMetadata(
        addresses=EngineZmqAddresses(
            inputs=["ipc:///tmp/in0", "ipc:///tmp/in1"],
            outputs=["ipc:///tmp/out0", "ipc:///tmp/out1"],
            coordinator_input="tcp://10.0.0.1:5571", coordinator_output="tcp://10.0.0.1:5572",
            frontend_stats_publish_address="tcp://10.0.0.1:5570"),
        parallel_config={"data_parallel_master_ip": "10.0.0.1",
                         "data_parallel_master_port": 29500,
                         "_data_parallel_master_port_list": [29501, 29502],
                         "_coord_store_port": 29555, "data_parallel_size": 4})
    single("init_dp", "init", "INIT for two clients with coordinator and MoE DP parallel_config",
           msgspec.msgpack.encode(init_dp))

    # ------------------------------------------------------------------ coordinator -> S6

    engine_state: Any = EngineState  # untyped in vLLM
    e0, e1 = engine_state(), engine_state()
    e0.request_counts[:] = [0, 3, 0.25]
    e1.request_counts[:] = [1, 2, 0.5]
    single("dp_stats", "dp_stats", "coordinator stats [counts, wave, running] for 2 engines",
           msgspec.msgpack.encode(([e0.request_counts, e1.request_counts], 5, True)))
    fresh = engine_state()  # counts before any stats arrived: [0, 0, 0.0]
    single("dp_stats_fresh", "dp_stats", "coordinator stats with an engine's initial counts",
           msgspec.msgpack.encode(([fresh.request_counts], 0, False)))
    single("dp_stats_wave_only", "dp_stats", "wave-state-only update [nil, 6, false]",
           msgspec.msgpack.encode((None, 6, False)))

    names = [v.name for v in vectors]
    assert len(names) == len(set(names)), "duplicate vector names"
    assert all(v.kind in KINDS for v in vectors)
    return vectors


def _capture_hello(startup_handshake: Callable[..., Any], init_payload: bytes,
                   expected_addresses: Any) -> bytes:
    """Run vLLM's engine-side handshake against a ROUTER we own; return the HELLO bytes."""
    import zmq

    with tempfile.TemporaryDirectory(prefix="cw-gold-") as tmp:
        address = f"ipc://{tmp}/hs"
        ctx = zmq.Context()
        router = ctx.socket(zmq.ROUTER)
        dealer = ctx.socket(zmq.DEALER)
        try:
            router.bind(address)
            dealer.setsockopt(zmq.IDENTITY, (0).to_bytes(2, "little"))
            dealer.connect(address)
            result: dict[str, Any] = {}

            def engine() -> None:
                try:
                    result["addresses"] = startup_handshake(dealer, True, False, None)
                except BaseException as exc:  # reported below
                    result["error"] = exc

            thread = threading.Thread(target=engine, daemon=True)
            thread.start()
            if not router.poll(10_000):
                raise RuntimeError("no HELLO from EngineCoreProc.startup_handshake")
            identity, hello = router.recv_multipart()
            router.send_multipart([identity, init_payload])
            thread.join(10)
            if thread.is_alive() or "error" in result:
                raise RuntimeError(f"startup_handshake did not finish: {result.get('error')}")
            if result["addresses"] != expected_addresses:
                raise RuntimeError(f"engine decoded INIT as {result['addresses']!r}")
            return bytes(hello)
        finally:
            dealer.close(0)
            router.close(0)
            ctx.term()


# --------------------------------------------------------------------------- output


def render(vector: Vector) -> str:
    import msgspec

    decoded: Any = None
    if vector.kind != "dead":
        main = vector.frames[vector.main]
        decoded = _jsonable(msgspec.msgpack.decode(main, ext_hook=msgspec.msgpack.Ext))
    doc = {
        "name": vector.name,
        "kind": vector.kind,
        "description": vector.description,
        "main_frame": vector.main,
        "frames_hex": [f.hex() for f in vector.frames],
        "decoded": decoded,
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


README_TEMPLATE = """\
# Golden wire vectors (vLLM {vllm_version})

Generated by `scripts/gen_golden_vectors.py` on {date} with vLLM {vllm_version}
(`vllm/_version.py` commit `{commit}`), msgspec {msgspec_version}, numpy {numpy_version},
torch {torch_version}, Python {python_version}. Do not edit by hand; regenerate with

    VLLM_TARGET_DEVICE=cpu VLLM_HOST_IP=127.0.0.1 .venv/bin/python scripts/gen_golden_vectors.py

(`--check` compares instead of writing). The JSON files are deterministic: fixed ids, call ids
and timestamps, and the generator runs under `PYTHONHASHSEED=0` because sets of strings
(`finished_requests`) are encoded in hash order.

How each vector was produced:

* Every message is a real vLLM object (`EngineCoreRequest` with `SamplingParams` /
  `PoolingParams` / `LoRARequest`, `EngineCoreOutputs` / `EngineCoreOutput`, `RequestError`,
  `LogprobsLists`, `SchedulerStats`, `UtilityOutput` + `vllm.v1.serial_utils.UtilityResult`,
  the `EngineCoreReadyResponse`, `EngineHandshakeMetadata` and `EngineZmqAddresses`
  dataclasses, the coordinator's `EngineState.request_counts`), encoded the way vLLM encodes it
  on that socket:
  * frontend -> engine (S2) and engine -> frontend (S3): `vllm.v1.serial_utils.MsgpackEncoder`
    (`encode_into` for outputs, as the engine output thread does; it equals `encode`);
  * ready response, INIT, READY, coordinator stats and START_DP_WAVE: `msgspec.msgpack.encode`,
    as vLLM calls it there.
* `handshake_hello` is captured from `EngineCoreProc.startup_handshake` running against a ROUTER
  over a real ipc socket (the INIT it receives is `init.json`'s frame and it decodes back to the
  same addresses). READY is a dict literal in vLLM; it is rebuilt with the same keys in order.
* `dead` is `EngineCoreProc.ENGINE_CORE_DEAD`.

File format (`<name>.json`):

* `name`: vector name (= file name); `description`: what it is.
* `kind`: which `WireCodec` decoder applies: `engine_input` (`decode_engine_input`),
  `outputs` (`decode_outputs`), `ready` (`decode_ready`), `handshake_status`
  (`decode_handshake_status`), `init` (`decode_init`), `dp_stats` (`decode_dp_stats`),
  `dead` (`decode_outputs`, which returns `EngineDead`).
* `frames_hex`: the frames in hex as the receiver gets them. Engine inputs start with the
  one-byte type frame (the engine DEALER's view, identity stripped); aux frames follow the
  main frame.
* `main_frame`: index of the msgpack frame shown in `decoded` (1 for engine inputs).
* `decoded`: `msgspec.msgpack.decode` of the main frame as JSON: bytes as
  `{{"$bytes": hex}}`, msgpack ext values as `{{"$ext": code, "hex": ...}}`, map keys as
  strings; `null` for `dead`.

Vectors:

{table}
"""


def write_all(vectors: list[Vector], out: Path) -> None:
    import msgspec
    import numpy
    import torch
    import vllm

    out.mkdir(parents=True, exist_ok=True)
    expected = {f"{v.name}.json" for v in vectors}
    for stale in out.glob("*.json"):
        if stale.name not in expected:
            stale.unlink()
    for v in vectors:
        (out / f"{v.name}.json").write_text(render(v), encoding="utf-8")
    table = "\n".join(f"| `{v.name}` | {v.kind} | {len(v.frames)} | {v.description} |"
                      for v in vectors)
    table = "| vector | kind | frames | description |\n|---|---|---|---|\n" + table
    commit = getattr(importlib.import_module("vllm._version"), "__commit_id__", "?")
    (out / "README.md").write_text(README_TEMPLATE.format(
        vllm_version=vllm.__version__, date=datetime.date.today().isoformat(), commit=commit,
        msgspec_version=msgspec.__version__, numpy_version=numpy.__version__,
        torch_version=torch.__version__.split("+")[0],
        python_version=".".join(map(str, sys.version_info[:3])), table=table,
    ), encoding="utf-8")


def check_all(vectors: list[Vector], out: Path) -> list[str]:
    """Names of vectors whose checked-in file differs from a fresh rendering (or is stale)."""
    bad = [v.name for v in vectors
           if not (out / f"{v.name}.json").is_file()
           or (out / f"{v.name}.json").read_text(encoding="utf-8") != render(v)]
    names = {v.name for v in vectors}
    bad += [p.stem for p in out.glob("*.json") if p.stem not in names]
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true",
                        help="compare with the files in --out instead of writing them")
    args = parser.parse_args(argv)
    _reexec_with_fixed_hash_seed()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    try:
        import vllm
    except ImportError as exc:
        print(f"vLLM is not importable here ({exc}); use the vllm lane venv", file=sys.stderr)
        return 2
    if vllm.__version__ != EXPECTED_VLLM:
        print(f"expected vLLM {EXPECTED_VLLM}, found {vllm.__version__}", file=sys.stderr)
        return 2
    vectors = build_vectors()
    if args.check:
        bad = check_all(vectors, args.out)
        if bad:
            print("out of date: " + ", ".join(bad), file=sys.stderr)
            return 1
        print(f"{len(vectors)} vectors up to date in {args.out}")
        return 0
    write_all(vectors, args.out)
    print(f"wrote {len(vectors)} vectors to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
