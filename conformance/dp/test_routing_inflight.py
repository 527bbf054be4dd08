"""DP routing of unpinned requests by the frontend's own in-flight count: spreading, the
least loaded engine, requests that end freeing exactly their own slot, and ties.

Both 0.33.0 frontends route unpinned requests to the engine with the fewest in-flight
requests (Python DPLB `core_client.py:1786` floors the score at its own in-flight count;
Rust `client/state.rs:87-92` routing_score likewise). A request counts on its engine at once,
and a stale coordinator snapshot cannot erase it.

A request that ends frees exactly its own routing slot, whichever way it ended. Port authors
release that slot on one path and forget another (an explicit abort, an engine ERROR, a stop
string the frontend ended), or release too much (reset the count when one request ends,
decrement twice). Either way later requests pile onto a busy engine. Those cases end
requests on one engine in each way and then probe the routing twice: once where the busy
engine must still count its remaining requests, once where it must no longer count the
ended ones. The DP coordinator's snapshot shows no load (as a stale one does), so nothing
but the frontend's own count can steer the routing.

A tie between equally loaded engines differs, SHOULD: Python rotates where its scan starts
(PR #47420); vllm-rs always takes the lowest engine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from conformance.dp.helpers import (
    CC,
    PINNED,
    PY_INFLIGHT,
    RS,
    RS_MIN,
    RS_SCORE,
    RT,
    SCHED,
    engine_of,
    holding_engines,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    Emit,
    EngineGroup,
    EngineScript,
    Finish,
    Level,
    Rule,
    StreamHandle,
    any_request,
    both,
    by_prompt,
    case,
    differ,
    engine,
    hold,
    messages,
    prompt,
    py,
    request_for,
    requests_for,
    rs,
)

F = messages.FinishReason
# Unpinned requests go to the engine with the fewest of this client's requests in flight.
LB = both(
    py(f"{CC}:1785", "inflight = self.engine_inflight[self.core_engines[idx]]"),
    PY_INFLIGHT,
    py(f"{CC}:1811", "self.engine_inflight[chosen_engine] += 1"),
    rs(f"{RS}:89", "return self.inflight;"),
    RS_SCORE, RS_MIN,
    rs(f"{RT}:1988", "fn multi_engine_client_shares_transport_and_routes_by_inflight_count()"),
)


@case("dp.routing.spread", Level.MUST,
      "Without an explicit rank, concurrent requests are spread over the engines.",
      grounds=both(
          PY_INFLIGHT,
          py(f"{CC}:1811", "self.engine_inflight[chosen_engine] += 1"),
          RS_SCORE,
          rs(f"{RS}:97", "self.inflight += 1;"),
          RS_MIN,
      ), needs=[Capability.GENERATE])
async def routing_spread(ctx: CaseContext) -> None:
    group = await ctx.start(holding_engines(2))
    prompts = [prompt(i) for i in range(6)]
    handles = [await ctx.driver.generate(p, 50) for p in prompts]
    for h in handles:
        await h.wait_first(ctx.t(3))
    owners = requests_for(group, prompts) or {}
    per_engine = [list(owners.values()).count(r) for r in (0, 1)]
    ctx.note(f"requests per engine: {per_engine}")
    ctx.require(min(per_engine) >= 2, expected="each engine gets at least 2 of 6",
                observed=per_engine)


@case("dp.routing.least_loaded_{n}_engines_idle_{free}", Level.MUST,
      "With {n} engines of which only engine {free} has nothing in flight, an "
      "unpinned request goes to engine {free}.", grounds=LB, needs=PINNED,
      params=[{"n": n, "free": free} for n, free in ((2, 1), (3, 1), (4, 2), (4, 3))])
async def least_loaded(ctx: CaseContext, n: int, free: int) -> None:
    """Two held requests on every engine but `free`: the next unpinned one goes to `free`."""
    group = await ctx.start(holding_engines(n))
    held: list[StreamHandle] = []
    for rank in range(n):
        if rank == free:
            continue
        for k in range(2):
            h = await ctx.driver.generate(prompt(100 + 10 * rank + k), 50,
                                          data_parallel_rank=rank)
            held.append(h)
    for h in held:
        await h.wait_first(ctx.t(3))
    await ctx.quiet(0.3)  # a coordinator publication (every 0.1 s) reflects the load
    p = prompt(900)
    handle = await ctx.driver.generate(p, 50)
    await handle.wait_first(ctx.t(3))
    at = engine_of(group, p)
    loads = {r: (0 if r == free else 2) for r in range(n)}
    ctx.require(at == free,
                expected=f"the unpinned request at engine {free}, the only idle one "
                         f"(in-flight per engine {loads})",
                observed=f"at engine {at}")


@case("dp.routing.finished_requests_free_capacity", Level.MUST,
      "Requests that finished no longer count as in flight: after three requests on engine "
      "0 finish while two stay open on engine 1, the next unpinned request goes to engine 0.",
      grounds=both(
          py(f"{CC}:1822", "if outputs.finished_requests and self.reqs_in_flight:"),
          py(f"{CC}:1825", "self.engine_inflight[engine] -= 1"),
          PY_INFLIGHT,
          rs(f"{RS}:252", "if output.finished() {"),
          rs(f"{RS}:253", "match self.remove(output.request_id.as_str()) {"),
          rs(f"{RS}:108", "self.inflight -= 1;"),
          rs(f"{RS}:1102",
             "fn registry_finished_requests_do_not_route_live_work_to_a_busier_engine()"),
          engine(f"{SCHED}:2653", "eco.finished_requests = finished_set"),
      ), needs=PINNED)
async def finished_free_capacity(ctx: CaseContext) -> None:
    short = [prompt(200 + i) for i in range(3)]
    rules = [*(by_prompt(p, [Emit([100]), Finish(tokens=[101], delay=0.05)]) for p in short),
             any_request(hold())]
    # report_finished: real DP engines list finished ids, which the Python DPLB relies on.
    group = await ctx.start([EngineScript(rules=list(rules), report_finished=True)
                             for _ in range(2)])
    open_ = [await ctx.driver.generate(prompt(210 + i), 50, data_parallel_rank=1)
             for i in range(2)]
    done = [await ctx.driver.generate(p, 50, data_parallel_rank=0) for p in short]
    for h in done:
        await h.wait(ctx.t(3))
    for h in open_:
        await h.wait_first(ctx.t(3))
    await ctx.quiet(0.3)
    p = prompt(299)
    handle = await ctx.driver.generate(p, 50)
    await handle.wait_first(ctx.t(3))
    at = engine_of(group, p)
    ctx.require(at == 0,
                expected="the unpinned request at engine 0 (0 in flight vs 2 on engine 1)",
                observed=f"at engine {at}")


# A routed request counts on its engine at once, before any output or coordinator update.
COUNTED_AT_ONCE = both(
    py(f"{CC}:1811", "self.engine_inflight[chosen_engine] += 1"),
    PY_INFLIGHT,
    rs(f"{RS}:97", "self.inflight += 1;"),
    rs(f"{RS}:173", "let engine_id = self.choose_engine_for_request(data_parallel_rank)?;"),
    RS_SCORE,
)


@case("dp.routing.least_loaded_burst", Level.MUST,
      "Requests just sent count at once: two pinned to engine 0 and two to engine 2, then "
      "immediately an unpinned one (no output or coordinator update in between) goes to "
      "engine 1.",
      grounds=COUNTED_AT_ONCE, needs=PINNED)
async def least_loaded_burst(ctx: CaseContext) -> None:
    group = await ctx.start(holding_engines(3))
    for i, rank in enumerate((0, 2, 0, 2)):
        await ctx.driver.generate(prompt(600 + i), 50, data_parallel_rank=rank)
    p = prompt(699)
    handle = await ctx.driver.generate(p, 50)
    await handle.wait_first(ctx.t(3))
    at = engine_of(group, p)
    ctx.require(at == 1,
                expected="the unpinned request at engine 1 (in flight: 2, 0, 2)",
                observed=f"at engine {at}")


@case("dp.routing.least_loaded_4_engines_two_idle", Level.MUST,
      "With 4 engines holding 2, 1, 0 and 0 requests in flight (pinned), two unpinned "
      "requests sent back to back (no output or coordinator update in between) go one to "
      "engine 2 and one to engine 3, none to engines 0 and 1.",
      grounds=COUNTED_AT_ONCE, needs=PINNED)
async def least_loaded_two_idle(ctx: CaseContext) -> None:
    group = await ctx.start(holding_engines(4))
    for i, rank in enumerate((0, 0, 1)):
        await ctx.driver.generate(prompt(620 + i), 50, data_parallel_rank=rank)
    unpinned = [prompt(690), prompt(691)]
    handles = [await ctx.driver.generate(p, 50) for p in unpinned]
    for h in handles:
        await h.wait_first(ctx.t(3))
    ranks = sorted(found[0] if (found := request_for(group, p)) else -1 for p in unpinned)
    ctx.require(ranks == [2, 3],
                expected="one unpinned request at engine 2 and one at engine 3 (in flight: "
                         "2, 1, 0, 0)",
                observed=f"at engines {ranks}")


@case("dp.routing.burst_even_despite_stale_snapshot", Level.MUST,
      "With 2 requests pinned to engine 0 still in flight, a stale all-idle coordinator "
      "snapshot does not erase them: the 6 unpinned requests sent next go 2 to each of "
      "engines 1-3, none to engine 0 (the frontend's own in-flight count is a floor under "
      "the snapshot's load: Python max(inflight, waiting + running), Rust likewise).",
      grounds=both(
          py(f"{CC}:1781", "in-flight floor is exact and can't be erased by a snapshot"),
          PY_INFLIGHT,
          RS_SCORE,
          rs(f"{RS}:913", "fn routing_score_uses_inflight_as_scheduler_stats_lower_bound()"),
          rs("rust/src/engine-core-client/src/coordinator/external.rs:31",
             "intentionally ignores it for routing decisions."),
      ), needs=PINNED)
async def burst_even_despite_stale_snapshot(ctx: CaseContext) -> None:
    group = await ctx.start(holding_engines(4))
    coordinator = group.coordinator
    assert coordinator is not None, "a DP group of 4 has a mock coordinator"
    coordinator.publishing = False  # from now on only the one stale snapshot below
    await ctx.quiet(0.15)  # a regular publication already on its way lands first
    for i in range(2):
        await (await ctx.driver.generate(prompt(800 + i), 50, data_parallel_rank=0)
               ).wait_first(ctx.t(3))
    before = len(coordinator.transcript.select(direction="out"))
    coordinator.inject.append(group.codec.encode_dp_stats(
        messages.DPStatsUpdate([(0, 0, 0.0)] * 4, coordinator.wave, False)))
    stale = await ctx.wait_until(
        lambda: len(coordinator.transcript.select(direction="out")) > before, 2)
    ctx.require(stale, expected="a stale all-idle publication after the pinned requests",
                observed="none within 2 s (harness fault)")
    await ctx.quiet(0.1)  # the frontend reads it
    prompts = [prompt(810 + i) for i in range(6)]
    for p in prompts:
        await (await ctx.driver.generate(p, 50)).wait_first(ctx.t(3))
    owners = requests_for(group, prompts) or {}
    per_engine = [list(owners.values()).count(r) for r in range(4)]
    ctx.require(len(owners) == 6 and per_engine == [0, 2, 2, 2],
                expected="the 6 unpinned requests 0 / 2 / 2 / 2 over engines 0-3",
                observed=per_engine)


# ----------------------------------------------------------------- a request's own slot

# A request that ends, however it ends, releases exactly its own in-flight slot.
SLOT = both(
    py(f"{CC}:1824", "if (engine := self.reqs_in_flight.pop(req_id, None)) is not None:"),
    py(f"{CC}:1825", "self.engine_inflight[engine] -= 1"),
    PY_INFLIGHT,
    rs(f"{RS}:253", "match self.remove(output.request_id.as_str()) {"),
    rs(f"{RS}:360", "let Some((mut sender, engine_id)) = self.remove(request_id) else {"),
    rs(f"{RS}:383", "let tracked = self.requests.remove(request_id)?;"),
    rs(f"{RS}:108", "self.inflight -= 1;"),
    RS_SCORE,
    engine("vllm/v1/core/sched/scheduler.py:3056",
           "self.finished_req_ids_dict[request.client_index].add(request_id)"),
)
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
    return engine_of(group, p)


@case("dp.routing.ended_frees_one_slot_{kind.name}", Level.MUST,
      "With 2 engines (the DP coordinator's snapshot showing no load), 3 requests held "
      "on engine 0 and 2 on engine 1, two more on engine "
      "0 that {kind.text} free exactly their own slots: the next unpinned request goes "
      "to engine 1 (3 vs 2 in flight); after one more is pinned to engine 1 (3 vs 4), "
      "the next goes to engine 0.", grounds=SLOT,
      params=[{"kind": kind, "needs": [*PINNED, *kind.needs]} for kind in KINDS])
async def ended_frees_one_slot(ctx: CaseContext, kind: EndKind) -> None:
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


# ----------------------------------------------------------------- ties between engines

# Python rotates where its least-loaded scan starts (PR #47420), so equal scores go round;
# vllm-rs takes the first minimum of a BTreeMap, so every tie goes to the lowest engine.
TIE = differ(
    py(f"{CC}:1776", "idx = (self.eng_start_index + i) % num_engines"),
    py(f"{CC}:1801", "# Rotate the scan start so that ties (equal scores, e.g. right"),
    py(f"{CC}:1806", "self.eng_start_index = (self.eng_start_index + 1) % num_engines"),
    rs(f"{RS}:137", "routing_per_engine: BTreeMap<EngineId, EngineRoutingState>,"),
    RS_MIN,
    rs(f"{RS}:1007",
       "fn registry_preserves_tie_order_across_finished_requests_and_stats_refreshes() {"),
    rs(f"{RS}:1029", 'expect_test::expect!["[2, 2, 2, 2, 2, 2]"]'),
    note="python rotates the start of its least-loaded scan after every unpinned request "
         "(core_client.py:1776, 1801-1806, PR #47420 'avoid systematic engine bias'), so "
         "equally loaded engines take turns; vllm-rs keeps its engines in a BTreeMap and "
         "takes min_by_key, the first minimum (state.rs:137, 219), so a tie always goes to "
         "the lowest engine id, which its test expects (state.rs:1007-1029: [2, 2, 2, 2, 2, "
         "2]). The bias is an imbalance, not a hang or lost data: SHOULD")


def _tie_setting(n: int, busy: int | None) -> dict[str, object]:
    """One ties_rotate case: `n` engines, engine `busy` (if any) holding one request."""
    return {"n": n, "busy": busy,
            "label": f"{n}_engines" + (f"_{busy}_busy" if busy is not None else ""),
            "setting": (f"engine {busy} holds one request and the others are idle"
                        if busy is not None else "every engine is idle"),
            "tied": n - (busy is not None)}


@case("dp.routing.ties_rotate_{label}", Level.SHOULD,
      "With {n} engines where {setting}, {n} unpinned requests sent one after "
      "another (each finished before the next, so the {tied} idle engines tie at "
      "every choice) should not all go to one engine: every idle engine gets one "
      "(ties rotate, not broken by a fixed order).", grounds=TIE, needs=PINNED,
      params=[_tie_setting(n, busy) for n, busy in ((2, None), (3, None), (3, 0))])
async def ties_rotate(ctx: CaseContext, n: int, busy: int | None) -> None:
    """Engine `busy` (if any) holds one pinned request; `n` unpinned requests follow,
    each finished before the next is sent, so the other engines tie at every choice."""
    held = prompt(1000)
    # report_finished: real DP engines list finished ids, which the Python DPLB relies on.
    group = await ctx.start([EngineScript(rules=[by_prompt(held, hold())],
                                          report_finished=True) for _ in range(n)])
    if busy is not None:
        await (await ctx.driver.generate(held, 50, data_parallel_rank=busy)
               ).wait_first(ctx.t(3))
    tied = [r for r in range(n) if r != busy]
    owners: list[int | None] = []
    for i in range(n):
        p = prompt(1001 + i)
        handle = await ctx.driver.generate(p, 2)
        await handle.wait(ctx.t(3))
        owners.append(engine_of(group, p))
    ctx.require(sorted({o for o in owners if o is not None}) == tied and None not in owners,
                expected=f"the {n} requests reach every one of the equally loaded "
                         f"engines {tied}" + (f" (engine {busy} holds one)" if busy is not
                                                None else ""),
                observed=f"at engines {owners}, in order")
