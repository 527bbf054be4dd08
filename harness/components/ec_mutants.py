"""Deliberately broken schedulers: each breaks one piece of the EC-deferral rule (PR #41627).

Why: an EC-deferral case that no broken scheduler can fail proves nothing. Each mutant is the
reference model with one override, modelled on a mistake a port of the rule would plausibly
make. `tests/test_ec_components.py` checks that each is caught by its designated case; run
the suite against one with COREWIRE_EC_SCHEDULER=mutant:NAME.
"""

from __future__ import annotations

from harness.components.ec_contract import FakeECConnector, SchedulerFactory, SchedulerShape
from harness.components.ec_reference import ReferenceECScheduler, RequestState, StepDraft


class AllocatesBeforeChecking(ReferenceECScheduler):
    """Allocates the request's KV blocks and encoder entries, then asks the connector, and
    leaves the allocation in place when deferring (the check placed after `allocate_slots`)."""

    def _defer(self, state: RequestState, skipped: list[RequestState]) -> bool:
        bs = self.shape.block_size
        state.blocks = max(state.blocks, -(-state.spec.num_tokens // bs))
        for i in range(len(state.spec.mm_features)):
            if i not in state.encoded:
                state.encoded.add(i)
                self.connector.update_state_after_alloc(state.spec, i)
        return super()._defer(state, skipped)


class PrefillsUpToStagingItem(ReferenceECScheduler):
    """"Optimisation": instead of deferring, schedules the text before the first item that
    is still staging, as `_try_schedule_encoder_inputs` does for a full encoder cache."""

    def _schedule_waiting(self, step: StepDraft) -> None:
        for state in list(self.waiting):
            if state.computed or not state.spec.mm_features or step.budget <= 0:
                continue
            staging = [f.mm_position.offset for f in state.spec.mm_features
                       if f.identifier in self.connector.staging]
            if staging and min(staging) > 0:
                self._run_chunk(state, 0, min(min(staging), step.budget), step)
        super()._schedule_waiting(step)


class BlocksQueueBehindStaging(ReferenceECScheduler):
    """Head-of-line blocking: a staging request at the head stops the waiting loop (`break`
    where vLLM skips and `continue`s), so nothing behind it is scheduled."""

    def _defer(self, state: RequestState, skipped: list[RequestState]) -> bool:
        return False


class DropsDeferredRequest(ReferenceECScheduler):
    """Pops the deferred request but never puts it back (the re-queue line forgotten)."""

    def _requeue(self, skipped: list[RequestState]) -> None:
        return None


class NeverRetries(ReferenceECScheduler):
    """Remembers a request's first "not available" answer and never polls it again, so a
    request whose items land later waits forever."""

    def __init__(self, connector: FakeECConnector, shape: SchedulerShape) -> None:
        super().__init__(connector, shape)
        self._unavailable: set[str] = set()

    def _ec_ready(self, state: RequestState, num_computed_tokens: int) -> bool:
        if state.req_id in self._unavailable:
            return False
        ready = super()._ec_ready(state, num_computed_tokens)
        if not ready:
            self._unavailable.add(state.req_id)
        return ready


class RequeuesAtTail(ReferenceECScheduler):
    """Deferred requests are appended behind every other waiting request, so later arrivals
    overtake them (`waiting.add_request` where vLLM prepends)."""

    def _requeue(self, skipped: list[RequestState]) -> None:
        self.waiting.extend(skipped)


class RequeuesReversed(ReferenceECScheduler):
    """Each skipped request is pushed to the head one at a time, reversing their order."""

    def _requeue(self, skipped: list[RequestState]) -> None:
        self.waiting.extendleft(skipped)


class ChecksComputedItems(ReferenceECScheduler):
    """Polls with the request's own `num_computed_tokens` (0 for a fresh request) instead of
    the prefix hit just computed, so items already covered by cached blocks are checked."""

    def _poll_frontier(self, state: RequestState, prefix_hit: int) -> int:
        return state.computed


class GatesOnlyAdmission(ReferenceECScheduler):
    """The PR-era rule only: RUNNING requests are never gated, so a chunked prefill runs into
    an item that is staging again."""

    def _running_ready(self, state: RequestState) -> bool:
        return True


class GatesTextOnly(ReferenceECScheduler):
    """Polls the connector for every request, text-only ones included (the `mm_features`
    guard dropped), so a busy connector stalls requests that need no encoder cache."""

    def _ec_ready(self, state: RequestState, num_computed_tokens: int) -> bool:
        return self.connector.ensure_cache_available(state.spec, num_computed_tokens)


# Each class is its own factory: built on the connector with the shape. Chosen by
# `harness.components.EC_SCHEDULERS` for "mutant:NAME".
MUTANTS: dict[str, SchedulerFactory] = {
    "allocates_before_checking": AllocatesBeforeChecking,
    "prefills_up_to_staging_item": PrefillsUpToStagingItem,
    "blocks_queue_behind_staging": BlocksQueueBehindStaging,
    "drops_deferred_request": DropsDeferredRequest,
    "never_retries": NeverRetries,
    "requeues_at_tail": RequeuesAtTail,
    "requeues_reversed": RequeuesReversed,
    "checks_computed_items": ChecksComputedItems,
    "gates_only_admission": GatesOnlyAdmission,
    "gates_text_only": GatesTextOnly,
}
