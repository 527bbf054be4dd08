"""Deliberately broken KV workers: each breaks one rule of the PR #40364 contract.

Why: a component case that no broken worker can fail proves nothing. Each mutant is the
reference worker with one small override, modelled on a real failure mode (most are bugs
the PR fixed or its review raised). `tests/test_kv_components.py` checks that every mutant is
caught by at least one case; run the suite against one with COREWIRE_KV_WORKER=mutant:NAME.
"""

from __future__ import annotations

from harness.components.kv_contract import RecvHooks, WorkerFactory
from harness.components.kv_reference import ReferenceKVWorker
from harness.components.kv_transport import FakeTransport


class PostProcessesFailures(ReferenceKVWorker):
    """Pre-PR behaviour: failed receives are merged into done_recving and post-processed
    (host->device sync, layout conversion) as if their KV had arrived."""

    def _complete(self, done: set[str], failed: set[str]) -> set[str]:
        finished = super()._complete(done, failed)
        for req_id in finished & failed:
            self._hooks.post_process(req_id)
        return finished


class ErrCountsAsDone(ReferenceKVWorker):
    """The `_pop_done_transfers` hole raised in review: a transfer whose state is neither DONE
    nor PROC ("ERR") is treated as finished, so it is post-processed, not failed."""

    def _settle(self, req_id: str, handle: int) -> bool:
        try:
            if self._transport.check_xfer_state(handle) == "ERR":
                return self._release(handle)
        except Exception:
            pass
        return super()._settle(req_id, handle)


class ReportsFailuresTwice(ReferenceKVWorker):
    """Failed requests are echoed in finished_recving on the next pass too (the failure set is
    not cleared when reported)."""

    def __init__(self, transport: FakeTransport, hooks: RecvHooks) -> None:
        super().__init__(transport, hooks)
        self._echo: set[str] = set()

    def _complete(self, done: set[str], failed: set[str]) -> set[str]:
        finished = super()._complete(done, failed)
        echo, self._echo = self._echo, finished & failed
        return finished | echo


class LosesHandshakeFailures(ReferenceKVWorker):
    """Handshake failures from the background thread go into a plain set that get_finished
    never drains: the request waits for its KV forever (the hand-off the PR made a Queue)."""

    def __init__(self, transport: FakeTransport, hooks: RecvHooks) -> None:
        super().__init__(transport, hooks)
        self._thread_failures: set[str] = set()

    def _handshake_failed(self, req_id: str) -> None:
        self._thread_failures.add(req_id)


class LateInvalidBlocks(ReferenceKVWorker):
    """Invalid block ids are returned one pass after the request is reported, so the scheduler
    sees a finished request whose blocks it still believes valid."""

    def __init__(self, transport: FakeTransport, hooks: RecvHooks) -> None:
        super().__init__(transport, hooks)
        self._carry: set[int] = set()

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._carry = self._carry, super().get_block_ids_with_load_errors()
        return out


class ReportsWithOutstandingHandles(ReferenceKVWorker):
    """A request is reported failed as soon as one of its transfers fails, while its other
    handles are still in flight (the multi-rank race the PR left open)."""

    def get_finished(self) -> tuple[set[str], set[str]]:
        done = self._poll_handles()
        while not self._failed_recv.empty():
            self._failures.add(self._failed_recv.get_nowait())
        failed = set(self._failures) & self._recving.keys()
        self._failures -= failed
        for req_id in failed:
            self._handles.pop(req_id, None)
        return set(), self._complete(done | failed, failed)


class DropsUnreleasableHandles(ReferenceKVWorker):
    """A handle whose release fails is forgotten, so the request is reported while the
    backend may still write its blocks (instead of retaining the handle until release)."""

    def _release(self, handle: int) -> bool:
        super()._release(handle)
        return True


class SkipsNeighbours(ReferenceKVWorker):
    """Over-eager skip: when any receive failed in a pass, every request finishing in that
    pass skips post-processing, healthy neighbours included."""

    def _complete(self, done: set[str], failed: set[str]) -> set[str]:
        if not failed:
            return super()._complete(done, failed)
        hooks = self._hooks
        self._hooks = _NoHooks()
        try:
            return super()._complete(done, failed)
        finally:
            self._hooks = hooks


class _NoHooks:
    def post_process(self, req_id: str) -> None:
        return None


# Each class is its own factory: built on the transport, reporting to the hooks. Chosen by
# `harness.components.KV_WORKERS` for "mutant:NAME".
MUTANTS: dict[str, WorkerFactory] = {
    "post_processes_failures": PostProcessesFailures,
    "err_counts_as_done": ErrCountsAsDone,
    "reports_failures_twice": ReportsFailuresTwice,
    "loses_handshake_failures": LosesHandshakeFailures,
    "late_invalid_blocks": LateInvalidBlocks,
    "reports_with_outstanding_handles": ReportsWithOutstandingHandles,
    "drops_unreleasable_handles": DropsUnreleasableHandles,
    "skips_neighbours": SkipsNeighbours,
}
