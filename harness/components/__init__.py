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
"""

from __future__ import annotations

import os

from harness.components.ec_contract import SchedulerFactory
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
ENV_EC_SCHEDULER = "COREWIRE_EC_SCHEDULER"
DEFAULT_EC_SCHEDULER = "reference"
EC_CASE_PREFIX = "components.ec_"

__all__ = [
    "DEFAULT_EC_SCHEDULER",
    "DEFAULT_KV_WORKER",
    "ENV_EC_SCHEDULER",
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
    "component_label",
    "ec_scheduler_factory",
    "ec_scheduler_name",
    "kv_worker_name",
    "kv_worker_factory",
    "preload_ec_scheduler",
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


def component_label(case_id: str) -> str:
    """The unit a component case runs against, as the `[...]` part of its test id."""
    if case_id.startswith(EC_CASE_PREFIX):
        return f"ec:{ec_scheduler_name()}"
    return f"kv:{kv_worker_name()}"


def ec_scheduler_name() -> str:
    return os.environ.get(ENV_EC_SCHEDULER, "").strip() or DEFAULT_EC_SCHEDULER


def ec_scheduler_factory(name: str | None = None) -> SchedulerFactory:
    """The factory for `name` (default: `$COREWIRE_EC_SCHEDULER`, else the reference)."""
    name = name or ec_scheduler_name()
    if name == "reference":
        from harness.components.ec_reference import reference_ec_factory

        return reference_ec_factory
    if name == "vllm":
        from harness.components.vllm_ec import vllm_ec_factory

        return vllm_ec_factory
    if name.startswith("mutant:"):
        from harness.components.ec_mutants import ec_mutant_factory

        return ec_mutant_factory(name.split(":", 1)[1])
    raise ValueError(f"unknown EC scheduler {name!r} (${ENV_EC_SCHEDULER}): use reference, "
                     "vllm or mutant:NAME")


def preload_ec_scheduler(name: str | None = None) -> None:
    """Pay vLLM's import and first Scheduler build up front (at collection)."""
    if (name or ec_scheduler_name()) == "vllm":
        from harness.components.vllm_ec import preload

        preload()
