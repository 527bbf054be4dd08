"""EC-cache deferral in the scheduler (seed PR #41627, semantics.md (e)).

When a waiting request's encoder-cache items are still being staged (the EC connector's
`ensure_cache_available(request, num_computed_tokens)` answers False), the scheduler skips it
for the step without allocating KV blocks or encoder-cache entries, schedules the requests
behind it, keeps it at the head of the queue, and schedules it once the lookup succeeds. The
hook is told the prefix frontier so that only items beyond it are checked; vLLM 0.33.0 gates
running requests (chunked prefills) the same way. None of this is on the frontend wire (a
deferred request just starts late), so these cases drive the scheduler directly
(harness.components); they start no engines and ignore --frontend. The scheduler under test:
$COREWIRE_EC_SCHEDULER (reference | vllm | mutant:NAME).
"""

from __future__ import annotations

from collections.abc import Sequence

from conformance.components.helpers import require_none
from harness.cases.authoring import CaseContext, Level, case
from harness.components import ec_scheduler_factory
from harness.components.ec_contract import (
    ECRequest,
    ECSchedulerRig,
    SchedulerShape,
    ec_request,
)

PR = "PR #41627"
SCHED = "vllm 0.33.0 v1/core/sched/scheduler.py"
DEFER_STEPS = 3  # steps a staging request is held for, polled every time

def _rig(ctx: CaseContext, shape: SchedulerShape | None = None) -> ECSchedulerRig:
    name = ctx.config.component_unit("ec")
    ctx.note(f"scheduler under test: {name}")
    return ECSchedulerRig(ec_scheduler_factory(name), shape)


def _prompt(seed: int, n: int) -> list[int]:
    """A prompt of `n` tokens no other seed shares a block with (no accidental prefix hits)."""
    return [1000 * seed + i for i in range(1, n + 1)]


def _held_violations(rig: ECSchedulerRig, req_id: str, steps: Sequence[int]) -> list[str]:
    """In each of `steps`: not scheduled, no KV blocks, no encoder entry, nothing allocated."""
    out: list[str] = []
    for i in steps:
        s = rig.steps[i]
        if s.scheduled(req_id):
            out.append(f"step {i}: {req_id} scheduled {s.scheduled(req_id)} tokens")
        if s.kv_blocks.get(req_id, 0):
            out.append(f"step {i}: {req_id} holds {s.kv_blocks[req_id]} KV blocks")
        if s.encoder_entries.get(req_id):
            out.append(f"step {i}: {req_id} has encoder entries "
                       f"{sorted(s.encoder_entries[req_id])}")
        if allocs := [a.input_id for a in s.allocs if a.req_id == req_id]:
            out.append(f"step {i}: update_state_after_alloc for {req_id} inputs {allocs}")
        if local := s.local_encoder_inputs.get(req_id):
            out.append(f"step {i}: encoder inputs {list(local)} of {req_id} scheduled")
    return out


# ---------------------------------------------------------------------------------------------
# A staging request is skipped without allocating anything.

NOT_ALLOCATED_LAYOUTS: dict[str, tuple[int, int, int]] = {  # prompt length, item offset, length
    "item_at_start": (96, 0, 48),
    "item_mid_prompt": (96, 48, 32),
}


@case("components.ec_deferral.staging_request_not_allocated_{name}", Level.MUST,
      "A waiting request whose encoder-cache item ({length} tokens at offset {offset} of "
      "a {n}-token prompt) is still staging (ensure_cache_available -> False) is not "
      "scheduled: no tokens (not even the text before the item), no KV blocks, no "
      "encoder-cache entry, no update_state_after_alloc; it is polled once per step with "
      "num_computed_tokens 0.",
      source=f"{PR}; {SCHED}:1222-1228 (_ec_transfer_pending before any allocation)",
      params=[{"name": name, "n": n, "offset": offset, "length": length}
              for name, (n, offset, length) in NOT_ALLOCATED_LAYOUTS.items()])
async def staging_request_not_allocated(ctx: CaseContext, n: int, offset: int,
                                        length: int) -> None:
    with _rig(ctx) as rig:
        rig.connector.stage("img-a")
        rig.add(ec_request("A", _prompt(1, n), [("img-a", offset, length)]))
        for _ in range(DEFER_STEPS):
            rig.step()
        require_none(ctx, _held_violations(rig, "A", range(DEFER_STEPS)),
                     "nothing scheduled or allocated for the staging request")
        polls = [(p.step, p.num_computed_tokens) for p in rig.connector.polls_of("A")]
        ctx.require(polls == [(i, 0) for i in range(DEFER_STEPS)],
                    expected=f"polled once per step with 0: "
                             f"{[(i, 0) for i in range(DEFER_STEPS)]}",
                    observed=f"(step, num_computed_tokens) polls {polls}")


# ---------------------------------------------------------------------------------------------
# Requests behind a staging one are scheduled in the same step.

# S: item staging, T: text only, M: item the connector already has. In arrival order.
BEHIND_LAYOUTS = {
    "one_staging": "ST",
    "three_staging": "SSSTM",
    "interleaved": "STSMST",
}


def _layout_requests(layout: str) -> list[tuple[ECRequest, str]]:
    out = []
    for i, kind in enumerate(layout):
        rid = f"{kind}{i}"
        items = [] if kind == "T" else [(f"img-{rid}", 8, 24)]
        out.append((ec_request(rid, _prompt(i + 1, 40 + 8 * i), items), kind))
    return out


@case("components.ec_deferral.requests_behind_scheduled_{name}", Level.MUST,
      "With requests arriving as {layout} (S: item staging, T: text only, M: item "
      "already held by the connector), every request that is not staging is scheduled "
      "in full in the first step, in arrival order; the staging ones are not "
      "(no head-of-line blocking).",
      source=f"{PR}; {SCHED}:1054-1060 (skip_request, then continue)",
      params=[{"name": name, "layout": layout} for name, layout in BEHIND_LAYOUTS.items()])
async def requests_behind_scheduled(ctx: CaseContext, layout: str) -> None:
    reqs = _layout_requests(layout)
    with _rig(ctx) as rig:
        for r, kind in reqs:
            if kind == "S":
                rig.connector.stage(r.mm_features[0].identifier)
            elif kind == "M":
                rig.connector.land(r.mm_features[0].identifier)
        rig.add(*(r for r, _ in reqs))
        step = rig.step()
        ready = [r.request_id for r, kind in reqs if kind != "S"]
        wrong = [f"{r.request_id} got {step.scheduled(r.request_id)} of {r.num_tokens}"
                 for r, kind in reqs
                 if step.scheduled(r.request_id) != (0 if kind == "S" else r.num_tokens)]
        require_none(ctx, wrong, "staging requests 0 tokens, all others their prompt")
        ctx.require(list(step.admitted) == ready,
                    expected=f"admitted in arrival order {ready}",
                    observed=f"admitted {list(step.admitted)}")


# ---------------------------------------------------------------------------------------------
# Retried every step, scheduled once available.


@case("components.ec_deferral.scheduled_once_available", Level.MUST,
      "A deferred request is polled again on every step while its item stages, and in the "
      "first step after the lookup succeeds it is scheduled in full, its item loaded through "
      "the connector (an encoder-cache entry allocated, update_state_after_alloc called, no "
      "local encoder input).",
      source=f"{PR} (test_ec_connector_ensure_cache_available_defers_request step 2); "
             f"{SCHED}:1607-1610")
async def scheduled_once_available(ctx: CaseContext) -> None:
    with _rig(ctx) as rig:
        rig.connector.stage("img-a")
        a = ec_request("A", _prompt(1, 96), [("img-a", 16, 48)])
        rig.add(a, ec_request("T", _prompt(2, 20)))
        for _ in range(DEFER_STEPS):
            rig.step()
        polled = sorted({p.step for p in rig.connector.polls_of("A")})
        ctx.require(polled == list(range(DEFER_STEPS)),
                    expected=f"polled in every step 0..{DEFER_STEPS - 1}",
                    observed=f"polled in steps {polled}")
        rig.connector.land("img-a")
        step = rig.step()
        ctx.require(step.scheduled("A") == a.num_tokens,
                    expected=f"A scheduled with {a.num_tokens} tokens once img-a landed",
                    observed=rig.describe("A"))
        allocs = [(al.input_id, al.external) for al in step.allocs if al.req_id == "A"]
        ctx.require(allocs == [(0, True)] and step.encoder_entries.get("A") == frozenset({0})
                    and not step.local_encoder_inputs.get("A"),
                    expected="img-a allocated once, loaded externally, not encoded locally",
                    observed=f"allocs (input, external) {allocs}, entries "
                             f"{sorted(step.encoder_entries.get('A', ()))}, local encoder "
                             f"inputs {step.local_encoder_inputs.get('A')}")


@case("components.ec_deferral.deferred_keeps_queue_position", Level.MUST,
      "Deferred requests go back to the head of the waiting queue in their original order: "
      "with the token budget full, requests that were waiting behind them (or arrived later) "
      "are not admitted before them once their items land.",
      source=f"{PR} (prepend to step_skipped_waiting); {SCHED}:1054-1060, 1607-1610")
async def deferred_keeps_queue_position(ctx: CaseContext) -> None:
    with _rig(ctx, SchedulerShape(token_budget=64)) as rig:
        rig.connector.stage("img-1", "img-2")
        rig.add(ec_request("A1", _prompt(1, 64), [("img-1", 0, 32)]),
                ec_request("A2", _prompt(2, 64), [("img-2", 16, 32)]),
                ec_request("B", _prompt(3, 64)), ec_request("C", _prompt(4, 64)))
        first = rig.step()
        ctx.require(list(first.admitted) == ["B"],
                    expected="step 0 admits only B (A1, A2 staging; C beyond the budget)",
                    observed=f"admitted {list(first.admitted)}")
        rig.connector.land("img-1", "img-2")
        rig.add(ec_request("D", _prompt(5, 64)))
        order = [a for _ in range(4) for a in rig.step().admitted]
        ctx.require(order == ["A1", "A2", "C", "D"],
                    expected="admitted one per step as A1, A2, C, D",
                    observed=f"admitted {order}")


# ---------------------------------------------------------------------------------------------
# The prefix frontier: only items beyond it are checked.


@case("components.ec_deferral.only_items_beyond_computed_checked", Level.MUST,
      "The hook is called with the prefix-cache hit as num_computed_tokens, so an item that "
      "ends at or before the hit is not waited for: a request whose later item is staging is "
      "deferred, and once that item lands it is scheduled from the hit even though an item "
      "inside the cached prefix is still staging.",
      source=f"{PR} (test_ec_connector_pending_prefetch_only_checks_future_mm_features); "
             f"{SCHED}:1222-1228; 0.33.0 moved the offset+length > num_computed_tokens "
             "filter out of ECConnectorBase (now `return True`) into the connectors "
             "(ec_connector/cpu/scheduler/__init__.py:260)")
async def only_items_beyond_computed_checked(ctx: CaseContext) -> None:
    bs = SchedulerShape().block_size
    with _rig(ctx) as rig:
        rig.add(ec_request("P", _prompt(1, 4 * bs), [("img-a", bs, 2 * bs)]))
        rig.step()  # P computes and caches blocks 0..3; img-a ends at 3*bs
        rig.connector.stage("img-a", "img-b")
        q = ec_request("Q", _prompt(1, 4 * bs) + _prompt(2, 3 * bs),
                       [("img-a", bs, 2 * bs), ("img-b", 3 * bs, 3 * bs)])
        rig.add(q)
        held = rig.step()
        rig.connector.land("img-b")
        go = rig.step()
        hit = 3 * bs  # blocks 0..2 match P's; block 3 overlaps img-b, which P lacks
        polls = [(p.step, p.num_computed_tokens, p.answer) for p in rig.connector.polls_of("Q")]
        ctx.require(polls == [(1, hit, False), (2, hit, True)],
                    expected=f"Q polled with its prefix hit {hit}: not ready while img-b "
                             "stages, ready once it landed (img-a ends at the hit)",
                    observed=f"(step, num_computed_tokens, answer) polls {polls}")
        ctx.require(not held.scheduled("Q") and go.scheduled("Q") == q.num_tokens - hit,
                    expected=f"Q deferred in step 1, then {q.num_tokens - hit} tokens in step 2",
                    observed=rig.describe("Q"))


# ---------------------------------------------------------------------------------------------
# 0.33.0: running requests are gated too; text-only requests never are.


@case("components.ec_deferral.running_request_gated", Level.MUST,
      "A running chunked prefill whose next chunk needs an item that is staging again is "
      "not advanced in that step (no tokens, no new KV blocks) while a waiting request gets "
      "the budget; once the item lands it continues.",
      source=f"{PR}; {SCHED}:828-836 (0.33.0 gates RUNNING requests too, with "
             "num_computed_tokens - num_output_placeholders; the PR gated admission only)")
async def running_request_gated(ctx: CaseContext) -> None:
    with _rig(ctx, SchedulerShape(token_budget=64)) as rig:
        rig.add(ec_request("R", _prompt(1, 128), [("img-r", 96, 32)]),
                ec_request("W", _prompt(2, 64)))
        first = rig.step()
        ctx.require(first.scheduled("R") == 64 and not first.scheduled("W"),
                    expected="step 0: R's first 64-token chunk only",
                    observed=f"scheduled {dict(first.num_scheduled_tokens)}")
        rig.connector.stage("img-r")
        held = rig.step()
        ctx.require(not held.scheduled("R") and held.scheduled("W") == 64
                    and held.kv_blocks.get("R") == first.kv_blocks.get("R"),
                    expected="step 1: R not advanced (blocks unchanged), W scheduled 64",
                    observed=f"scheduled {dict(held.num_scheduled_tokens)}; "
                             f"{rig.describe('R')}")
        rig.connector.land("img-r")
        go = rig.step()
        ctx.require(go.scheduled("R") == 64,
                    expected="step 2: R's last 64 tokens once img-r landed",
                    observed=rig.describe("R"))


@case("components.ec_deferral.text_only_never_gated", Level.MUST,
      "Requests without multimodal items are never polled and never deferred, even while "
      "the connector answers False to every poll; the multimodal request is held and "
      "scheduled once the connector answers True.",
      source=f"{PR}; {SCHED}:2678-2686 (`bool(request.mm_features)` guards the hook)")
async def text_only_never_gated(ctx: CaseContext) -> None:
    with _rig(ctx) as rig:
        rig.connector.busy = True
        rig.connector.land("img-m")
        rig.add(ec_request("M", _prompt(1, 48), [("img-m", 0, 16)]),
                ec_request("T1", _prompt(2, 40)), ec_request("T2", _prompt(3, 24)))
        step = rig.step()
        polled_text = sorted({p.req_id for p in rig.connector.polls if p.req_id != "M"})
        ctx.require(not polled_text, expected="text-only requests never polled",
                    observed=f"polled: {polled_text}")
        ctx.require(step.scheduled("T1") == 40 and step.scheduled("T2") == 24
                    and not step.scheduled("M"),
                    expected="T1, T2 scheduled in full, M held",
                    observed=f"scheduled {dict(step.num_scheduled_tokens)}")
        rig.connector.busy = False
        ctx.require(rig.step().scheduled("M") == 48,
                    expected="M scheduled once the connector answers True",
                    observed=rig.describe("M"))
