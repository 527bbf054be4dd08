"""Message types of the vLLM 0.33.0 engine-core protocol, as msgspec structs.

Written from the protocol facts (field names, order, defaults and struct options), not from
vLLM's code. Layout rules that decide the bytes:

* `array_like=True` structs encode as arrays of *all* fields in order (msgspec ignores
  `omit_defaults` for arrays); decoding accepts shorter arrays (trailing defaults) and longer
  ones (extra trailing elements ignored).
* `SamplingParams` is a map with defaults omitted (msgspec then always uses a map16 header).
* vLLM dataclasses (ready response, INIT, RequestError, stats) encode as maps of all fields.
* Types we only need to carry (scheduler stats, multimodal specs, KV hints) are kept as
  plain maps: they round-trip byte-for-byte because msgpack maps keep their key order.

The drift test (tests/vllm_lane/test_drift.py) compares these layouts with vLLM's classes.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

# --------------------------------------------------------------------------- arrays


class WireArray:
    """An ndarray or tensor on the wire: `[dtype, shape, data]`.

    `data` travels inline as msgpack ext type 3 when small, else as an aux frame referenced
    by index. The codec resolves both forms into `data` bytes; no numpy or torch needed.
    """

    __slots__ = ("data", "dtype", "shape")

    def __init__(self, dtype: str, shape: tuple[int, ...], data: bytes) -> None:
        self.dtype = dtype
        self.shape = shape
        self.data = data

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, WireArray)
            and (self.dtype, self.shape, self.data) == (other.dtype, other.shape, other.data)
        )

    def __hash__(self) -> int:
        return hash((self.dtype, self.shape, self.data))

    def __repr__(self) -> str:
        return f"WireArray({self.dtype!r}, {self.shape!r}, <{len(self.data)} bytes>)"


# --------------------------------------------------------------------------- enums


class FinishReason(enum.IntEnum):
    """Why a request finished; the integer is what crosses the wire."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4

    def __str__(self) -> str:
        return self.name.lower()


class RequestType(bytes, enum.Enum):
    """The one-byte type frame in front of every frontend -> engine message."""

    ADD = b"\x00"
    ABORT = b"\x01"
    START_DP_WAVE = b"\x02"
    UTILITY = b"\x03"


class EngineCoreEventType(enum.IntEnum):
    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


class RequestOutputKind(enum.IntEnum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


# --------------------------------------------------------------------------- requests


class SamplingParams(msgspec.Struct, omit_defaults=True):
    """Sampling parameters: a map, defaults omitted, underscore fields kept."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    watermarking: bool | None = None
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    prompt_logprob_token_ids: WireArray | None = None
    prompt_logprob_start: int | None = None
    logprob_token_ids: list[int] | None = None
    flat_logprobs: bool = False
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    stream_interval: int | None = None
    skip_clone: bool = False
    output_text_buffer_length: int = 0
    _eos_token_id: int | None = None
    _all_stop_token_ids: set[int] = msgspec.field(default_factory=set)
    _watermarking_skipped: bool = False
    structured_outputs: dict[str, Any] | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    extra_args: dict[str, Any] | None = None
    bad_words: list[str] | None = None
    _bad_words_token_ids: list[list[int]] | None = None
    skip_reading_prefix_cache: bool | None = None
    thinking_token_budget: int | None = None
    repetition_detection: dict[str, Any] | None = None
    routed_experts_prompt_start: int = 0
    trace_decode_token_ids: list[int] | None = None


class PoolingParams(msgspec.Struct, array_like=True, omit_defaults=True):
    use_activation: bool | None = None
    dimensions: int | None = None
    step_tag_id: int | None = None
    returned_token_ids: list[int] | None = None
    task: str | None = None
    requires_token_ids: bool = False
    skip_reading_prefix_cache: bool | None = None
    late_interaction_params: list[Any] | None = None
    extra_kwargs: dict[str, Any] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY
    late_chunking_params: list[Any] | None = None


class LoRARequest(msgspec.Struct, array_like=True, omit_defaults=True):
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None
    load_inplace: bool = False
    is_3d_lora_weight: bool = False


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """ADD payload: a 22-element array."""

    request_id: str
    prompt_token_ids: list[int] | None
    mm_features: list[dict[str, Any]] | None
    sampling_params: SamplingParams | None
    pooling_params: PoolingParams | None
    arrival_time: float
    lora_request: LoRARequest | None
    cache_salt: str | None
    data_parallel_rank: int | None
    prompt_embeds: WireArray | None = None
    prompt_is_token_ids: list[bool] | None = None
    client_index: int = 0
    current_wave: int = 0
    priority: int = 0
    trace_headers: dict[str, str] | None = None
    resumable: bool = False
    external_req_id: str | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    abort_immediately: bool = False
    session_id: str | None = None
    kv_hints: dict[str, Any] | None = None


class UtilityRequest(msgspec.Struct, array_like=True):
    """UTILITY payload: `[client_index, call_id, method, args]`."""

    client_index: int
    call_id: int
    method: str
    args: list[Any]


class StartDPWave(msgspec.Struct, array_like=True):
    """START_DP_WAVE payload (coordinator -> engines): `[wave, exclude_engine_index]`."""

    wave: int
    exclude_engine_index: int | None


# --------------------------------------------------------------------------- outputs


class RequestError(msgspec.Struct):
    code: str
    message: str
    retryable: bool = False


class EngineCoreEvent(msgspec.Struct):
    type: EngineCoreEventType
    timestamp: float


class LogprobsLists(msgspec.Struct, array_like=True):
    logprob_token_ids: WireArray
    logprobs: WireArray
    sampled_token_ranks: WireArray
    cu_num_generated_tokens: list[int] | None = None


class LogprobsTensors(msgspec.Struct, array_like=True):
    logprob_token_ids: WireArray
    logprobs: WireArray
    selected_token_ranks: WireArray
    cu_num_generated_tokens: list[int] | None = None
    cu_num_generated_tokens_tensor: WireArray | None = None


class SamplingMaskLists(msgspec.Struct, array_like=True):
    token_ids: WireArray
    offsets: WireArray | None = None
    cu_num_generated_tokens: list[int] | None = None


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One request's delta in one step: a 19-element array."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: LogprobsLists | None = None
    new_prompt_logprobs_tensors: LogprobsTensors | None = None
    pooling_output: WireArray | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    events: list[EngineCoreEvent] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    trace_headers: dict[str, str] | None = None
    prefill_stats: dict[str, Any] | None = None
    routed_experts: WireArray | None = None
    num_nans_in_logits: int = 0
    mm_cache_miss_hashes: list[str] | None = None
    new_sampling_mask: SamplingMaskLists | None = None
    spec_decode_metrics: dict[str, Any] | None = None
    prompt_token_id_logprobs: WireArray | None = None
    error: RequestError | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class UtilityResult(msgspec.Struct, array_like=True):
    """The `[type_info, value]` wrapper around a utility's return value.

    `type_info` is nil unless the engine runs with insecure serialization; a peer that
    sends anything else would need unpickling-grade trust, which we never extend.
    """

    type_info: Any
    value: Any


class UtilityOutput(msgspec.Struct, array_like=True, gc=False):
    call_id: int
    failure_message: str | None = None
    result: UtilityResult | None = None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One engine -> frontend message: a 9-element array."""

    engine_index: int = 0
    outputs: list[EngineCoreOutput] = msgspec.field(default_factory=list)
    scheduler_stats: dict[str, Any] | None = None
    timestamp: float = 0.0
    utility_output: UtilityOutput | None = None
    finished_requests: list[str] | None = None
    wave_complete: int | None = None
    start_wave: int | None = None
    weight_version: str | None = None


# --------------------------------------------------------------------------- startup


class EngineCoreReadyResponse(msgspec.Struct):
    """The registration map an engine sends first on each input DEALER."""

    max_model_len: int
    num_gpu_blocks: int
    block_size: int
    dp_stats_address: str | None
    dtype: str
    vllm_version: str
    world_size: int
    data_parallel_size: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    decode_context_parallel_size: int
    data_parallel_rank: int
    max_num_seqs: int
    max_num_batched_tokens: int
    instance_id: str
    supports_lora: bool
    max_loras: int
    mamba_block_size: int | None = None
    kv_cache_size_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None
    kv_events_config: dict[str, Any] | None = None
    weight_transfer_backend: str | None = None
    enable_sleep_mode: bool = False
    supports_draft_weight_updates: bool = False
    effective_attention_block_size: int | None = None
    coord_store_port: int = 0
    coordinator_input_address: str | None = None
    coordinator_output_address: str | None = None


class HandshakeHello(msgspec.Struct):
    """Engine -> launcher on the handshake socket (also used for READY's common keys)."""

    status: str
    local: bool
    headless: bool


class HandshakeReady(msgspec.Struct):
    status: str
    local: bool
    headless: bool
    parallel_config_hash: str | None = None
    coord_store_port: int | None = None
    elastic_ep_max_dp_size: int | None = None
    num_redundant_experts: int | None = None


class EngineZmqAddresses(msgspec.Struct):
    inputs: list[str]
    outputs: list[str]
    coordinator_input: str | None = None
    coordinator_output: str | None = None
    frontend_stats_publish_address: str | None = None


class EngineHandshakeMetadata(msgspec.Struct):
    """INIT: launcher -> engine, the addresses to connect to.

    Both fields are required, as in vLLM: an INIT without `parallel_config` fails a real
    engine's decode, so it must fail ours too (launchers send `{}` when there is nothing).
    """

    addresses: EngineZmqAddresses
    parallel_config: dict[str, Any]


class DPStatsUpdate(msgspec.Struct, array_like=True):
    """Coordinator -> frontends: `[counts, current_wave, engines_running]`.

    `counts` holds one `[waiting, running, kv_cache_usage]` triple per engine in rank order,
    or nil for a wave-state-only update.
    """

    counts: list[tuple[int, int, float]] | None
    current_wave: int
    engines_running: bool
