"""The harness's own scheduler model for the EC-deferral rule (the suite's embedded default).

Why a model and not vLLM: the suite must run without vLLM, and its mutants need a small
scheduler whose one rule each can break. Written from the contract (ec_contract's docstring),
correct by construction and deliberately small: FCFS waiting queue, chunked prefill under one
token budget, block-granular KV accounting, a prefix cache keyed by the tokens and the
multimodal items of each full block, encoder-cache entries allocated for the items a
scheduled chunk overlaps (loaded when the connector has them, encoded locally otherwise).
No decoding, preemption or eviction: the cases never need them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from harness.components.ec_contract import (
    ECRequest,
    ECScheduler,
    FakeECConnector,
    ScheduledStep,
    SchedulerShape,
)


@dataclass(eq=False)
class RequestState:
    spec: ECRequest
    computed: int = 0
    blocks: int = 0
    encoded: set[int] = field(default_factory=set)

    @property
    def req_id(self) -> str:
        return self.spec.request_id


@dataclass
class StepDraft:
    """The step being built: budget left and what was scheduled so far."""

    budget: int
    scheduled: dict[str, int] = field(default_factory=dict)
    admitted: list[str] = field(default_factory=list)
    local_encoder: dict[str, list[int]] = field(default_factory=dict)


class ReferenceECScheduler:
    """FCFS scheduler with the EC-deferral gate on waiting and running requests."""

    def __init__(self, connector: FakeECConnector, shape: SchedulerShape) -> None:
        self.connector = connector
        self.shape = shape
        self.states: dict[str, RequestState] = {}
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self._cached_prefixes: set[tuple[tuple[int, ...], tuple[str, ...]]] = set()

    # -- the ECScheduler surface -----------------------------------------------------------------

    def add_request(self, request: ECRequest) -> None:
        state = RequestState(request)
        self.states[request.request_id] = state
        self.waiting.append(state)

    def schedule(self) -> ScheduledStep:
        step = StepDraft(self.shape.token_budget)
        self._schedule_running(step)
        self._schedule_waiting(step)
        return ScheduledStep(step.scheduled, tuple(step.admitted),
                             {r: tuple(ids) for r, ids in step.local_encoder.items()})

    def num_kv_blocks(self, req_id: str) -> int:
        state = self.states.get(req_id)
        return state.blocks if state else 0

    def encoder_entries(self, req_id: str) -> frozenset[int]:
        state = self.states.get(req_id)
        return frozenset(state.encoded) if state else frozenset()

    def num_computed_tokens(self, req_id: str) -> int:
        state = self.states.get(req_id)
        return state.computed if state else 0

    def shutdown(self) -> None:
        return None

    # -- the rule (each piece overridable by a mutant) -----------------------------------------

    def _schedule_running(self, step: StepDraft) -> None:
        for state in self.running:
            if step.budget <= 0:
                break
            remaining = state.spec.num_tokens - state.computed
            if remaining <= 0:
                continue  # prefill done; decoding is out of scope
            if not self._running_ready(state):
                continue
            self._run_chunk(state, state.computed, min(remaining, step.budget), step)

    def _running_ready(self, state: RequestState) -> bool:
        """0.33.0 gates RUNNING requests too (scheduler.py:828-836)."""
        return self._ec_ready(state, state.computed)

    def _schedule_waiting(self, step: StepDraft) -> None:
        skipped: list[RequestState] = []
        while self.waiting and step.budget > 0 and len(self.running) < self.shape.max_num_seqs:
            state = self.waiting[0]
            hit = self._prefix_hit(state.spec)
            if not self._ec_ready(state, self._poll_frontier(state, hit)):
                if self._defer(state, skipped):
                    continue
                break
            self.waiting.popleft()
            self.running.append(state)
            step.admitted.append(state.req_id)
            self._run_chunk(state, hit, min(state.spec.num_tokens - hit, step.budget), step)
        self._requeue(skipped)

    def _ec_ready(self, state: RequestState, num_computed_tokens: int) -> bool:
        """Text-only requests are never gated; others ask the connector."""
        if not state.spec.mm_features:
            return True
        return self.connector.ensure_cache_available(state.spec, num_computed_tokens)

    def _poll_frontier(self, state: RequestState, prefix_hit: int) -> int:
        """What the hook is told is computed: the local + external prefix hit."""
        return prefix_hit

    def _defer(self, state: RequestState, skipped: list[RequestState]) -> bool:
        """Skip the head request for this step; True: go on with the ones behind it."""
        skipped.append(self.waiting.popleft())
        return True

    def _requeue(self, skipped: list[RequestState]) -> None:
        """Skipped requests go back to the head of the queue, in their original order."""
        self.waiting.extendleft(reversed(skipped))

    # -- allocation ------------------------------------------------------------------------------

    def _run_chunk(self, state: RequestState, start: int, n: int, step: StepDraft) -> None:
        """Schedule tokens [start, start+n): encoder entries, KV blocks, prefix cache."""
        if n <= 0:
            return
        end = start + n
        for i, item in enumerate(state.spec.mm_features):
            pos = item.mm_position
            if pos.offset < end and pos.end > start and i not in state.encoded:
                if not self.connector.has_cache_item(item.identifier):
                    step.local_encoder.setdefault(state.req_id, []).append(i)
                state.encoded.add(i)
                self.connector.update_state_after_alloc(state.spec, i)
        bs = self.shape.block_size
        state.blocks = max(state.blocks, -(-end // bs))
        state.computed = end
        for k in range(end // bs):
            self._cached_prefixes.add(self._block_key(state.spec, k))
        step.scheduled[state.req_id] = n
        step.budget -= n

    def _block_key(self, spec: ECRequest, k: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Blocks 0..k: their tokens and the items that start in them (vLLM's extra keys)."""
        end = (k + 1) * self.shape.block_size
        return (spec.prompt_token_ids[:end],
                tuple(f.identifier for f in spec.mm_features if f.mm_position.offset < end))

    def _prefix_hit(self, spec: ECRequest) -> int:
        """Cached full blocks, leaving at least one token to compute."""
        bs = self.shape.block_size
        blocks = 0
        while blocks < (spec.num_tokens - 1) // bs and \
                self._block_key(spec, blocks) in self._cached_prefixes:
            blocks += 1
        return blocks * bs


def reference_ec_factory(connector: FakeECConnector, shape: SchedulerShape) -> ECScheduler:
    return ReferenceECScheduler(connector, shape)
