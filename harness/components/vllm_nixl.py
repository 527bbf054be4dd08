"""vLLM 0.33.0's own NIXL worker as a `KVConnectorWorker`, on CPU, with NIXL faked.

Why this works without NIXL or a GPU (the same seams vLLM's unit tests use):

* `base_worker.NixlWrapper` (None when NIXL is absent) is patched, for construction only, to a
  shim that forwards the NIXL-agent calls to `FakeTransport`;
* the TP rank/size getters are patched to 0/1 instead of initialising torch.distributed, and
  the CPU affinity that the constructor narrows (one core per NUMA node) is restored;
* `register_kv_caches` runs for real on two small CPU tensors (CPU attention backend, layout
  LBHNC, block size 32: the backend's kernel block size);
* `_nixl_handshake` is overridden to skip ZMQ: the remote is a mirror of this worker whose agent
  metadata comes from the transport, and vLLM's own `add_remote_agent` then calls the
  transport's `add_remote_agent` -- on vLLM's background handshake thread, where the
  handshake fault fires;
* post-processing is observed at `sync_recved_kv_to_device`, which vLLM calls for every
  successful receive when `use_host_buffer` is set (set after registration); the override
  reports to the hooks instead of copying.

A request with `reads=n` is passed to vLLM's `start_load_kv` in n consecutive calls, which
posts one more transfer handle per call (as vLLM's `test_multi_xfer_one_engine` does).
vLLM is imported through vllm_cpu.py (importlib: mypy never analyses it).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

from harness.components.kv_contract import KVConnectorWorker, LoadMetadata, RecvHooks
from harness.components.kv_transport import FakeTransport
from harness.components.vllm_cpu import full_attention_kv_cache, import_vllm, tiny_model_config

ENGINE_ID = "corewire-decode"
BLOCK_SIZE = 32  # the CPU attention backend's kernel block size is a multiple of 32
NUM_BLOCKS = 512  # block ids the cases use must stay below this
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"


@functools.cache
def _vllm() -> SimpleNamespace:
    return import_vllm(msgspec="msgspec", base_worker=f"{NIXL}.base_worker",
                       pull_worker=f"{NIXL}.pull_worker", metadata=f"{NIXL}.metadata")


def preload() -> None:
    """Import vLLM now (it takes tens of seconds) and build the configs once."""
    _configs()
    _worker_class()


@functools.cache
def _configs() -> tuple[Any, Any]:
    """(VllmConfig, KVCacheConfig) for the checked-in tiny llama, on CPU."""
    v = _vllm()
    model = tiny_model_config(v)
    cache = v.config.CacheConfig(block_size=BLOCK_SIZE)
    cache.kv_cache_layout = "LBHNC"  # what the engine core would resolve for CPU_ATTN
    kv = v.config.KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both",
                                   kv_buffer_device="cpu")
    vllm_config = v.config.VllmConfig(model_config=model, cache_config=cache,
                                      kv_transfer_config=kv)
    kv_cache_config = full_attention_kv_cache(v, model, block_size=BLOCK_SIZE,
                                              num_blocks=NUM_BLOCKS, layers=LAYERS)
    return vllm_config, kv_cache_config


class _NixlShim:
    """The `nixl_agent` surface vLLM calls: transfers go to the transport, registration is
    bookkeeping only."""

    def __init__(self, transport: FakeTransport) -> None:
        self._t = transport
        self._ids = iter(range(1 << 40, 1 << 41))

    def __getattr__(self, name: str) -> Any:  # the transfer surface
        return getattr(self._t, name)

    def get_reg_descs(self, data: Any, mem_type: str) -> list[int]:
        return [next(self._ids) for _ in data]

    def get_xfer_descs(self, data: Any, mem_type: str) -> list[int]:
        return [next(self._ids) for _ in data]

    def register_memory(self, descs: Any, backends: Any = None) -> None:
        return None

    def deregister_memory(self, descs: Any) -> None:
        return None

    def prep_xfer_dlist(self, agent_name: str, descs: Any, *_: Any, **__: Any) -> int:
        return next(self._ids)

    def release_dlist_handle(self, handle: int) -> None:
        return None

    def get_agent_metadata(self) -> bytes:
        return b"agent:" + ENGINE_ID.encode()

    def check_remote_metadata(self, agent_name: str, *_: Any) -> bool:
        return True

    def create_backend(self, *_: Any, **__: Any) -> None:
        return None


@functools.cache
def _worker_class() -> Any:
    v = _vllm()
    agent_meta_cls = v.metadata.NixlAgentMetadata
    base: Any = v.pull_worker.NixlPullConnectorWorker

    class CorewireNixlWorker(base):  # type: ignore[misc]
        corewire_transport: FakeTransport
        corewire_hooks: RecvHooks

        def _nixl_handshake(self, host: str, port: int, remote_tp_size: int,
                            expected_engine_id: str, remote_dcp_size: int = 1,
                            remote_pp_size: int = 1, notif_agents_only: bool = False
                            ) -> tuple[dict[tuple[int, int], str], float]:
            raw = self.corewire_transport.fetch_remote_metadata(expected_engine_id)
            own = v.msgspec.msgpack.decode(self.xfer_handshake_metadata.agent_metadata_bytes,
                                           type=agent_meta_cls)
            own.engine_id = expected_engine_id
            own.agent_metadata = raw
            name = self.add_remote_agent(own, 0, remote_tp_size, remote_dcp_size)
            return {(0, 0): name}, 0.0

        def sync_recved_kv_to_device(self, req_id: str, meta: Any) -> None:
            self.corewire_hooks.post_process(req_id)

    return CorewireNixlWorker


@contextlib.contextmanager
def _construction_patches(transport: FakeTransport) -> Iterator[None]:
    v = _vllm()
    bw = v.base_worker
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        with v.config.set_current_vllm_config(_configs()[0]), \
                mock.patch.object(bw, "NixlWrapper", lambda *_a, **_k: _NixlShim(transport)), \
                mock.patch.object(bw, "get_tensor_model_parallel_rank", lambda: 0), \
                mock.patch.object(bw, "get_tensor_model_parallel_world_size", lambda: 1):
            yield
    finally:
        if affinity is not None:
            os.sched_setaffinity(0, affinity)


class VllmNixlWorker:
    """Adapts `NixlPullConnectorWorker` (vLLM 0.33.0) to `KVConnectorWorker`."""

    def __init__(self, transport: FakeTransport, hooks: RecvHooks) -> None:
        v = _vllm()
        vllm_config, kv_cache_config = _configs()
        with _construction_patches(transport):
            worker = _worker_class()(vllm_config, ENGINE_ID, kv_cache_config)
            worker.corewire_transport = transport
            worker.corewire_hooks = hooks
            shape = (NUM_BLOCKS, kv_cache_config.kv_cache_groups[0].kv_cache_spec.num_kv_heads,
                     BLOCK_SIZE, 2 * vllm_config.model_config.get_head_size())
            worker.register_kv_caches(
                {name: v.torch.zeros(*shape, dtype=v.torch.float32) for name in LAYERS})
        worker.use_host_buffer = True  # route successful receives through the sync hook
        self._worker = worker
        self._metadata_cls = v.metadata.NixlConnectorMetadata

    def start_load_kv(self, metadata: LoadMetadata) -> None:
        rounds = max((s.reads for s in metadata.reqs_to_recv), default=1)
        for i in range(rounds):
            meta = self._metadata_cls()
            for s in metadata.reqs_to_recv:
                if s.reads > i:
                    meta.add_new_req_to_recv(
                        request_id=s.req_id, local_block_ids=(list(s.local_block_ids),),
                        kv_transfer_params={
                            "remote_block_ids": (list(s.remote_block_ids),),
                            "remote_engine_id": s.remote_engine_id,
                            "remote_request_id": s.req_id,
                            "remote_host": "127.0.0.1", "remote_port": 1, "tp_size": 1},
                        awaiting_kvs=True)
            self._worker.start_load_kv(meta)

    def get_finished(self) -> tuple[set[str], set[str]]:
        sending, recving = self._worker.get_finished()
        return set(sending), set(recving)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set(self._worker.get_block_ids_with_load_errors())

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self._worker.shutdown()


def vllm_nixl_factory(transport: FakeTransport, hooks: RecvHooks) -> KVConnectorWorker:
    return VllmNixlWorker(transport, hooks)
