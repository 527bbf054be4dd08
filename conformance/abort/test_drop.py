"""Dropped streams: one ABORT per dropped live stream, at the engine that owns it.

Hard rules: every dropped live stream is aborted exactly once, at the engine that owns it
(also when it was routed with an explicit data_parallel_rank, and however unevenly a burst is
spread over the engines), never in an empty frame. Coalescing a burst into one frame per
engine is what vllm-rs does and AsyncLLM does not (one ABORT per cancelled stream), so it is
graded SHOULD (seed PR #44591; grounds below cite the vLLM 0.33.0 lines).
"""

from __future__ import annotations

from conformance.abort.helpers import (
    AL,
    BURST_ONCE,
    CC,
    DROP,
    DROP_ONCE,
    ENGINE_ABORT,
    IMP,
    STATE,
    check_exactly_once,
    holding,
    open_pinned,
    open_streams,
    settle_aborts,
    wait_aborted,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineScript,
    Level,
    any_request,
    both,
    case,
    differ,
    py,
    rs,
    trickle,
)

# A request pinned with data_parallel_rank is recorded at that engine and aborted there.
PINNED_DROP = both(
    py(f"{CC}:1763", "if (eng_index := request.data_parallel_rank) is None and ("),
    py(f"{CC}:1810", "self.reqs_in_flight[request.request_id] = chosen_engine"),
    py(f"{CC}:1884", "await self._abort_requests(request_ids, engine)"),
    rs(f"{STATE}:202", "if let Some(rank) = data_parallel_rank {"),
    rs(f"{STATE}:192", "engine_id: engine_id.clone(),"),
    rs(f"{IMP}:406", "by_engine.entry(engine_id).or_default().push(request_id);"),
    rs(f"{STATE}:1176", "fn register_with_data_parallel_rank_routes_to_specified_engine()"),
    *ENGINE_ABORT,
)

UNEVEN = {1: [9], 2: [1, 6], 3: [4, 1, 2], 4: [2, 9, 1, 3]}  # streams per engine


@case("abort.drop.single", Level.MUST,
      "Dropping one live stream sends one ABORT with its id to its engine.",
      grounds=DROP_ONCE, needs=DROP)
async def drop_single(ctx: CaseContext) -> None:
    group = await ctx.start(holding())
    handles, owners = await open_streams(ctx, group, 1)
    await ctx.driver.drop(handles)
    await settle_aborts(ctx, group, owners)
    check_exactly_once(ctx, group, owners)


@case("abort.burst.exactly_once", Level.MUST,
      "A burst of dropped streams across DP engines aborts each id exactly once, at its "
      "owning engine, never in an empty frame.", grounds=BURST_ONCE, needs=DROP)
async def burst_exactly_once(ctx: CaseContext) -> None:
    group = await ctx.start(holding(2))
    handles, owners = await open_streams(ctx, group, 8)
    await ctx.driver.drop(handles)
    await settle_aborts(ctx, group, owners)
    check_exactly_once(ctx, group, owners)


@case("abort.burst.over_1024", Level.MUST,
      "More than 1024 simultaneous drops are all aborted exactly once at their engine.",
      grounds=both(
          py(f"{AL}:809", "await self.abort(q.request_id, internal=True)"),
          rs(f"{IMP}:382", "const MAX_DRAIN: usize = 1024;"),
          rs(f"{IMP}:385", "while abort_rx.recv_many(&mut batch, MAX_DRAIN).await > 0 {"),
          *ENGINE_ABORT,
      ), needs=DROP, timeout=60)
async def burst_over_1024(ctx: CaseContext) -> None:
    group = await ctx.start(holding())
    handles, owners = await open_streams(ctx, group, 1100)
    await ctx.driver.drop(handles)
    await wait_aborted(ctx, group, set(owners), timeout=10)
    await ctx.quiet(0.1)
    check_exactly_once(ctx, group, owners)
    sizes = [len(r.message.request_ids) for r in group.transcript.abort_frames()]
    ctx.note(f"{len(sizes)} ABORT frames, largest {max(sizes)} ids")


@case("abort.burst.uneven_{n}_engines", Level.MUST,
      "Dropping streams spread unevenly over {n} engine(s) ({per_engine}) aborts each "
      "id exactly once at its own engine.", grounds=PINNED_DROP,
      needs=[*DROP, Capability.DP_RANK],
      params=[{"n": n, "per_engine": per_engine} for n, per_engine in UNEVEN.items()])
async def burst_uneven(ctx: CaseContext, n: int, per_engine: list[int]) -> None:
    group = await ctx.start(holding(n))
    handles, owners = await open_pinned(ctx, group, per_engine)
    await ctx.driver.drop(handles)
    await settle_aborts(ctx, group, owners)
    check_exactly_once(ctx, group, owners)


@case("abort.drop.explicit_rank", Level.MUST,
      "Dropping a stream routed with an explicit data_parallel_rank aborts it at that "
      "engine.", grounds=PINNED_DROP, needs=[*DROP, Capability.DP_RANK])
async def drop_explicit_rank(ctx: CaseContext) -> None:
    group = await ctx.start(holding(3))
    handles, owners = await open_pinned(ctx, group, [0, 0, 1])
    await ctx.driver.drop(handles)
    await settle_aborts(ctx, group, owners)
    check_exactly_once(ctx, group, owners)


# abort.burst.shares_frame: a batching abort loop sends whatever queued up while it was away
# in one frame per engine; a never-batching one sends one frame per id whatever the timing.
# Each burst of drops of streaming requests is one more chance for drops to queue behind the
# loop (docs/abort-batching.md has the why and the 20-run tally under load).
SHARE_BURSTS = 6
SHARE_BURST_SIZE = 16


@case("abort.burst.shares_frame", Level.SHOULD,
      "Drops that queue up before the frontend's abort loop runs should leave together: "
      "over several bursts of streaming drops, some ABORT frame carries >= 2 ids.",
      grounds=differ(
          py(f"{AL}:809", "await self.abort(q.request_id, internal=True)"),
          rs(f"{IMP}:377", "Coalesce bursts of auto-aborts into a single Abort message"),
          rs(f"{IMP}:385", "while abort_rx.recv_many(&mut batch, MAX_DRAIN).await > 0 {"),
          rs(f"{IMP}:406", "by_engine.entry(engine_id).or_default().push(request_id);"),
          note="python sends each cancelled stream's ABORT on its own (every generate() awaits "
               "its own abort, async_llm.py:809), so every frame holds one id; rust's "
               "run_abort_loop drains whatever is queued (recv_many, up to 1024) and sends one "
               "ABORT per engine (imp.rs:385-410). Batching saves engine round-trips in a "
               "disconnect storm; the engine accepts either (docs/abort-batching.md)"),
      needs=DROP, timeout=90)
async def burst_shares_frame(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(trickle(0.005))])])
    all_owners: dict[str, int] = {}
    per_burst: list[list[int]] = []
    for b in range(SHARE_BURSTS):
        handles, owners = await open_streams(ctx, group, SHARE_BURST_SIZE,
                                             offset=b * SHARE_BURST_SIZE)
        before = len(group.transcript.abort_frames())
        await ctx.driver.drop(handles)
        await settle_aborts(ctx, group, owners)
        all_owners.update(owners)
        per_burst.append([len(r.message.request_ids)
                          for r in group.transcript.abort_frames()[before:]])
    check_exactly_once(ctx, group, all_owners)
    ctx.note(f"ABORT frame sizes per burst {per_burst}")
    ctx.require(any(n >= 2 for burst in per_burst for n in burst),
                expected="some ABORT frame with >= 2 ids",
                observed=f"only 1-id frames; sizes per burst {per_burst}")
