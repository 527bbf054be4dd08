"""vLLM on CPU for the component adapters (vllm_nixl.py, vllm_ec.py): the imports and the
tiny llama's configs both build.

Why one module: both adapters run a piece of vLLM 0.33.0 inside this process, on CPU and
loopback only, over the checked-in tiny llama and a one-group full-attention KV cache. vLLM
is imported with importlib so mypy never analyses it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from harness.artefacts.vllm_dist import tiny_model_dir

MAX_MODEL_LEN = 256


def import_vllm(**modules: str) -> SimpleNamespace:
    """torch, `vllm.config` (config) and `vllm.v1.kv_cache_interface` (kv_iface), plus
    `modules` (attribute -> module name), imported for the CPU target and loopback."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["VLLM_HOST_IP"] = "127.0.0.1"  # loopback only, as for everything vLLM
    names = {"torch": "torch", "config": "vllm.config",
             "kv_iface": "vllm.v1.kv_cache_interface", **modules}
    return SimpleNamespace(**{attr: importlib.import_module(module)
                              for attr, module in names.items()})


def tiny_model_config(v: SimpleNamespace) -> Any:
    """vLLM's `ModelConfig` of the tiny llama (float32, no tokenizer)."""
    return v.config.ModelConfig(model=str(tiny_model_dir()), dtype="float32",
                                skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN)


def full_attention_kv_cache(v: SimpleNamespace, model: Any, *, block_size: int,
                            num_blocks: int, layers: Sequence[str]) -> Any:
    """A `KVCacheConfig` of one full-attention group over `layers` (no tensors: what is
    registered, if anything, is the adapter's business)."""
    spec = v.kv_iface.FullAttentionSpec(
        block_size=block_size, num_kv_heads=model.get_total_num_kv_heads(),
        head_size=model.get_head_size(), dtype=v.torch.float32)
    return v.kv_iface.KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[v.kv_iface.KVCacheGroupSpec(list(layers), spec)])


__all__ = ["MAX_MODEL_LEN", "full_attention_kv_cache", "import_vllm", "tiny_model_config"]
