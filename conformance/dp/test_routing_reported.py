"""DP routing by the load the engines report: other clients' requests the frontend learns of
from the DP coordinator's publications or from the scheduler_stats on engines' outputs.

vLLM 0.33.0: the Python DPLB client subscribes to the coordinator's stats publisher and
replaces its per-engine counts with each `[counts, wave, running]` publication
(core_client.py:1588-1598; score = max(inflight, waiting + running), :1786). vllm-rs
deliberately ignores the counts (coordinator/external.rs:31) and routes by its own in-flight
count and engines' scheduler_stats, so the rules on the coordinator's publications alone are
SHOULD: a port that reads only scheduler_stats, keeps the first publication, or stops
reading after an undecodable one routes by stale load. Load an engine reports only in the
scheduler_stats of its outputs counts for routing in vllm-rs; the Python client does not use
it (baselined), so that rule is SHOULD too.
"""

from __future__ import annotations

from conformance.dp.helpers import (
    CC,
    EXT,
    PINNED,
    PY_INFLIGHT,
    RS,
    RS_SCORE,
    RT,
    engine_of,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    Emit,
    EngineGroup,
    EngineScript,
    Level,
    both,
    by_prompt,
    case,
    differ,
    messages,
    prompt,
    py,
    recommendation,
    routed_engine,
    rs,
)

_PY_LB_COUNTS = py(f"{CC}:1598", "self.lb_engines = sliced_counts")
_RS_APPLY_STATS = rs("rust/src/engine-core-client/src/client/imp.rs:490",
                     "if !inner.apply_scheduler_stats(batch.engine_index, scheduler_stats) {")
NEEDS = [Capability.GENERATE]

# ----------------------------------------------------------------- load from both channels

REPORTED = both(
    _PY_LB_COUNTS,
    PY_INFLIGHT,
    py("vllm/v1/engine/coordinator.py:404", "stats[0] = scheduler_stats.num_waiting_reqs"),
    _RS_APPLY_STATS,
    rs(f"{RS}:326", "pub fn apply_scheduler_stats(&mut self, engine_index: u32"),
    RS_SCORE,
    note="the frontends take the engines' load from different channels: python from the "
         "coordinator's published counts (built from the engines' scheduler_stats), vllm-rs "
         "from the scheduler_stats on the output path; the case offers both")


@case("dp.routing.reported_load_{n}_engines", Level.MUST,
      "Load an engine reports (other clients' requests: coordinator counts and "
      "scheduler_stats {loads}) counts for routing: an unpinned request goes to "
      "engine {idle}, the idle one, although this client has nothing in flight.",
      grounds=REPORTED, needs=PINNED,
      params=[{"n": len(loads), "loads": loads, "idle": idle}
              for loads, idle in (([(0, 5), (0, 0)], 1), ([(2, 3), (0, 0), (0, 4)], 1))])
async def reported_load(ctx: CaseContext, loads: list[tuple[int, int]], idle: int) -> None:
    """Engines report load from elsewhere (coordinator counts and scheduler_stats); after
    one finished warm-up request per loaded engine, an unpinned request goes to `idle`."""
    scripts = [EngineScript(log_stats=True, reported_load=load) for load in loads]
    group = await ctx.start(scripts)
    for rank, load in enumerate(loads):
        if load != (0, 0):
            warm = await ctx.driver.generate(prompt(300 + rank), 2, data_parallel_rank=rank)
            await warm.wait(ctx.t(3))
    await ctx.quiet(0.3)  # stats-only messages and coordinator publications land
    p = prompt(399)
    handle = await ctx.driver.generate(p, 2)
    await handle.wait(ctx.t(3))
    at = engine_of(group, p)
    ctx.require(at == idle,
                expected=f"the unpinned request at engine {idle}, the only one without "
                         f"reported load (waiting, running per engine {loads})",
                observed=f"at engine {at}")


# ----------------------------------------------------------------- load in scheduler_stats

_RS_STATS = (
    _RS_APPLY_STATS,
    rs(f"{RS}:330", "waiting: stats.num_waiting_reqs as usize,"),
    rs(f"{RS}:331", "running: stats.num_running_reqs as usize,"),
    rs(f"{RS}:117", "self.last_scheduler_stats = Some(next);"),
    RS_SCORE,
)
STATS_LOAD = differ(
    py("vllm/v1/engine/async_llm.py:932", "scheduler_stats=outputs.scheduler_stats,"),
    py(f"{CC}:1768", "current_counts = self.lb_engines"),
    PY_INFLIGHT,
    *_RS_STATS,
    note="python routes by the coordinator's counts and its own in-flight count only; the "
         "scheduler_stats on the output path go to the stat loggers (async_llm.py:932); "
         "vllm-rs takes each engine's latest scheduler_stats as its routing load "
         "(imp.rs:490, state.rs:326-331)")
STATS_IDLE = both(
    py(f"{CC}:1785", "inflight = self.engine_inflight[self.core_engines[idx]]"),
    PY_INFLIGHT,
    *_RS_STATS,
    note="python holds it through its in-flight count alone (it ignores scheduler_stats for "
         "routing); vllm-rs replaces an engine's snapshot with its latest scheduler_stats, so "
         "an idle report of 0 / 0 scores 0")
STATS_LOADS = {
    "running_2_engines": [(0, 4), (0, 0)],
    "waiting_2_engines": [(4, 0), (0, 0)],
    "mixed_3_engines": [(3, 0), (0, 3), (0, 0)],
}


def _engine_with_add(group: EngineGroup, engines: int, p: list[int]) -> int | None:
    """The first engine whose transcript holds an ADD of this prompt."""
    return next((r for r in range(engines)
                 if any(a.prompt_token_ids == p for a in group.transcript.adds(r))), None)


@case("dp.routing.scheduler_stats_load_{name}", Level.SHOULD,
      "Load that engines report only in the scheduler_stats of their outputs ((waiting, "
      "running) {loads}; the DP coordinator publishes nothing meanwhile) should count for "
      "routing: an unpinned request goes to engine {idle}, the idle one.",
      grounds=STATS_LOAD, needs=PINNED,
      params=[{"name": name, "loads": loads, "idle": loads.index((0, 0))}
              for name, loads in STATS_LOADS.items()])
async def scheduler_stats_load(ctx: CaseContext, loads: list[tuple[int, int]],
                               idle: int) -> None:
    group = await ctx.start([EngineScript(log_stats=True, reported_load=load,
                                          load_in_stats_only=True) for load in loads])
    if group.coordinator is not None:  # silent: the load is only in scheduler_stats
        group.coordinator.publishing = False
    for rank in range(len(loads)):  # one finished request each: stats on every path
        warm = await ctx.driver.generate(prompt(300 + rank), 2, data_parallel_rank=rank)
        await warm.wait(ctx.t(3))
    await ctx.quiet(0.3)  # the stats-only messages after each engine went idle land
    p = prompt(399)
    handle = await ctx.driver.generate(p, 2)
    await handle.wait(ctx.t(3))
    found = _engine_with_add(group, len(loads), p)
    ctx.require(found == idle, expected=f"the unpinned request at engine {idle}",
                observed=f"at engine {found}")


@case("dp.routing.scheduler_stats_idle_report_counts_zero", Level.MUST,
      "An engine whose latest scheduler_stats (the stats-only message it sends once idle) "
      "report 0 waiting and 0 running counts as idle: an unpinned request goes there, not "
      "to the engine with one of this client's requests in flight (the DP coordinator "
      "publishes nothing meanwhile).", grounds=STATS_IDLE, needs=PINNED)
async def stats_idle_report_counts_zero(ctx: CaseContext) -> None:
    # Engine 1 reports stats (log_stats); engine 0 does not and holds one request.
    group = await ctx.start([EngineScript(rules=[by_prompt(prompt(310), [Emit([100])])],
                                          report_finished=True),
                             EngineScript(log_stats=True, report_finished=True)])
    if group.coordinator is not None:
        group.coordinator.publishing = False
    busy = await ctx.driver.generate(prompt(310), 50, data_parallel_rank=0)
    warm = await ctx.driver.generate(prompt(311), 2, data_parallel_rank=1)
    await busy.wait_first(ctx.t(3))
    await warm.wait(ctx.t(3))
    await ctx.quiet(0.3)  # engine 1's stats-only message after it went idle lands
    p = prompt(399)
    handle = await ctx.driver.generate(p, 2)
    await handle.wait(ctx.t(3))
    found = _engine_with_add(group, 2, p)
    ctx.require(found == 1, expected="the unpinned request at engine 1 (reported 0 waiting, "
                                     "0 running; engine 0 has 1 in flight)",
                observed=f"at engine {found}")


# ----------------------------------------------------------------- the coordinator's counts

# Python routes by the coordinator's published counts; Rust deliberately ignores them.
_PY_COUNTS = (
    _PY_LB_COUNTS,
    py(f"{CC}:1768", "current_counts = self.lb_engines"),
    PY_INFLIGHT,
)
_RS_IGNORES = (
    rs(f"{EXT}:31", "wire compatibility but intentionally ignores it for routing decisions."),
    rs(f"{RT}:3332",
       "fn bootstrapped_external_coordinator_updates_wave_ignores_counts_and_sends_no_wakeup()"),
)
COUNTS_ONLY = differ(
    *_PY_COUNTS, *_RS_IGNORES,
    py("vllm/v1/engine/coordinator.py:288",
       "publish_front.send(msgspec.msgpack.encode(to_publish))"),
    note="python routes unpinned requests by the coordinator's (waiting, running) counts "
         "(core_client.py:1598, 1786); vllm-rs keeps the counts only for wire compatibility and "
         "routes by its in-flight count and engines' scheduler_stats (external.rs:31)")
LATEST = differ(
    py(f"{CC}:1583", "buf = future.result()"),
    *_PY_COUNTS, *_RS_IGNORES,
    note="python drains the stats socket and replaces its counts with the newest publication "
         "(core_client.py:1580-1598); vllm-rs ignores the counts (external.rs:31)")
WIDER = differ(
    py(f"{CC}:1596", "count_slice = slice(ranks[0], ranks[-1] + 1)"),
    py(f"{CC}:1597", "sliced_counts = counts[count_slice]"),
    *_PY_COUNTS,
    rs(f"{EXT}:32", "counts: OpaqueValue,"),
    *_RS_IGNORES,
    note="python slices the published counts to the ranks it manages (core_client.py:1596) "
         "and routes by them; vllm-rs decodes counts of any width as an opaque value and "
         "ignores them (external.rs:31-32)")
UNDECODABLE = recommendation(
    py(f"{CC}:1588", "counts, wave, running = msgspec.msgpack.decode(buf)"),
    rs(f"{EXT}:65", "let update: CoordinatorStateUpdate = decode_msgpack(&frames[0])?;"),
    rs(f"{EXT}:99", "inner.close_registries(Arc::new(error));"),
    note="neither 0.33.0 frontend skips an undecodable publication: python's stats task dies "
         "on the bare decode (core_client.py:1588) and routing freezes on the last counts; "
         "vllm-rs's coordinator service exits and closes every stream (external.rs:65, 99). "
         "corewire advises skipping the bad publication and reading on")


@case("dp.edges.coordinator_load_only_{n}_engines_idle_{idle}", Level.SHOULD,
      "Load published only by the DP coordinator (counts {loads}, no "
      "scheduler_stats) should count for routing: an unpinned request goes to "
      "engine {idle}, the idle one (Python routes by the counts; Rust ignores "
      "them, coordinator/external.rs:31).", grounds=COUNTS_ONLY, needs=NEEDS,
      params=[{"n": len(loads), "loads": loads, "idle": idle}
              for loads, idle in (([(0, 5), (0, 0)], 1), ([(2, 3), (0, 0), (0, 4)], 1),
                                  ([(0, 3), (1, 1), (0, 0)], 2))])
async def coordinator_load_only(ctx: CaseContext, n: int, loads: list[tuple[int, int]],
                                idle: int) -> None:
    group = await ctx.start([EngineScript(reported_load=load) for load in loads])
    await ctx.quiet(0.4)  # several publications land
    at = await routed_engine(ctx, group, 500 + n)
    ctx.require(at == idle, expected=f"the request at engine {idle} (published "
                                     f"load {loads})", observed=f"at engine {at}")


@case("dp.edges.load_{name}", Level.SHOULD,
      "When the published load moves from engine 0 to engine 1 (counts "
      "[(0,5),(0,0)] then [(0,0),(0,5)]){between} the next unpinned request goes to "
      "engine 0: the newest publication counts{why}", needs=NEEDS,
      params=[{"name": "follows_latest_publication", "garbage": False, "between": "",
               "why": " (Python replaces its counts per publication; Rust ignores counts).",
               "grounds": LATEST},
              {"name": "after_undecodable_publication", "garbage": True,
               "between": ", with an undecodable publication in between,",
               "why": " and the frontend keeps reading after skipping the bad one (Python's "
                      "stats task dies on it, core_client.py:1588; vllm-rs stops serving).",
               "grounds": UNDECODABLE}])
async def load_moved(ctx: CaseContext, garbage: bool) -> None:
    group = await ctx.start([EngineScript(reported_load=(0, 5)),
                             EngineScript(reported_load=(0, 0))])
    await ctx.quiet(0.4)
    first = await routed_engine(ctx, group, 520)
    ctx.require(first == 1, expected="first the request at engine 1 (engine 0 "
                                     "busy)", observed=f"at engine {first}")
    if garbage:
        # The bad publication stays the newest for 0.3 s (regular ones paused): a
        # frontend that reads only the latest of a burst (Python drains, then
        # decodes once) still meets it, whenever its reader runs.
        assert group.coordinator is not None
        group.coordinator.publishing = False
        group.coordinator.inject.append(b"\xc1not msgpack")
        await ctx.quiet(0.3)
        group.coordinator.publishing = True
    group.engines[0].script.reported_load = (0, 0)
    group.engines[1].script.reported_load = (0, 5)
    await ctx.quiet(0.4)
    second = await routed_engine(ctx, group, 521)
    # Without load information a rotating tie-break would pick 0 first, then 1:
    # the expected engines are the opposite, so only the published load explains them.
    ctx.require(second == 0, expected="then the request at engine 0 (load moved "
                                      "to engine 1)", observed=f"at engine {second}")


@case("dp.edges.load_after_wider_publication", Level.SHOULD,
      "A publication with counts for more DP ranks than this frontend's 2 engines (a third "
      "triple) uses the engines' own ranks (Python slices counts by its managed ranks, "
      "core_client.py:1592-1596) and the frontend keeps reading: when the load then moves "
      "from engine 0 to engine 1, the next unpinned request goes to engine 0.",
      grounds=WIDER, needs=NEEDS)
async def wider_publication(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(reported_load=(0, 5)),
                             EngineScript(reported_load=(0, 0))])
    await ctx.quiet(0.4)
    first = await routed_engine(ctx, group, 530)
    ctx.require(first == 1, expected="first the request at engine 1 (engine 0 busy)",
                observed=f"at engine {first}")
    assert group.coordinator is not None
    group.coordinator.inject.append(group.codec.encode_dp_stats(messages.DPStatsUpdate(
        [(0, 5, 0.0), (0, 0, 0.0), (7, 7, 0.0)], 0, True)))
    await ctx.quiet(0.3)
    group.engines[0].script.reported_load = (0, 0)
    group.engines[1].script.reported_load = (0, 5)
    await ctx.quiet(0.4)
    second = await routed_engine(ctx, group, 531)
    ctx.require(second == 0, expected="then the request at engine 0 (load moved to engine 1)",
                observed=f"at engine {second}")
