"""The KV-connector worker role as a pluggable component (seed PR #40364): the interface
a worker under test is plugged in through, and the rig that drives it.

Why a component suite: the NIXL failure contract lives between the connector worker and the
scheduler inside the engine (`finished_recving`, `invalid_block_ids`), so the frontend wire
never shows it. Here a worker is plugged in through `KVConnectorWorker`, NIXL is replaced by
`FakeTransport` (kv_transport.py), and `KVWorkerRig` drives model-runner passes and records
what the worker reported in each. The contract (semantics.md (d)), which
`ReferenceKVWorker` (kv_reference.py) implements:

* a failed receive (handshake, transfer setup, transfer state "ERR", transfer exception) is
  reported in `finished_recving` exactly once, and only once none of its transfer handles is
  outstanding (a handle whose release fails is kept and released again later);
* its KV post-processing (host->device sync, layout conversion) is skipped;
* its local block ids are returned by `get_block_ids_with_load_errors()` no later than the
  pass whose `get_finished()` reports it;
* handshake failures are raised on a background thread and handed to the main thread through
  a `queue.Queue`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from harness.components.kv_transport import FakeTransport

# ---------------------------------------------------------------------------------------------
# The interface a worker under test is plugged in through.


@dataclass(frozen=True)
class RecvSpec:
    """One request whose KV is to be pulled from a remote (prefill) engine.

    `reads` is the number of transfers (handles) the request needs, e.g. one per remote rank
    under heterogeneous TP; the request is complete only when all of them are.
    """

    req_id: str
    local_block_ids: tuple[int, ...]
    remote_block_ids: tuple[int, ...]
    remote_engine_id: str
    reads: int = 1

    def __post_init__(self) -> None:
        if self.reads < 1:
            raise ValueError("a receive needs at least one read")


@dataclass(frozen=True)
class LoadMetadata:
    """What the scheduler hands the worker for one pass (only the receive side matters)."""

    reqs_to_recv: tuple[RecvSpec, ...] = ()


class RecvHooks(Protocol):
    """Called by the worker whenever it post-processes (syncs / converts) a received request's
    KV; the harness observes it to check that failed requests are skipped."""

    def post_process(self, req_id: str) -> None: ...


@runtime_checkable
class KVConnectorWorker(Protocol):
    """The worker-role surface the model runner uses, once per pass and in this order."""

    def start_load_kv(self, metadata: LoadMetadata) -> None:
        """Start (non-blocking) the reads of new requests; never waits on a handshake."""

    def get_finished(self) -> tuple[set[str], set[str]]:
        """(finished_sending, finished_recving) since the last call; failures included."""

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Block ids whose load failed since the last call (drained)."""

    def shutdown(self) -> None:
        """Stop background threads and release what is still held (never raises)."""


class WorkerFactory(Protocol):
    """Builds the worker under test on a fake transport, reporting to `hooks`."""

    def __call__(self, transport: FakeTransport, hooks: RecvHooks) -> KVConnectorWorker: ...


# ---------------------------------------------------------------------------------------------
# The rig: drives passes like the model runner and records them.


class HookRecorder:
    """Thread-safe `RecvHooks` that attributes each call to the current pass."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pass = -1
        self._calls: list[tuple[int, str]] = []

    def post_process(self, req_id: str) -> None:
        with self._lock:
            self._calls.append((self._pass, req_id))

    def begin_pass(self, index: int) -> None:
        with self._lock:
            self._pass = index

    def calls(self) -> list[tuple[int, str]]:
        with self._lock:
            return list(self._calls)


@dataclass(frozen=True)
class PassRecord:
    """One model-runner pass: start_load_kv, get_finished, get_block_ids_with_load_errors."""

    index: int
    loaded: tuple[str, ...]
    finished_recving: frozenset[str]
    invalid_block_ids: frozenset[int]
    outstanding: Mapping[str, int]  # per reported request: transport handles not released


class KVWorkerRig:
    """A worker under test, its transport and hooks, and the log of passes."""

    def __init__(self, factory: WorkerFactory, transport: FakeTransport | None = None) -> None:
        self.transport = transport if transport is not None else FakeTransport()
        self.hooks = HookRecorder()
        self.worker = factory(self.transport, self.hooks)
        self.passes: list[PassRecord] = []
        self._pending: list[RecvSpec] = []

    def __enter__(self) -> KVWorkerRig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def load(self, *specs: RecvSpec) -> None:
        """Hand these requests to the worker in the next pass."""
        self._pending.extend(specs)

    def step(self) -> PassRecord:
        index = len(self.passes)
        specs, self._pending = tuple(self._pending), []
        self.hooks.begin_pass(index)
        self.worker.start_load_kv(LoadMetadata(specs))
        _sending, recving = self.worker.get_finished()
        invalid = self.worker.get_block_ids_with_load_errors()
        record = PassRecord(index, tuple(s.req_id for s in specs), frozenset(recving or ()),
                            frozenset(invalid or ()),
                            {r: len(self.transport.outstanding(r)) for r in recving or ()})
        self.passes.append(record)
        return record

    def step_until_sync(self, predicate: Callable[[], bool], timeout: float,
                        interval: float = 0.001) -> bool:
        """Pass after pass until `predicate` holds, for at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while (held := self._step_and_check(predicate, deadline)) is None:
            time.sleep(interval)
        return held

    async def step_until(self, predicate: Callable[[], bool], timeout: float,
                         interval: float = 0.001) -> bool:
        """As `step_until_sync`, yielding to the event loop between passes."""
        deadline = time.monotonic() + timeout
        while (held := self._step_and_check(predicate, deadline)) is None:
            await asyncio.sleep(interval)
        return held

    def _step_and_check(self, predicate: Callable[[], bool], deadline: float) -> bool | None:
        """One pass, then: True once `predicate` holds, False past `deadline`, None to go on
        (the caller sleeps its own way between passes)."""
        self.step()
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        return None

    def all_reported(self, req_ids: Iterable[str], since: int = 0) -> Callable[[], bool]:
        wanted = set(req_ids)
        return lambda: wanted <= self.reported_ids(since)

    def reported_ids(self, since: int = 0) -> set[str]:
        return {r for p in self.passes[since:] for r in p.finished_recving}

    def reported(self, req_id: str, since: int = 0) -> list[int]:
        """Indices of the passes that reported `req_id` in finished_recving."""
        return [p.index for p in self.passes[since:] if req_id in p.finished_recving]

    def post_processed(self, req_id: str) -> list[int]:
        return [index for index, r in self.hooks.calls() if r == req_id]

    def invalid_through(self, index: int, since: int = 0) -> set[int]:
        """Every block id reported as a load error in passes since..index (inclusive)."""
        return {b for p in self.passes[since:index + 1] for b in p.invalid_block_ids}

    def close(self) -> None:
        self.transport.heal()
        with contextlib.suppress(Exception):
            self.worker.shutdown()


__all__ = ["HookRecorder", "KVConnectorWorker", "KVWorkerRig", "LoadMetadata", "PassRecord",
           "RecvHooks", "RecvSpec", "WorkerFactory"]
