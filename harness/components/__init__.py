"""Component suites: a connector role plugged into harness-owned fakes (semantics.md, "Harness
design: a pluggable component suite").

The worker under test is chosen by `$COREWIRE_KV_WORKER`:

* `reference` (default): `ReferenceKVWorker`, the harness's own implementation;
* `vllm-nixl`: vLLM 0.33.0's `NixlPullConnectorWorker` on CPU with NIXL replaced by the fake
  transport (needs the vllm lane; the ~20-40 s vLLM import is paid at collection);
* `mutant:NAME`: a deliberately broken worker from `harness.components.kv_mutants`.
"""

from __future__ import annotations

import os

from harness.components.kv_worker import (
    FakeTransport,
    HookRecorder,
    KVConnectorWorker,
    KVWorkerRig,
    LoadMetadata,
    Outcome,
    PassRecord,
    RecvHooks,
    RecvSpec,
    ReferenceKVWorker,
    TransportFault,
    WorkerFactory,
    reference_factory,
)

ENV_KV_WORKER = "COREWIRE_KV_WORKER"
DEFAULT_KV_WORKER = "reference"

__all__ = [
    "DEFAULT_KV_WORKER",
    "ENV_KV_WORKER",
    "FakeTransport",
    "HookRecorder",
    "KVConnectorWorker",
    "KVWorkerRig",
    "LoadMetadata",
    "Outcome",
    "PassRecord",
    "RecvHooks",
    "RecvSpec",
    "ReferenceKVWorker",
    "TransportFault",
    "WorkerFactory",
    "kv_worker_name",
    "kv_worker_factory",
    "preload_kv_worker",
    "reference_factory",
]


def kv_worker_name() -> str:
    return os.environ.get(ENV_KV_WORKER, "").strip() or DEFAULT_KV_WORKER


def kv_worker_factory(name: str | None = None) -> WorkerFactory:
    """The factory for `name` (default: `$COREWIRE_KV_WORKER`, else the reference)."""
    name = name or kv_worker_name()
    if name == "reference":
        return reference_factory
    if name == "vllm-nixl":
        from harness.components.vllm_nixl import vllm_nixl_factory

        return vllm_nixl_factory
    if name.startswith("mutant:"):
        from harness.components.kv_mutants import mutant_factory

        return mutant_factory(name.split(":", 1)[1])
    raise ValueError(f"unknown KV worker {name!r} (${ENV_KV_WORKER}): use reference, "
                     "vllm-nixl or mutant:NAME")


def preload_kv_worker(name: str | None = None) -> None:
    """Pay slow imports up front (at collection), so no case spends its time bound on them."""
    if (name or kv_worker_name()) == "vllm-nixl":
        from harness.components.vllm_nixl import preload

        preload()
