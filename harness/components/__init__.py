"""Component suites: a connector role plugged into harness-owned fakes (semantics.md, "Harness
design: a pluggable component suite").

The KV worker under test (`components.kv_failure.*`) is chosen by `$COREWIRE_KV_WORKER`:

* `reference` (default): `ReferenceKVWorker`, the harness's own implementation;
* `vllm-nixl`: vLLM 0.33.0's `NixlPullConnectorWorker` on CPU with NIXL replaced by the fake
  transport (needs the vllm lane; the ~20-40 s vLLM import is paid at collection);
* `mutant:NAME`: a deliberately broken worker from `harness.components.kv_mutants`.

The scheduler under test for EC deferral (`components.ec_deferral.*`, PR #41627) is chosen by
`$COREWIRE_EC_SCHEDULER`:

* `reference` (default): `ReferenceECScheduler`, the harness's own scheduler model;
* `vllm`: vLLM 0.33.0's `Scheduler` on CPU with a fake EC connector (needs the vllm lane);
* `mutant:NAME`: a deliberately broken scheduler from `harness.components.ec_mutants`.

How a unit is chosen is one class (`units.ComponentSlot`); `KV_WORKERS` and `EC_SCHEDULERS`
are its two instances.
"""

from __future__ import annotations

from typing import Any

from harness.components.ec_contract import SchedulerFactory
from harness.components.kv_contract import (
    HookRecorder,
    KVConnectorWorker,
    KVWorkerRig,
    LoadMetadata,
    PassRecord,
    RecvHooks,
    RecvSpec,
    WorkerFactory,
)
from harness.components.kv_reference import ReferenceKVWorker, reference_factory
from harness.components.kv_transport import FakeTransport, Outcome, TransportFault
from harness.components.units import ComponentSlot

ENV_KV_WORKER = "COREWIRE_KV_WORKER"
ENV_EC_SCHEDULER = "COREWIRE_EC_SCHEDULER"
EC_CASE_PREFIX = "components.ec_"


_HERE = "harness.components"
KV_WORKERS: ComponentSlot[WorkerFactory] = ComponentSlot(
    "kv", "KV worker", ENV_KV_WORKER,
    units={"reference": f"{_HERE}.kv_reference:reference_factory",
           "vllm-nixl": f"{_HERE}.vllm_nixl:vllm_nixl_factory"},
    mutants=f"{_HERE}.kv_mutants:MUTANTS",
    preloads={"vllm-nixl": f"{_HERE}.vllm_nixl:preload"})
EC_SCHEDULERS: ComponentSlot[SchedulerFactory] = ComponentSlot(
    "ec", "EC scheduler", ENV_EC_SCHEDULER,
    units={"reference": f"{_HERE}.ec_reference:reference_ec_factory",
           "vllm": f"{_HERE}.vllm_ec:vllm_ec_factory"},
    mutants=f"{_HERE}.ec_mutants:MUTANTS",
    preloads={"vllm": f"{_HERE}.vllm_ec:preload"})  # vLLM's import, a first Scheduler


def component_slot(kind: str) -> ComponentSlot[Any]:
    """The slot of a `kv:` / `ec:` spec's kind ("kv" or "ec")."""
    slots: dict[str, ComponentSlot[Any]] = {"kv": KV_WORKERS, "ec": EC_SCHEDULERS}
    return slots[kind]


def component_kind(case_id: str) -> str:
    """The component kind ("kv", "ec") a component case tests."""
    return "ec" if case_id.startswith(EC_CASE_PREFIX) else "kv"


kv_worker_factory = KV_WORKERS.factory
preload_kv_worker = KV_WORKERS.preload
ec_scheduler_factory = EC_SCHEDULERS.factory
preload_ec_scheduler = EC_SCHEDULERS.preload

__all__ = [
    "EC_SCHEDULERS",
    "ENV_EC_SCHEDULER",
    "ENV_KV_WORKER",
    "KV_WORKERS",
    "ComponentSlot",
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
    "component_kind",
    "component_slot",
    "ec_scheduler_factory",
    "kv_worker_factory",
    "preload_ec_scheduler",
    "preload_kv_worker",
    "reference_factory",
]
