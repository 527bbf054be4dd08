"""DP routing from what the frontend itself knows: its own slots, its pins, engines' stats.

A request that ends frees exactly its own routing slot, whichever way it ended.

A DP frontend routes an unpinned request to the engine with the least work: its own
in-flight count per engine (vllm-rs `EngineRoutingState.inflight`; vLLM's Python DPLB
`engine_inflight`, decremented through finished_requests). Port authors release that slot
on one path and forget another (an explicit abort, an engine ERROR, a stop string the
frontend ended), or release too much (reset the count when one request ends, decrement
twice). Either way later requests pile onto a busy engine. These cases end requests on
one engine in each way and then probe the routing twice: once where the busy engine must
still count its remaining requests, once where it must no longer count the ended ones.
The DP coordinator's snapshot shows no load (as a stale one does), so nothing but the
frontend's own count can steer the routing.

Also here: an ADD pinned to a rank carries that rank (both frontends stamp it, though no
0.33.0 engine or coordinator reads the field, so SHOULD), and load an engine reports only in
the scheduler_stats of its outputs counts for routing (vllm-rs does; the Python client does
not, baselined).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, differ, engine, py, rs
from harness.cases.helpers import hold, prompt, request_for
from harness.frontends.api import Capability, StreamHandle
from harness.protocol.wire import messages as m
from harness.results.records import Level
from mock_engines.group import EngineGroup
from mock_engines.script import Emit, EngineScript, Finish, Rule, any_request, by_prompt

F = m.FinishReason
CC = "vllm/v1/engine/core_client.py"
RS = "rust/src/engine-core-client/src/client/state.rs"
_PY_SCORE = py(f"{CC}:1786",
               "score: float = max(self.client_count * inflight, waiting + running)")
_RS_SCORE = rs(f"{RS}:92", "self.inflight.max(stats.running + stats.waiting")
# A request that ends, however it ends, releases exactly its own in-flight slot.
SLOT = both(
    py(f"{CC}:1824", "if (engine := self.reqs_in_flight.pop(req_id, None)) is not None:"),
    py(f"{CC}:1825", "self.engine_inflight[engine] -= 1"),
    _PY_SCORE,
    rs(f"{RS}:253", "match self.remove(output.request_id.as_str()) {"),
    rs(f"{RS}:360", "let Some((mut sender, engine_id)) = self.remove(request_id) else {"),
    rs(f"{RS}:383", "let tracked = self.requests.remove(request_id)?;"),
    rs(f"{RS}:108", "self.inflight -= 1;"),
    _RS_SCORE,
    engine("vllm/v1/core/sched/scheduler.py:3056",
           "self.finished_req_ids_dict[request.client_index].add(request_id)"),
)
PINNED = [Capability.GENERATE, Capability.DP_RANK]
ENDING = [prompt(700 + i) for i in range(2)]  # two requests on engine 0 that end
STOP = " t101"


@dataclass(frozen=True)
class EndKind:
    """One way the two ending requests end, and what the case needs for it."""

    name: str
    text: str
    rules: Callable[[], list[Rule]]
    end: Callable[[CaseContext, EngineGroup, list[StreamHandle]], Awaitable[None]]
    needs: tuple[Capability, ...] = ()
    stop: tuple[str, ...] = ()


async def _engine_ends(ctx: CaseContext, group: EngineGroup, handles: list[StreamHandle]
                       ) -> None:
    """Nothing to do: the engine ends them by script."""


async def _explicit_abort(ctx: CaseContext, group: EngineGroup, handles: list[StreamHandle]
                          ) -> None:
    found = [request_for(group, p) for p in ENDING]
    await ctx.driver.abort([f[1] for f in found if f is not None])


async def _drop(ctx: CaseContext, group: EngineGroup, handles: list[StreamHandle]) -> None:
    await ctx.driver.drop(handles)


def _finish_rules(*steps: Emit | Finish) -> Callable[[], list[Rule]]:
    return lambda: [by_prompt(p, list(steps)) for p in ENDING]


def _held_rules() -> list[Rule]:
    return [by_prompt(p, hold()) for p in ENDING]


KINDS = [
    EndKind("length", "finish with LENGTH", _finish_rules(Emit([100]), Finish(F.LENGTH,
            [101], 0.03)), _engine_ends),
    EndKind("engine_error", "end with an engine ERROR", _finish_rules(Emit([100]), Finish(
            F.ERROR, delay=0.03)), _engine_ends, (Capability.REQUEST_ERRORS,)),
    EndKind("engine_abort", "end with an engine-side ABORT", _finish_rules(Emit([100]), Finish(
            F.ABORT, delay=0.03)), _engine_ends),
    EndKind("repetition", "end with a REPETITION finish", _finish_rules(Emit([100]), Finish(
            F.REPETITION, [101], 0.03, stop_reason="repetition_detected")), _engine_ends),
    EndKind("stop_string", f"end at the stop string {STOP!r} (the frontend ends them and "
            "aborts them at the engine)", _finish_rules(Emit([100]), Emit([101], 0.03)),
            _engine_ends, (Capability.STOP_STRINGS,), (STOP,)),
    EndKind("explicit_abort", "are aborted explicitly", _held_rules, _explicit_abort,
            (Capability.ABORT,)),
    EndKind("drop", "are dropped by the client", _held_rules, _drop, (Capability.DROP,)),
]


async def _route(ctx: CaseContext, group: EngineGroup, p: list[int]) -> int | None:
    handle = await ctx.driver.generate(p, 50)
    await handle.wait_first(ctx.t(3))
    found = request_for(group, p)
    return found[0] if found else None


def _make_slot_case(kind: EndKind) -> None:
    @case(f"dp.routing.ended_frees_one_slot_{kind.name}", Level.MUST,
          f"With 2 engines (the DP coordinator's snapshot showing no load), 3 requests held "
          f"on engine 0 and 2 on engine 1, two more on engine "
          f"0 that {kind.text} free exactly their own slots: the next unpinned request goes "
          "to engine 1 (3 vs 2 in flight); after one more is pinned to engine 1 (3 vs 4), "
          "the next goes to engine 0.", grounds=SLOT, needs=[*PINNED, *kind.needs])
    async def run(ctx: CaseContext) -> None:
        rules = [*kind.rules(), any_request(hold())]
        # report_finished: real DP engines list finished and aborted ids, which the Python
        # DPLB needs to release a slot.
        group = await ctx.start([EngineScript(rules=list(rules), report_finished=True)
                                 for _ in range(2)])
        if group.coordinator is not None:  # a stale snapshot: no load from elsewhere
            group.coordinator.counts_override = [(0, 0), (0, 0)]
        held = [await ctx.driver.generate(prompt(600 + i), 50, data_parallel_rank=rank)
                for i, rank in enumerate((0, 0, 0, 1, 1))]
        ending = [await ctx.driver.generate(p, 50, data_parallel_rank=0,
                                            stop=list(kind.stop) or None) for p in ENDING]
        for h in [*held, *ending]:
            await h.wait_first(ctx.t(3))
        await kind.end(ctx, group, ending)
        ended = await ctx.wait_until(lambda: all(h.ended for h in ending), 3)
        ctx.require(ended, expected=f"both requests on engine 0 {kind.text}",
                    observed=[(h.finish_reason, h.error) for h in ending])
        await ctx.quiet(0.3)  # aborts and finished ids land
        first = await _route(ctx, group, prompt(650))
        ctx.require(first == 1, expected="the first unpinned request at engine 1 (in "
                                         "flight: engine 0 3, engine 1 2)",
                    observed=f"at engine {first}")
        extra = await ctx.driver.generate(prompt(651), 50, data_parallel_rank=1)
        await extra.wait_first(ctx.t(3))
        await ctx.quiet(0.3)
        second = await _route(ctx, group, prompt(652))
        ctx.require(second == 0, expected="the second unpinned request at engine 0 (in "
                                          "flight: engine 0 3, engine 1 4)",
                    observed=f"at engine {second}")

    run.__name__ = run.__qualname__ = f"ended_frees_one_slot_{kind.name}"
    globals()[run.__name__] = run


for _kind in KINDS:
    _make_slot_case(_kind)


# ----------------------------------------------------------------- pinned ADDs


def _make_pinned_rank_stamped(engines: int) -> None:
    @case(f"dp.routing.pinned_rank_on_add_{engines}_engines", Level.SHOULD,
          f"With {engines} engines, an ADD pinned with data_parallel_rank r should carry r in "
          "its data_parallel_rank field; an unpinned ADD carries none.",
          grounds=both(
              py("vllm/v1/engine/input_processor.py:550",
                 "data_parallel_rank=data_parallel_rank,"),
              py("vllm/v1/engine/__init__.py:127", "data_parallel_rank: int | None"),
              rs("rust/src/text/src/lower.rs:73",
                 "data_parallel_rank: request.data_parallel_rank,"),
              rs("rust/src/engine-core-client/src/protocol/request.rs:91",
                 "pub data_parallel_rank: Option<u32>,"),
              note="both frontends stamp the pin on the ADD, but no 0.33.0 engine or "
                   "coordinator reads EngineCoreRequest.data_parallel_rank (only the python "
                   "client's own routing does, core_client.py:1763, before sending), so a "
                   "port that omits it breaks nothing: SHOULD"),
          needs=[Capability.GENERATE, Capability.DP_RANK])
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start([EngineScript() for _ in range(engines)])
        pinned = {tuple(prompt(r)): r for r in reversed(range(engines))}
        free = prompt(99)
        handles = [await ctx.driver.generate(list(p), 2, data_parallel_rank=r)
                   for p, r in pinned.items()]
        handles.append(await ctx.driver.generate(free, 2))
        for h in handles:
            await h.wait(ctx.t(3))
        by_prompt_ = {tuple(r.prompt_token_ids or []): r.data_parallel_rank
                      for r in group.transcript.adds()}
        got = {p: by_prompt_.get(p, "no ADD") for p in pinned}
        ctx.require(got == pinned, expected=f"data_parallel_rank on the pinned ADDs {pinned}",
                    observed=got)
        ctx.require(by_prompt_.get(tuple(free), "no ADD") is None,
                    expected="no data_parallel_rank on the unpinned ADD",
                    observed=by_prompt_.get(tuple(free), "no ADD"))

    run.__name__ = run.__qualname__ = f"pinned_rank_on_add_{engines}"
    globals()[run.__name__] = run


for _n in (2, 3):
    _make_pinned_rank_stamped(_n)


# ----------------------------------------------------------------- load in scheduler_stats

_RS_STATS = (
    rs("rust/src/engine-core-client/src/client/imp.rs:490",
       "if !inner.apply_scheduler_stats(batch.engine_index, scheduler_stats) {"),
    rs(f"{RS}:330", "waiting: stats.num_waiting_reqs as usize,"),
    rs(f"{RS}:331", "running: stats.num_running_reqs as usize,"),
    rs(f"{RS}:117", "self.last_scheduler_stats = Some(next);"),
    _RS_SCORE,
)
STATS_LOAD = differ(
    py("vllm/v1/engine/async_llm.py:932", "scheduler_stats=outputs.scheduler_stats,"),
    py(f"{CC}:1768", "current_counts = self.lb_engines"),
    _PY_SCORE,
    *_RS_STATS,
    note="python routes by the coordinator's counts and its own in-flight count only; the "
         "scheduler_stats on the output path go to the stat loggers (async_llm.py:932); "
         "vllm-rs takes each engine's latest scheduler_stats as its routing load "
         "(imp.rs:490, state.rs:326-331)")
STATS_IDLE = both(
    py(f"{CC}:1785", "inflight = self.engine_inflight[self.core_engines[idx]]"),
    _PY_SCORE,
    *_RS_STATS,
    note="python holds it through its in-flight count alone (it ignores scheduler_stats for "
         "routing); vllm-rs replaces an engine's snapshot with its latest scheduler_stats, so "
         "an idle report of 0 / 0 scores 0")
STATS_LOADS = {
    "running_2_engines": [(0, 4), (0, 0)],
    "waiting_2_engines": [(4, 0), (0, 0)],
    "mixed_3_engines": [(3, 0), (0, 3), (0, 0)],
}


def _make_stats_only_load(name: str, loads: list[tuple[int, int]]) -> None:
    idle = loads.index((0, 0))

    @case(f"dp.routing.scheduler_stats_load_{name}", Level.SHOULD,
          f"Load that engines report only in the scheduler_stats of their outputs ((waiting, "
          f"running) {loads}; the DP coordinator publishes nothing meanwhile) should count for "
          f"routing: an unpinned request goes to engine {idle}, the idle one.",
          grounds=STATS_LOAD, needs=[Capability.GENERATE, Capability.DP_RANK])
    async def run(ctx: CaseContext) -> None:
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
        found = next((r for r in range(len(loads))
                      if any(a.prompt_token_ids == p for a in group.transcript.adds(r))),
                     None)
        ctx.require(found == idle, expected=f"the unpinned request at engine {idle}",
                    observed=f"at engine {found}")

    run.__name__ = run.__qualname__ = f"stats_only_load_{name}"
    globals()[run.__name__] = run


for _name, _loads in STATS_LOADS.items():
    _make_stats_only_load(_name, _loads)


@case("dp.routing.scheduler_stats_idle_report_counts_zero", Level.MUST,
      "An engine whose latest scheduler_stats (the stats-only message it sends once idle) "
      "report 0 waiting and 0 running counts as idle: an unpinned request goes there, not "
      "to the engine with one of this client's requests in flight (the DP coordinator "
      "publishes nothing meanwhile).", grounds=STATS_IDLE,
      needs=[Capability.GENERATE, Capability.DP_RANK])
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
    found = next((r for r in range(2)
                  if any(a.prompt_token_ids == p for a in group.transcript.adds(r))), None)
    ctx.require(found == 1, expected="the unpinned request at engine 1 (reported 0 waiting, "
                                     "0 running; engine 0 has 1 in flight)",
                observed=f"at engine {found}")
