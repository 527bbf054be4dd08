"""The scheduler's EC-deferral rule as a pluggable component (seed PR #41627).

Why a component suite: whether the scheduler defers a request whose encoder-cache items are
still being staged (remote -> CPU prefetch) is decided inside the engine core, between the
scheduler and its EC connector (`ECConnectorBase.ensure_cache_available`), so the frontend
wire only ever shows a request that starts late. Here the scheduler under test is plugged in
through `ECScheduler`, its EC connector is the harness's `FakeECConnector` (staging items,
landed items, a busy connector; every call recorded), and `ECSchedulerRig` steps it and
records what each step scheduled and allocated.

The rule, as vLLM 0.33.0 implements it (`vllm/v1/core/sched/scheduler.py`):

* a waiting request with multimodal features is polled with
  `ensure_cache_available(request, num_computed_tokens)` after its local + external prefix
  hit is known (scheduler.py:1222-1228, `_ec_transfer_pending` at 2678); on False it is
  skipped -- no KV blocks, no encoder-cache entry -- and put back at the head of the waiting
  queue in its original order (`skip_request`, 1054; `prepend_requests`, 1607-1610);
* requests behind it are still scheduled in the same step;
* it is polled again on every later step and scheduled once the lookup succeeds;
* the hook gets the prefix frontier, and the connector checks only the items that end beyond
  it (0.33.0's CPU EC connector: `pos.offset + pos.length <= num_computed_tokens` is skipped,
  ec_connector/cpu/scheduler/__init__.py:260; the PR put that filter in the base class, 0.33.0's
  base `ensure_cache_available` just returns True);
* 0.33.0 only, beyond the PR: RUNNING requests are gated too (scheduler.py:828-836), with
  `num_computed_tokens - num_output_placeholders`, so a chunked prefill whose next chunk needs
  an item that is staging again does not advance while the others do;
* requests without multimodal features are never gated (`request.mm_features` is falsy).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# ---------------------------------------------------------------------------------------------
# Requests, in the shape vLLM's scheduler and EC connectors read them.


@dataclass(frozen=True)
class Placement:
    """Where an item's placeholder tokens sit in the prompt (vLLM: `PlaceholderRange`)."""

    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class MMItem:
    """One multimodal item (vLLM: `MultiModalFeatureSpec`): `identifier` keys the encoder cache."""

    identifier: str
    mm_position: Placement


@dataclass(frozen=True)
class ECRequest:
    """A request for the scheduler under test: prompt tokens and its multimodal items.

    Attribute names follow vLLM's `Request` (`request_id`, `mm_features`,
    `num_computed_tokens` is the scheduler's business), so `FakeECConnector` reads a reference
    request and a vLLM request alike.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    mm_features: tuple[MMItem, ...] = ()
    max_tokens: int = 4

    def __post_init__(self) -> None:
        for f in self.mm_features:
            if f.mm_position.offset < 0 or f.mm_position.end > len(self.prompt_token_ids):
                raise ValueError(f"{self.request_id}: item {f.identifier} at "
                                 f"{f.mm_position} lies outside the {self.num_tokens}-token "
                                 "prompt")

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids)


def ec_request(req_id: str, tokens: Sequence[int] | int,
               items: Iterable[tuple[str, int, int]] = ()) -> ECRequest:
    """`tokens`: the prompt, or a length (tokens 1..n); `items`: (identifier, offset, length)."""
    prompt = tuple(range(1, tokens + 1)) if isinstance(tokens, int) else tuple(tokens)
    return ECRequest(req_id, prompt, tuple(MMItem(i, Placement(o, n)) for i, o, n in items))


# ---------------------------------------------------------------------------------------------
# The EC connector the scheduler under test talks to.


@dataclass(frozen=True)
class Poll:
    """One `ensure_cache_available` call and its answer."""

    step: int
    req_id: str
    num_computed_tokens: int
    answer: bool


@dataclass(frozen=True)
class Alloc:
    """One `update_state_after_alloc` call: an encoder-cache entry was allocated."""

    step: int
    req_id: str
    input_id: int
    external: bool  # the connector had the item (loaded, not encoded locally)


@dataclass
class _ECMeta:
    """What `build_connector_meta` hands the workers: the items to load this step."""

    loads: list[tuple[str, str]] = field(default_factory=list)  # (request id, identifier)


class FakeECConnector:
    """A scheduler-side EC connector with items in transit.

    * `stage(ids)`: the items are being fetched; `ensure_cache_available` answers False for a
      request with a staging item that ends beyond `num_computed_tokens` (items already behind
      the prefix frontier are not checked, as 0.33.0's CPU connector does);
    * `land(ids)`: staging is over, the connector has the items (`has_cache_item` -> True);
    * `busy`: answer False to every poll (a connector whose transfer queue is backed up).

    Every poll and allocation is recorded with the rig's step index. Duck-typed to the
    `ECConnectorBase` scheduler-side surface vLLM's Scheduler calls.
    """

    def __init__(self) -> None:
        self.staging: set[str] = set()
        self.held: set[str] = set()
        self.busy = False
        self.step = -1
        self.polls: list[Poll] = []
        self.allocs: list[Alloc] = []
        self._pending_loads: list[tuple[str, str]] = []

    # -- scripting (harness side) --------------------------------------------------------------

    def stage(self, *identifiers: str) -> None:
        self.staging.update(identifiers)
        self.held.difference_update(identifiers)

    def land(self, *identifiers: str) -> None:
        self.staging.difference_update(identifiers)
        self.held.update(identifiers)

    # -- observation -----------------------------------------------------------------------------

    def polls_of(self, req_id: str) -> list[Poll]:
        return [p for p in self.polls if p.req_id == req_id]

    def allocs_of(self, req_id: str) -> list[Alloc]:
        return [a for a in self.allocs if a.req_id == req_id]

    # -- the scheduler-side connector surface ------------------------------------------------------

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        pending = [f.identifier for f in request.mm_features
                   if f.identifier in self.staging
                   and f.mm_position.offset + f.mm_position.length > num_computed_tokens]
        answer = not self.busy and not pending
        self.polls.append(Poll(self.step, request.request_id, num_computed_tokens, answer))
        return answer

    def has_cache_item(self, identifier: str) -> bool:
        return identifier in self.held

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        identifier = request.mm_features[index].identifier
        external = identifier in self.held
        self.allocs.append(Alloc(self.step, request.request_id, index, external))
        if external:
            self._pending_loads.append((request.request_id, identifier))

    def build_connector_meta(self, scheduler_output: object) -> _ECMeta:
        meta, self._pending_loads = _ECMeta(self._pending_loads), []
        return meta

    def update_state_after_free(self, request: Any, index: int) -> None:
        return None

    def update_connector_output(self, connector_output: object) -> None:
        return None

    def request_finished(self, request: Any) -> tuple[bool, dict[str, Any] | None]:
        return False, None

    def take_unavailable_requests(self) -> set[str]:
        return set()

    def has_pending_push_work(self) -> bool:
        return False

    def get_ec_connector_stats(self) -> None:
        return None

    def shutdown(self) -> None:
        return None


# ---------------------------------------------------------------------------------------------
# The scheduler role under test.


@dataclass(frozen=True)
class SchedulerShape:
    """Budgets and sizes; the cases pick small token budgets to force chunked prefills."""

    token_budget: int = 512
    max_num_seqs: int = 16
    block_size: int = 16
    num_blocks: int = 256
    encoder_cache_size: int = 4096


@dataclass(frozen=True)
class ScheduledStep:
    """What one `schedule()` produced, in harness terms."""

    num_scheduled_tokens: Mapping[str, int]
    admitted: tuple[str, ...]  # waiting requests newly scheduled, in admission order
    local_encoder_inputs: Mapping[str, tuple[int, ...]]  # items encoded locally this step


@runtime_checkable
class ECScheduler(Protocol):
    """The scheduler surface the rig drives (one `schedule()` per engine step)."""

    def add_request(self, request: ECRequest) -> None: ...

    def schedule(self) -> ScheduledStep: ...

    def num_kv_blocks(self, req_id: str) -> int:
        """KV blocks the request holds now."""

    def encoder_entries(self, req_id: str) -> frozenset[int]:
        """Input ids of the request with an encoder-cache entry now."""

    def num_computed_tokens(self, req_id: str) -> int: ...

    def shutdown(self) -> None: ...


class SchedulerFactory(Protocol):
    """Builds the scheduler under test on `connector`."""

    def __call__(self, connector: FakeECConnector, shape: SchedulerShape) -> ECScheduler: ...


# ---------------------------------------------------------------------------------------------
# The rig.


@dataclass(frozen=True)
class StepRecord:
    """One step: what was scheduled, polled, allocated, and what each request holds after."""

    index: int
    num_scheduled_tokens: Mapping[str, int]
    admitted: tuple[str, ...]
    local_encoder_inputs: Mapping[str, tuple[int, ...]]
    polls: tuple[Poll, ...]
    allocs: tuple[Alloc, ...]
    kv_blocks: Mapping[str, int]
    encoder_entries: Mapping[str, frozenset[int]]
    computed: Mapping[str, int]

    def scheduled(self, req_id: str) -> int:
        return self.num_scheduled_tokens.get(req_id, 0)


class ECSchedulerRig:
    """A scheduler under test, its fake EC connector, and the log of steps."""

    def __init__(self, factory: SchedulerFactory, shape: SchedulerShape | None = None) -> None:
        self.connector = FakeECConnector()
        self.shape = shape or SchedulerShape()
        self.scheduler = factory(self.connector, self.shape)
        self.steps: list[StepRecord] = []
        self.requests: dict[str, ECRequest] = {}

    def __enter__(self) -> ECSchedulerRig:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.scheduler.shutdown()

    def add(self, *requests: ECRequest) -> None:
        for r in requests:
            self.requests[r.request_id] = r
            self.scheduler.add_request(r)

    def step(self) -> StepRecord:
        index = len(self.steps)
        self.connector.step = index
        polls, allocs = len(self.connector.polls), len(self.connector.allocs)
        out = self.scheduler.schedule()
        ids = list(self.requests)
        record = StepRecord(
            index, dict(out.num_scheduled_tokens), tuple(out.admitted),
            dict(out.local_encoder_inputs), tuple(self.connector.polls[polls:]),
            tuple(self.connector.allocs[allocs:]),
            {r: self.scheduler.num_kv_blocks(r) for r in ids},
            {r: self.scheduler.encoder_entries(r) for r in ids},
            {r: self.scheduler.num_computed_tokens(r) for r in ids})
        self.steps.append(record)
        return record

    def steps_scheduling(self, req_id: str) -> list[int]:
        """Indices of the steps that scheduled tokens for `req_id`."""
        return [s.index for s in self.steps if s.scheduled(req_id)]

    def describe(self, req_id: str) -> str:
        """One line per step for evidence: tokens, blocks, encoder entries, polls."""
        parts = []
        for s in self.steps:
            polls = [(p.num_computed_tokens, p.answer) for p in s.polls if p.req_id == req_id]
            entries = sorted(s.encoder_entries.get(req_id, ()))
            parts.append(f"step {s.index}: {s.scheduled(req_id)} tok, "
                         f"{s.kv_blocks.get(req_id, 0)} blk, enc {entries}, polls {polls}")
        return f"{req_id}: " + "; ".join(parts)
