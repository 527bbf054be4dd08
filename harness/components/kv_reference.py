"""`ReferenceKVWorker`: the harness's own KV-connector worker, written from the contract.

Why: the component cases need a worker known to honour the PR #40364 contract (kv_contract.py)
to pass, and the mutants (kv_mutants.py) need one rule each to break. It is written from the
contract (semantics.md (d)), not from vLLM's code; every piece of state has one owner thread.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from harness.components.kv_contract import (
    KVConnectorWorker,
    LoadMetadata,
    RecvHooks,
    RecvSpec,
)
from harness.components.kv_transport import FakeTransport, notif_for


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


__all__ = ["ReferenceKVWorker", "reference_factory"]
