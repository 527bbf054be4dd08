"""vLLM 0.33.0's own `Scheduler` as an `ECScheduler`, on CPU, with the EC connector faked.

Why this works without a multimodal model, weights or a GPU:

* the Scheduler is built as `EngineCore` builds it (scheduler.py:87) from a `VllmConfig` for
  the checked-in tiny llama (prefix caching on, chunked prefill, the shape's budgets), a
  one-group full-attention `KVCacheConfig`, a `StructuredOutputManager`, and the prefix-cache
  block hasher `EngineCore` installs on every request (core.py:219-230);
* the tiny llama has no encoder, so the Scheduler sizes its encoder cache at 0; the adapter
  replaces `encoder_cache_manager` with a real `EncoderCacheManager` of the shape's size and
  sets `max_num_encoder_input_tokens`, which is what a multimodal model's `MultiModalBudget`
  would have produced;
* `ec_connector` is set to the harness's `FakeECConnector` after construction (the seam
  vLLM's own `test_ec_connector_ensure_cache_available_defers_request` uses when it mocks
  `scheduler.ec_connector.ensure_cache_available`);
* requests carry `MultiModalFeatureSpec`s without data (`data=None` is what the engine sees
  for items cached by the frontend), so the Scheduler's real encoder-input scheduling,
  KV allocation and prefix caching run on them.

vLLM is imported through vllm_cpu.py (importlib: mypy never analyses it).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from harness.components.ec_contract import (
    ECRequest,
    ECScheduler,
    FakeECConnector,
    ScheduledStep,
    SchedulerShape,
)
from harness.components.vllm_cpu import (
    MAX_MODEL_LEN,
    full_attention_kv_cache,
    import_vllm,
    tiny_model_config,
)


@functools.cache
def _vllm() -> SimpleNamespace:
    return import_vllm(
        scheduler="vllm.v1.core.sched.scheduler", structured="vllm.v1.structured_output",
        encoder_cache="vllm.v1.core.encoder_cache_manager",
        kv_utils="vllm.v1.core.kv_cache_utils", hashing="vllm.utils.hashing",
        request="vllm.v1.request", sampling="vllm.sampling_params",
        mm_inputs="vllm.multimodal.inputs")


def preload() -> None:
    """Import vLLM and build a scheduler once (tens of seconds), at collection."""
    VllmECScheduler(FakeECConnector(), SchedulerShape()).shutdown()


@functools.cache
def _configs(shape: SchedulerShape) -> tuple[Any, Any, Any]:
    """(VllmConfig, KVCacheConfig, block hasher) for the tiny llama on CPU."""
    v = _vllm()
    model = tiny_model_config(v)
    cache = v.config.CacheConfig(block_size=shape.block_size, enable_prefix_caching=True)
    cache.num_gpu_blocks = shape.num_blocks
    sched = v.config.SchedulerConfig(
        max_num_batched_tokens=shape.token_budget, max_num_seqs=shape.max_num_seqs,
        max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True, is_encoder_decoder=False)
    vllm_config = v.config.VllmConfig(model_config=model, cache_config=cache,
                                      scheduler_config=sched)
    kv_cache_config = full_attention_kv_cache(v, model, block_size=shape.block_size,
                                              num_blocks=shape.num_blocks,
                                              layers=["model.layers.0.self_attn.attn"])
    hash_fn = v.hashing.get_hash_fn_by_name(cache.prefix_caching_hash_algo)
    v.kv_utils.init_none_hash(hash_fn)
    hasher = v.kv_utils.get_request_block_hasher(shape.block_size, hash_fn)
    return vllm_config, kv_cache_config, hasher


class VllmECScheduler:
    """Adapts `vllm.v1.core.sched.scheduler.Scheduler` (vLLM 0.33.0) to `ECScheduler`."""

    def __init__(self, connector: FakeECConnector, shape: SchedulerShape) -> None:
        v = _vllm()
        vllm_config, kv_cache_config, self._hasher = _configs(shape)
        s = v.scheduler.Scheduler(
            vllm_config=vllm_config, kv_cache_config=kv_cache_config,
            structured_output_manager=v.structured.StructuredOutputManager(vllm_config),
            block_size=shape.block_size, hash_block_size=shape.block_size)
        s.encoder_cache_manager = v.encoder_cache.EncoderCacheManager(
            cache_size=shape.encoder_cache_size)
        s.max_num_encoder_input_tokens = shape.encoder_cache_size
        s.ec_connector = connector
        self._s = s
        self._v = v

    def add_request(self, request: ECRequest) -> None:
        v = self._v
        features = [v.mm_inputs.MultiModalFeatureSpec(
            data=None, modality="image", identifier=f.identifier,
            mm_position=v.mm_inputs.PlaceholderRange(offset=f.mm_position.offset,
                                                     length=f.mm_position.length))
            for f in request.mm_features]
        self._s.add_request(v.request.Request(
            request.request_id, list(request.prompt_token_ids),
            v.sampling.SamplingParams(max_tokens=request.max_tokens), None,
            mm_features=features or None, block_hasher=self._hasher))

    def schedule(self) -> ScheduledStep:
        out = self._s.schedule()
        return ScheduledStep(
            dict(out.num_scheduled_tokens), tuple(r.req_id for r in out.scheduled_new_reqs),
            {r: tuple(ids) for r, ids in out.scheduled_encoder_inputs.items()})

    def num_kv_blocks(self, req_id: str) -> int:
        managers = self._s.kv_cache_manager.coordinator.single_type_managers
        return sum(len(m.req_to_blocks.get(req_id, ())) for m in managers)

    def encoder_entries(self, req_id: str) -> frozenset[int]:
        return frozenset(self._s.encoder_cache_manager.request_cached_ids.get(req_id, ()))

    def num_computed_tokens(self, req_id: str) -> int:
        request = self._s.requests.get(req_id)
        return int(request.num_computed_tokens) if request is not None else 0

    def shutdown(self) -> None:
        self._s.shutdown()


def vllm_ec_factory(connector: FakeECConnector, shape: SchedulerShape) -> ECScheduler:
    return VllmECScheduler(connector, shape)
