"""The KV-connector worker role as a pluggable component (seed PR #40364).

Why a component suite: the NIXL failure contract lives between the connector worker and the
scheduler inside the engine (`finished_recving`, `invalid_block_ids`), so the frontend wire
never shows it. Here a worker is plugged in through `KVConnectorWorker`, NIXL is replaced by
`FakeTransport` (the faults of vLLM's test-only `FailingNixlWrapper`, plus per-request scripts
and release failures), and `KVWorkerRig` drives model-runner passes and records what the
worker reported in each. `ReferenceKVWorker` is the harness's own implementation of the
contract, written from the contract (semantics.md (d)), not from vLLM's code:

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
import enum
import functools
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import zmq

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
# Fault injection: a NIXL-agent-shaped fake.


class Outcome(str, enum.Enum):
    """What one read attempt of a request does."""

    DONE = "DONE"  # check_xfer_state -> "DONE"
    ERR = "ERR"  # check_xfer_state -> "ERR" (vLLM: transfer_failed)
    RAISE = "RAISE"  # check_xfer_state raises (vLLM: transfer_exception)
    HOLD = "HOLD"  # "PROC" until resolve() decides
    SETUP_FAIL = "SETUP_FAIL"  # make_prepped_xfer raises (vLLM: transfer_setup_failed)


class TransportFault(RuntimeError):
    """A failure injected by the fake transport (or a misuse it detected)."""


AGENT_PREFIX = b"agent:"


@dataclass
class _Xfer:
    handle: int
    req_id: str
    outcome: Outcome
    released: bool = False


@dataclass
class _Calls:
    handshakes: list[tuple[str, int]] = field(default_factory=list)  # (engine, thread ident)
    release_attempts: dict[str, int] = field(default_factory=dict)
    misuse: list[str] = field(default_factory=list)


class FakeTransport:
    """NIXL agent stand-in with the faults of vLLM's `FailingNixlWrapper`.

    Global flags mirror `FailingNixlWrapper` (`fail_handshake`, `fail_transfer_setup`,
    `fail_transfer_state`, `fail_transfer_exception`, `fail_send_notif`) plus `fail_release`.
    Per-target scripts allow mixes: `fail_handshake_for(engine)`, `script(req, outcomes...)`
    (one per read attempt, in order; unscripted attempts are DONE), `fail_releases(req, n)`,
    and `resolve(req, outcome)` for HOLD transfers (sticky: later HOLD reads adopt it).

    A read is attributed to its request through `notif_msg`, which NIXL READs carry as
    b"<request id>:<consumers>". The handshake fault fires in whatever thread calls
    `add_remote_agent`, i.e. the worker's background handshake thread. Thread-safe.
    """

    def __init__(self, *, handshake_delay: float = 0.0) -> None:
        self.handshake_delay = handshake_delay
        self.fail_handshake = False
        self.fail_transfer_setup = False
        self.fail_transfer_state = False
        self.fail_transfer_exception = False
        self.fail_send_notif = False
        self.fail_release = False
        self._lock = threading.Lock()
        self._failing_engines: set[str] = set()
        self._scripts: dict[str, list[Outcome]] = {}
        self._attempts: dict[str, int] = {}
        self._release_failures: dict[str, int] = {}
        self._resolved: dict[str, Outcome] = {}
        self._xfers: dict[int, _Xfer] = {}
        self._ids = itertools.count(1)
        self._calls = _Calls()

    # -- scripting (harness side) --------------------------------------------------------------

    def fail_handshake_for(self, *engines: str) -> None:
        with self._lock:
            self._failing_engines.update(engines)

    def script(self, req_id: str, *outcomes: Outcome) -> None:
        with self._lock:
            self._scripts[req_id] = list(outcomes)

    def fail_releases(self, req_id: str, times: int) -> None:
        with self._lock:
            self._release_failures[req_id] = times

    def resolve(self, req_id: str, outcome: Outcome) -> None:
        """Decide the request's HOLD transfers (now and later ones) as DONE, ERR or RAISE."""
        if outcome in (Outcome.HOLD, Outcome.SETUP_FAIL):
            raise ValueError(f"cannot resolve a transfer as {outcome.value}")
        with self._lock:
            self._resolved[req_id] = outcome
            for x in self._xfers.values():
                if x.req_id == req_id and x.outcome is Outcome.HOLD:
                    x.outcome = outcome

    def heal(self) -> None:
        """Clear every fault (before shutdown, so teardown releases cleanly)."""
        with self._lock:
            self.fail_handshake = self.fail_transfer_setup = self.fail_release = False
            self.fail_transfer_state = self.fail_transfer_exception = False
            self.fail_send_notif = False
            self._failing_engines.clear()
            self._release_failures.clear()
            for x in self._xfers.values():
                if x.outcome is Outcome.HOLD:
                    x.outcome = Outcome.DONE

    # -- observation (harness side) ------------------------------------------------------------

    def outstanding(self, req_id: str | None = None) -> list[int]:
        """Handles created and not yet released (for one request, or all)."""
        with self._lock:
            return [x.handle for x in self._xfers.values()
                    if not x.released and (req_id is None or x.req_id == req_id)]

    def handles_of(self, req_id: str) -> list[int]:
        with self._lock:
            return [x.handle for x in self._xfers.values() if x.req_id == req_id]

    def handshake_threads(self, engine: str) -> list[int]:
        """Thread idents that called add_remote_agent for `engine`."""
        with self._lock:
            return [ident for eng, ident in self._calls.handshakes if eng == engine]

    def release_attempts(self, req_id: str) -> int:
        with self._lock:
            return self._calls.release_attempts.get(req_id, 0)

    def misuse(self) -> list[str]:
        """Protocol misuse seen (double release, use after release, unknown handle)."""
        with self._lock:
            return list(self._calls.misuse)

    # -- the NIXL-agent surface (worker side) ---------------------------------------------------

    def fetch_remote_metadata(self, engine_id: str) -> bytes:
        """The handshake's metadata round trip (vLLM: ZMQ GET_META), after `handshake_delay`."""
        if self.handshake_delay > 0:
            time.sleep(self.handshake_delay)
        return AGENT_PREFIX + engine_id.encode()

    def add_remote_agent(self, agent_metadata: bytes) -> str:
        engine = agent_metadata.removeprefix(AGENT_PREFIX).decode(errors="replace")
        with self._lock:
            self._calls.handshakes.append((engine, threading.get_ident()))
            failing = self.fail_handshake or engine in self._failing_engines
        if failing:  # FailingNixlWrapper raises zmq's timeout here
            raise zmq.Again(zmq.EAGAIN, "corewire: simulated handshake timeout")
        return f"remote-agent:{engine}"

    def remove_remote_agent(self, agent_name: str) -> None:
        return None

    def make_prepped_xfer(self, xfer_type: str, local_xfer_side_handle: int,
                          local_block_descs_ids: object, remote_xfer_side_handle: int,
                          remote_block_descs_ids: object, notif_msg: bytes | None = None,
                          **_: object) -> int:
        req_id = _request_of(notif_msg)
        with self._lock:
            attempt = self._attempts.get(req_id, 0)
            self._attempts[req_id] = attempt + 1
            plan = self._scripts.get(req_id, [])
            outcome = plan[attempt] if attempt < len(plan) else Outcome.DONE
            if self.fail_transfer_setup or outcome is Outcome.SETUP_FAIL:
                raise TransportFault("BAD STATUS (corewire: simulated transfer setup failure)")
            if outcome is Outcome.HOLD and req_id in self._resolved:
                outcome = self._resolved[req_id]
            handle = next(self._ids)
            self._xfers[handle] = _Xfer(handle, req_id, outcome)
            return handle

    def transfer(self, handle: int, *_: object, **__: object) -> str:
        with self._lock:
            self._known(handle, "transfer")
        return "PROC"

    def check_xfer_state(self, handle: int) -> str:
        with self._lock:
            x = self._known(handle, "check_xfer_state")
            if self.fail_transfer_exception or x.outcome is Outcome.RAISE:
                raise TransportFault("corewire: simulated check_xfer_state exception")
            if self.fail_transfer_state or x.outcome is Outcome.ERR:
                return "ERR"
            return "PROC" if x.outcome is Outcome.HOLD else "DONE"

    def release_xfer_handle(self, handle: int) -> None:
        with self._lock:
            x = self._known(handle, "release_xfer_handle")
            attempts = self._calls.release_attempts
            attempts[x.req_id] = attempts.get(x.req_id, 0) + 1
            left = self._release_failures.get(x.req_id, 0)
            if self.fail_release or left > 0:
                self._release_failures[x.req_id] = max(left - 1, 0)
                raise TransportFault("corewire: simulated release failure")
            x.released = True

    def get_xfer_telemetry(self, handle: int) -> None:
        return None

    def send_notif(self, agent_name: str, notif_msg: bytes) -> None:
        if self.fail_send_notif:
            raise TransportFault("corewire: simulated send_notif failure")

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        return {}

    def _known(self, handle: int, op: str) -> _Xfer:
        x = self._xfers.get(handle)
        if x is None:
            self._calls.misuse.append(f"{op} on unknown handle {handle}")
            raise TransportFault(f"unknown handle {handle}")
        if x.released:
            self._calls.misuse.append(f"{op} on released handle {handle} ({x.req_id})")
            raise TransportFault(f"handle {handle} already released")
        return x


def _request_of(notif_msg: bytes | None) -> str:
    if not notif_msg:
        return ""
    return notif_msg.decode(errors="replace").rsplit(":", 1)[0]


def notif_for(req_id: str, consumers: int = 1) -> bytes:
    """The READ notification a worker tags each read with (how the transport attributes it)."""
    return f"{req_id}:{consumers}".encode()


# ---------------------------------------------------------------------------------------------
# The reference worker.


class ReferenceKVWorker:
    """Honours the PR #40364 contract; every piece of state has one owner thread.

    Main thread: `_recving`, `_handles`, `_unreleased`, `_failures`. Background handshake
    thread: talks to the transport and reports through the queues only. `_agents` and
    `_handshakes` are shared and guarded by `_lock`.
    """

    THREAD_PREFIX = "corewire-kv-handshake"

    def __init__(self, transport: FakeTransport, hooks: RecvHooks) -> None:
        self._transport = transport
        self._hooks = hooks
        # One thread, like NIXL's handshake initiator: the agent is not guaranteed thread-safe.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.THREAD_PREFIX)
        self._lock = threading.Lock()
        self._agents: dict[str, str] = {}
        self._handshakes: dict[str, Future[str]] = {}
        self._ready: queue.Queue[RecvSpec] = queue.Queue()
        self._failed_recv: queue.Queue[str] = queue.Queue()  # filled from any thread
        self._invalid: queue.Queue[frozenset[int]] = queue.Queue()
        self._recving: dict[str, RecvSpec] = {}
        self._handles: dict[str, list[int]] = {}
        self._unreleased: set[int] = set()  # failed handles whose release must be retried
        self._failures: set[str] = set()

    # -- start_load_kv ---------------------------------------------------------------------------

    def start_load_kv(self, metadata: LoadMetadata) -> None:
        for spec in metadata.reqs_to_recv:
            self._recving[spec.req_id] = spec
            self._request(spec)
        while True:  # reads whose handshake completed since the last pass
            try:
                spec = self._ready.get_nowait()
            except queue.Empty:
                break
            self._read(spec)

    def _request(self, spec: RecvSpec) -> None:
        engine = spec.remote_engine_id
        with self._lock:
            known = engine in self._agents
            fut = None if known else self._handshakes.get(engine)
            if not known and fut is None:
                fut = self._executor.submit(self._handshake, engine)
                self._handshakes[engine] = fut
        if fut is None:
            self._read(spec)
            return
        # Runs on the handshake thread (or here, if it already finished).
        fut.add_done_callback(functools.partial(self._handshake_done, spec))

    def _handshake(self, engine: str) -> str:
        """Background thread: fetch the remote's metadata and load its agent."""
        try:
            name = self._transport.add_remote_agent(
                self._transport.fetch_remote_metadata(engine))
        except BaseException:
            with self._lock:
                self._handshakes.pop(engine, None)
            raise
        with self._lock:
            self._agents[engine] = name
            self._handshakes.pop(engine, None)
        return name

    def _handshake_done(self, spec: RecvSpec, fut: Future[str]) -> None:
        if fut.cancelled():
            return
        if fut.exception() is None:
            self._ready.put(spec)
        else:
            self._handshake_failed(spec.req_id)

    def _handshake_failed(self, req_id: str) -> None:
        """Hand a failure from the handshake thread to the main thread."""
        self._failed_recv.put(req_id)

    def _read(self, spec: RecvSpec) -> None:
        for _ in range(spec.reads):
            try:
                handle = self._transport.make_prepped_xfer(
                    "READ", 0, list(spec.local_block_ids), 0, list(spec.remote_block_ids),
                    notif_msg=notif_for(spec.req_id))
            except Exception:
                self._failures.add(spec.req_id)
                return  # no further reads for a failed request
            handles = self._handles.setdefault(spec.req_id, [])
            try:
                self._transport.transfer(handle)
            except Exception:
                self._failures.add(spec.req_id)
                if not self._release(handle):
                    handles.append(handle)
                    self._unreleased.add(handle)
                if not handles:
                    del self._handles[spec.req_id]
                return
            handles.append(handle)

    def _release(self, handle: int) -> bool:
        """Release a handle; False means the backend may still use it, so it is kept."""
        try:
            self._transport.release_xfer_handle(handle)
        except Exception:
            return False
        return True

    # -- get_finished ----------------------------------------------------------------------------

    def get_finished(self) -> tuple[set[str], set[str]]:
        done = self._poll_handles()
        while True:
            try:
                self._failures.add(self._failed_recv.get_nowait())
            except queue.Empty:
                break
        failed = {r for r in self._failures if r not in self._handles}
        self._failures -= failed
        failed &= self._recving.keys()  # ids not (or no longer) receiving are dropped
        return set(), self._complete(done | failed, failed)

    def _poll_handles(self) -> set[str]:
        """Requests none of whose handles is outstanding any more."""
        done: set[str] = set()
        for req_id, handles in list(self._handles.items()):
            remaining = [h for h in handles if not self._settle(req_id, h)]
            if remaining:
                self._handles[req_id] = remaining
            else:
                del self._handles[req_id]
                done.add(req_id)
        return done

    def _settle(self, req_id: str, handle: int) -> bool:
        """True when the handle is finished and released."""
        if handle in self._unreleased:  # failure already recorded; only the release is left
            if self._release(handle):
                self._unreleased.discard(handle)
                return True
            return False
        try:
            state: str | None = self._transport.check_xfer_state(handle)
        except Exception:
            state = None
        if state == "PROC":
            return False
        if state != "DONE":
            self._failures.add(req_id)
        if self._release(handle):
            return True
        self._failures.add(req_id)  # a handle that cannot be released may still be written
        self._unreleased.add(handle)
        return False

    def _complete(self, done: set[str], failed: set[str]) -> set[str]:
        finished: set[str] = set()
        for req_id in done:
            spec = self._recving.pop(req_id, None)
            if spec is None:
                continue
            finished.add(req_id)
            if req_id in failed:
                self._invalid.put(frozenset(spec.local_block_ids))
            else:
                self._hooks.post_process(req_id)
        return finished

    def get_block_ids_with_load_errors(self) -> set[int]:
        out: set[int] = set()
        while True:
            try:
                out |= self._invalid.get_nowait()
            except queue.Empty:
                return out

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        for handles in self._handles.values():
            for handle in handles:
                with contextlib.suppress(Exception):
                    self._transport.release_xfer_handle(handle)
        self._handles.clear()


def reference_factory(transport: FakeTransport, hooks: RecvHooks) -> KVConnectorWorker:
    return ReferenceKVWorker(transport, hooks)


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
        while True:
            self.step()
            if predicate():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)

    async def step_until(self, predicate: Callable[[], bool], timeout: float,
                         interval: float = 0.001) -> bool:
        """As `step_until_sync`, yielding to the event loop between passes."""
        deadline = time.monotonic() + timeout
        while True:
            self.step()
            if predicate():
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(interval)

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
