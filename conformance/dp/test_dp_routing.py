"""DP request routing at its boundaries: every engine count 1..4, every rank, invalid ranks,
and load balancing by in-flight count.

Both 0.33.0 frontends validate an explicit rank (Python: `input_processor.py:396-400`
"data_parallel_rank ... is out of range"; Rust: `Error::InvalidDataParallelRank`,
client/state.rs:202-206) and send nothing for a refused request; both route unpinned requests
to the engine with the fewest in-flight requests (Python DPLB `core_client.py:1786` floors the
score at its own in-flight count; Rust `client/state.rs:87-92` routing_score likewise). A
negative rank differs: vllm-rs's HTTP server treats a rank header that is not a u32 as absent.

Two more places where they differ, each SHOULD: a tie between equally loaded engines (Python
rotates where its scan starts, PR #47420; vllm-rs always takes the lowest engine), and what a
pin names when the frontend's engines start above rank 0 (vllm-rs: the global rank; Python:
an index into the engines it manages). That a pin never reaches an engine the frontend lacks
holds in both (MUST).
"""

from __future__ import annotations

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, differ, engine, py, rs
from harness.cases.helpers import hold, prompt, request_for, requests_for
from harness.frontends.api import Capability, FrontendError, StreamHandle
from harness.protocol.wire import messages as m
from harness.results.records import Level
from mock_engines.group import EngineGroup
from mock_engines.script import Emit, EngineScript, Finish, any_request, by_prompt

CC = "vllm/v1/engine/core_client.py"
IP = "vllm/v1/engine/input_processor.py"
RS = "rust/src/engine-core-client/src/client/state.rs"
RC = "rust/src/engine-core-client/src/client.rs"
RT = "rust/src/engine-core-client/src/tests/client.rs"
SCHED = "vllm/v1/core/sched/scheduler.py"

_PY_INFLIGHT = py(f"{CC}:1786",
                  "score: float = max(self.client_count * inflight, waiting + running)")
_RS_SCORE = rs(f"{RS}:92", "self.inflight.max(stats.running + stats.waiting")
_RS_MIN = rs(f"{RS}:219", ".min_by_key(|(_, state)| state.routing_score())")

# A pinned request goes to exactly that engine.
EXPLICIT = both(
    py(f"{CC}:1763", "if (eng_index := request.data_parallel_rank) is None and ("),
    py(f"{CC}:1808", "chosen_engine = self.core_engines[eng_index]"),
    rs(f"{RS}:202", "if let Some(rank) = data_parallel_rank {"),
    rs(f"{RS}:203", "u16::try_from(rank).ok().map(EngineId::from_engine_index)"),
    rs(f"{RS}:1176", "fn register_with_data_parallel_rank_routes_to_specified_engine() {"),
)
# A rank outside [0, engines) is refused before anything is sent.
RANGE = both(
    py(f"{IP}:396",
       "if data_parallel_rank is not None and not (0 <= data_parallel_rank < num_ranks):"),
    py(f"{IP}:397", "raise VLLMValidationError("),
    rs(f"{RS}:173", "let engine_id = self.choose_engine_for_request(data_parallel_rank)?;"),
    rs(f"{RS}:206", ".ok_or_else(|| Error::InvalidDataParallelRank {"),
    rs(f"{RS}:1233", "crate::error::Error::InvalidDataParallelRank {"),
)
NEGATIVE = differ(
    py("vllm/entrypoints/generate/base/serving.py:226", "return int(rank_str)"),
    py(f"{IP}:396",
       "if data_parallel_rank is not None and not (0 <= data_parallel_rank < num_ranks):"),
    rs("rust/src/server/src/utils.rs:154",
       "`None` when the header is absent or cannot be parsed as a `u32`."),
    rs("rust/src/server/src/utils.rs:158", ".and_then(|s| s.trim().parse().ok());"),
    rs("rust/src/server/src/grpc/inference.rs:209",
       "x-data-parallel-rank metadata must be an unsigned 32-bit integer"),
    note="python's HTTP layer parses the rank with int(), so -1 reaches the range check and "
         "is refused (serving.py:226, input_processor.py:396); vllm-rs's HTTP server "
         "deliberately treats a rank header that does not parse as u32 as absent and "
         "load-balances the request (utils.rs:154-158; its gRPC path refuses it, "
         "inference.rs:209)")
# Unpinned requests go to the engine with the fewest of this client's requests in flight.
LB = both(
    py(f"{CC}:1785", "inflight = self.engine_inflight[self.core_engines[idx]]"),
    _PY_INFLIGHT,
    py(f"{CC}:1811", "self.engine_inflight[chosen_engine] += 1"),
    rs(f"{RS}:89", "return self.inflight;"),
    _RS_SCORE, _RS_MIN,
    rs(f"{RT}:1988", "fn multi_engine_client_shares_transport_and_routes_by_inflight_count()"),
)
PINNED = [Capability.GENERATE, Capability.DP_RANK]


async def _explicit_every_rank(ctx: CaseContext, engines: int) -> None:
    """Each rank, in reversed then forward order, gets exactly the requests pinned to it."""
    group = await ctx.start(engines)
    order = [*reversed(range(engines)), *range(engines)]
    for i, rank in enumerate(order):
        p = prompt(40 + i)
        handle = await ctx.driver.generate(p, 2, data_parallel_rank=rank)
        await handle.wait(ctx.t(3))
        found = request_for(group, p)
        ctx.require(found is not None and found[0] == rank,
                    expected=f"the ADD for data_parallel_rank={rank} at engine {rank}",
                    observed=f"at engine {found[0] if found else None}")
        ctx.require(handle.finish_reason == "length",
                    expected="the pinned request completes",
                    observed=f"{handle.finish_reason} error={handle.error}")


for _n in (1, 2, 3, 4):
    def _make_explicit(n: int = _n) -> None:
        @case(f"dp.routing.explicit_every_rank_{n}_engines", Level.MUST,
              f"With {n} engine(s), a request pinned to data_parallel_rank r goes to engine r "
              "only, for every r, in any order.", grounds=EXPLICIT, needs=PINNED)
        async def explicit_every_rank(ctx: CaseContext) -> None:
            await _explicit_every_rank(ctx, n)

        globals()[f"explicit_every_rank_{n}"] = explicit_every_rank
    _make_explicit()


async def _rank_refused(ctx: CaseContext, engines: int, rank: int) -> None:
    """Refused: an error to the caller, no ADD anywhere, and the frontend keeps serving."""
    group = await ctx.start(engines)
    bad = prompt(700)
    outcome = ""
    try:
        handle = await ctx.driver.generate(bad, 2, data_parallel_rank=rank)
    except FrontendError as exc:
        outcome = f"refused: {exc}"
    else:
        try:
            await handle.wait(ctx.t(3))
        except TimeoutError:
            outcome = "the stream neither completed nor failed within 3 s"
        else:
            outcome = (f"refused: {handle.error}" if handle.finish_reason == "error"
                       else f"served ({handle.finish_reason}, {len(handle.tokens)} tokens)")
    await ctx.quiet(0.2)
    found = request_for(group, bad)
    ctx.require(found is None, expected=f"no ADD for data_parallel_rank={rank} "
                                        f"({engines} engine(s))",
                observed=f"an ADD reached engine {found[0] if found else None}; {outcome}")
    ctx.require(outcome.startswith("refused"),
                expected=f"the request with data_parallel_rank={rank} is refused with an "
                         f"error", observed=outcome)
    good = await ctx.driver.generate(prompt(701), 2, data_parallel_rank=engines - 1)
    await good.wait(ctx.t(3))
    ctx.require(good.finish_reason == "length",
                expected="a valid request still completes after the refusal",
                observed=f"{good.finish_reason} error={good.error}")


for _n in (1, 2, 3, 4):
    def _make_out_of_range(n: int = _n) -> None:
        @case(f"dp.routing.rank_out_of_range_{n}_engines", Level.MUST,
              f"With {n} engine(s), data_parallel_rank={n} (one past the last) is refused with "
              "an error and no ADD is sent; the frontend keeps serving.", grounds=RANGE,
              needs=PINNED)
        async def rank_out_of_range(ctx: CaseContext) -> None:
            await _rank_refused(ctx, n, n)

        globals()[f"rank_out_of_range_{n}"] = rank_out_of_range
    _make_out_of_range()


@case("dp.routing.rank_negative", Level.SHOULD,
      "data_parallel_rank=-1 should be refused with an error and no ADD sent (not taken as "
      "'the last engine').", grounds=NEGATIVE, needs=PINNED)
async def rank_negative(ctx: CaseContext) -> None:
    await _rank_refused(ctx, 3, -1)


@case("dp.routing.rank_far_out_of_range", Level.MUST,
      "data_parallel_rank=1000 with 2 engines is refused (not wrapped modulo the count).",
      grounds=RANGE, needs=PINNED)
async def rank_far_out_of_range(ctx: CaseContext) -> None:
    await _rank_refused(ctx, 2, 1000)


async def _least_loaded(ctx: CaseContext, engines: int, free: int) -> None:
    """Two held requests on every engine but `free`: the next unpinned one goes to `free`."""
    group = await ctx.start([EngineScript(rules=[any_request(hold())])
                             for _ in range(engines)])
    held: list[StreamHandle] = []
    for rank in range(engines):
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
    found = request_for(group, p)
    loads = {r: (0 if r == free else 2) for r in range(engines)}
    ctx.require(found is not None and found[0] == free,
                expected=f"the unpinned request at engine {free}, the only idle one "
                         f"(in-flight per engine {loads})",
                observed=f"at engine {found[0] if found else None}")


for _n, _free in ((2, 1), (3, 1), (4, 2), (4, 3)):
    def _make_least_loaded(n: int = _n, free: int = _free) -> None:
        @case(f"dp.routing.least_loaded_{n}_engines_idle_{free}", Level.MUST,
              f"With {n} engines of which only engine {free} has nothing in flight, an "
              f"unpinned request goes to engine {free}.", grounds=LB, needs=PINNED)
        async def least_loaded(ctx: CaseContext) -> None:
            await _least_loaded(ctx, n, free)

        globals()[f"least_loaded_{n}_{free}"] = least_loaded
    _make_least_loaded()


@case("dp.routing.finished_requests_free_capacity", Level.MUST,
      "Requests that finished no longer count as in flight: after three requests on engine "
      "0 finish while two stay open on engine 1, the next unpinned request goes to engine 0.",
      grounds=both(
          py(f"{CC}:1822", "if outputs.finished_requests and self.reqs_in_flight:"),
          py(f"{CC}:1825", "self.engine_inflight[engine] -= 1"),
          _PY_INFLIGHT,
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
    found = request_for(group, p)
    ctx.require(found is not None and found[0] == 0,
                expected="the unpinned request at engine 0 (0 in flight vs 2 on engine 1)",
                observed=f"at engine {found[0] if found else None}")


async def _reported_load(ctx: CaseContext, loads: list[tuple[int, int]], idle: int) -> None:
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
    found = request_for(group, p)
    ctx.require(found is not None and found[0] == idle,
                expected=f"the unpinned request at engine {idle}, the only one without "
                         f"reported load (waiting, running per engine {loads})",
                observed=f"at engine {found[0] if found else None}")


REPORTED = both(
    py(f"{CC}:1598", "self.lb_engines = sliced_counts"),
    _PY_INFLIGHT,
    py("vllm/v1/engine/coordinator.py:404", "stats[0] = scheduler_stats.num_waiting_reqs"),
    rs("rust/src/engine-core-client/src/client/imp.rs:490",
       "if !inner.apply_scheduler_stats(batch.engine_index, scheduler_stats) {"),
    rs(f"{RS}:326", "pub fn apply_scheduler_stats(&mut self, engine_index: u32"),
    _RS_SCORE,
    note="the frontends take the engines' load from different channels: python from the "
         "coordinator's published counts (built from the engines' scheduler_stats), vllm-rs "
         "from the scheduler_stats on the output path; the case offers both")

for _loads, _idle in (([(0, 5), (0, 0)], 1), ([(2, 3), (0, 0), (0, 4)], 1)):
    def _make_reported(loads: list[tuple[int, int]] = _loads, idle: int = _idle) -> None:
        n = len(loads)

        @case(f"dp.routing.reported_load_{n}_engines", Level.MUST,
              f"Load an engine reports (other clients' requests: coordinator counts and "
              f"scheduler_stats {loads}) counts for routing: an unpinned request goes to "
              f"engine {idle}, the idle one, although this client has nothing in flight.",
              grounds=REPORTED, needs=PINNED)
        async def reported_load(ctx: CaseContext) -> None:
            await _reported_load(ctx, loads, idle)

        globals()[f"reported_load_{n}"] = reported_load
    _make_reported()


for _n in (1, 2):
    def _make_client_index(n: int = _n) -> None:
        @case(f"dp.client.index_on_every_message_{n}_engines", Level.MUST,
              f"With {n} engine(s), a single frontend stamps one client_index (0) on every "
              "ADD and UTILITY it sends, so engines route its outputs to its output socket.",
              grounds=both(
                  py(f"{CC}:1340", "request.client_index = self.client_index"),
                  py(f"{CC}:1611", "request.client_index = self.client_index"),
                  py(f"{CC}:1330",
                     "*self.encoder.encode((self.client_index, call_id, method, args)),"),
                  rs(f"{RC}:626", "req.client_index = self.config.client_index;"),
                  rs(f"{RC}:747", "EngineCoreUtilityRequest::new(self.config.client_index"),
                  engine("vllm/v1/engine/core.py:1775",
                         "(client_idx, EngineCoreOutputs(utility_output=out))"),
                  engine(f"{SCHED}:2511", "outputs[request.client_index].append("),
                  engine("vllm/v1/engine/core.py:2102", "sockets[client_index], buffers"),
              ),
              needs=[Capability.GENERATE, Capability.IS_SLEEPING])
        async def client_index(ctx: CaseContext) -> None:
            group = await ctx.start(n)
            handles = [await ctx.driver.generate(prompt(500 + i), 2) for i in range(2 * n)]
            for h in handles:
                await h.wait(ctx.t(3))
            await ctx.driver.is_sleeping()
            adds = [r.client_index for r in group.transcript.adds()]
            calls = [r.message.client_index for r in group.transcript.utility_calls()]
            ctx.require(bool(adds) and set(adds) | set(calls) == {0},
                        expected="client_index 0 on every ADD and UTILITY",
                        observed=f"ADDs {adds}, UTILITY {calls}")

        globals()[f"client_index_{n}"] = client_index
    _make_client_index()


# A routed request counts on its engine at once, before any output or coordinator update.
COUNTED_AT_ONCE = both(
    py(f"{CC}:1811", "self.engine_inflight[chosen_engine] += 1"),
    _PY_INFLIGHT,
    rs(f"{RS}:97", "self.inflight += 1;"),
    rs(f"{RS}:173", "let engine_id = self.choose_engine_for_request(data_parallel_rank)?;"),
    _RS_SCORE,
)


@case("dp.routing.least_loaded_burst", Level.MUST,
      "Requests just sent count at once: two pinned to engine 0 and two to engine 2, then "
      "immediately an unpinned one (no output or coordinator update in between) goes to "
      "engine 1.",
      grounds=COUNTED_AT_ONCE, needs=PINNED)
async def least_loaded_burst(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())]) for _ in range(3)])
    for i, rank in enumerate((0, 2, 0, 2)):
        await ctx.driver.generate(prompt(600 + i), 50, data_parallel_rank=rank)
    p = prompt(699)
    handle = await ctx.driver.generate(p, 50)
    await handle.wait_first(ctx.t(3))
    found = request_for(group, p)
    ctx.require(found is not None and found[0] == 1,
                expected="the unpinned request at engine 1 (in flight: 2, 0, 2)",
                observed=f"at engine {found[0] if found else None}")


@case("dp.routing.least_loaded_4_engines_two_idle", Level.MUST,
      "With 4 engines holding 2, 1, 0 and 0 requests in flight (pinned), two unpinned "
      "requests sent back to back (no output or coordinator update in between) go one to "
      "engine 2 and one to engine 3, none to engines 0 and 1.",
      grounds=COUNTED_AT_ONCE, needs=PINNED)
async def least_loaded_two_idle(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())]) for _ in range(4)])
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
          _PY_INFLIGHT,
          rs(f"{RS}:92", "self.inflight.max(stats.running + stats.waiting"),
          rs(f"{RS}:913", "fn routing_score_uses_inflight_as_scheduler_stats_lower_bound()"),
          rs("rust/src/engine-core-client/src/coordinator/external.rs:31",
             "intentionally ignores it for routing decisions."),
      ), needs=PINNED)
async def burst_even_despite_stale_snapshot(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())]) for _ in range(4)])
    coordinator = group.coordinator
    assert coordinator is not None, "a DP group of 4 has a mock coordinator"
    coordinator.publishing = False  # from now on only the one stale snapshot below
    await ctx.quiet(0.15)  # a regular publication already on its way lands first
    for i in range(2):
        await (await ctx.driver.generate(prompt(800 + i), 50, data_parallel_rank=0)
               ).wait_first(ctx.t(3))
    before = len(coordinator.transcript.select(direction="out"))
    coordinator.inject.append(group.codec.encode_dp_stats(
        m.DPStatsUpdate([(0, 0, 0.0)] * 4, coordinator.wave, False)))
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


# ----------------------------------------------------------------- ties between engines

# Python rotates where its least-loaded scan starts (PR #47420), so equal scores go round;
# vllm-rs takes the first minimum of a BTreeMap, so every tie goes to the lowest engine.
TIE = differ(
    py(f"{CC}:1776", "idx = (self.eng_start_index + i) % num_engines"),
    py(f"{CC}:1801", "# Rotate the scan start so that ties (equal scores, e.g. right"),
    py(f"{CC}:1806", "self.eng_start_index = (self.eng_start_index + 1) % num_engines"),
    rs(f"{RS}:137", "routing_per_engine: BTreeMap<EngineId, EngineRoutingState>,"),
    _RS_MIN,
    rs(f"{RS}:1007",
       "fn registry_preserves_tie_order_across_finished_requests_and_stats_refreshes() {"),
    rs(f"{RS}:1029", 'expect_test::expect!["[2, 2, 2, 2, 2, 2]"]'),
    note="python rotates the start of its least-loaded scan after every unpinned request "
         "(core_client.py:1776, 1801-1806, PR #47420 'avoid systematic engine bias'), so "
         "equally loaded engines take turns; vllm-rs keeps its engines in a BTreeMap and "
         "takes min_by_key, the first minimum (state.rs:137, 219), so a tie always goes to "
         "the lowest engine id, which its test expects (state.rs:1007-1029: [2, 2, 2, 2, 2, "
         "2]). The bias is an imbalance, not a hang or lost data: SHOULD")


async def _ties_rotate(ctx: CaseContext, engines: int, busy: int | None) -> None:
    """Engine `busy` (if any) holds one pinned request; `engines` unpinned requests follow,
    each finished before the next is sent, so the other engines tie at every choice."""
    held = prompt(1000)
    # report_finished: real DP engines list finished ids, which the Python DPLB relies on.
    group = await ctx.start([EngineScript(rules=[by_prompt(held, hold())],
                                          report_finished=True) for _ in range(engines)])
    if busy is not None:
        await (await ctx.driver.generate(held, 50, data_parallel_rank=busy)
               ).wait_first(ctx.t(3))
    tied = [r for r in range(engines) if r != busy]
    owners: list[int | None] = []
    for i in range(engines):
        p = prompt(1001 + i)
        handle = await ctx.driver.generate(p, 2)
        await handle.wait(ctx.t(3))
        found = request_for(group, p)
        owners.append(found[0] if found else None)
    ctx.require(sorted({o for o in owners if o is not None}) == tied and None not in owners,
                expected=f"the {engines} requests reach every one of the equally loaded "
                         f"engines {tied}" + (f" (engine {busy} holds one)" if busy is not
                                                None else ""),
                observed=f"at engines {owners}, in order")


for _n, _busy in ((2, None), (3, None), (3, 0)):
    def _make_ties(n: int = _n, busy: int | None = _busy) -> None:
        label = f"{n}_engines" + (f"_{busy}_busy" if busy is not None else "")
        setting = (f"engine {busy} holds one request and the others are idle"
                   if busy is not None else "every engine is idle")
        tied = n - (busy is not None)

        @case(f"dp.routing.ties_rotate_{label}", Level.SHOULD,
              f"With {n} engines where {setting}, {n} unpinned requests sent one after "
              f"another (each finished before the next, so the {tied} idle engines tie at "
              f"every choice) should not all go to one engine: every idle engine gets one "
              "(ties rotate, not broken by a fixed order).", grounds=TIE, needs=PINNED)
        async def ties_rotate(ctx: CaseContext) -> None:
            await _ties_rotate(ctx, n, busy)

        globals()[f"ties_rotate_{label}"] = ties_rotate
    _make_ties()


# ----------------------------------------------------------------- pins from a start index

_RS_PIN = (
    rs(f"{RS}:203", "u16::try_from(rank).ok().map(EngineId::from_engine_index)"),
    rs(f"{RS}:205", ".filter(|engine_id| self.routing_per_engine.contains_key(engine_id))"),
    rs(f"{RS}:206", ".ok_or_else(|| Error::InvalidDataParallelRank {"),
    rs(f"{RS}:1241", "fn register_with_rank_uses_global_engine_identity() {"),
)
_PY_PIN = (
    py(f"{IP}:395", "num_ranks = dp_local_size if parallel_config.local_engines_only else dp_size"),
    py(f"{IP}:396",
       "if data_parallel_rank is not None and not (0 <= data_parallel_rank < num_ranks):"),
    py(f"{CC}:754", 'rank.to_bytes(2, "little") for rank in self.engine_ranks_managed'),
    py(f"{CC}:1808", "chosen_engine = self.core_engines[eng_index]"),
)
# Whatever a pin means, it reaches an engine of this frontend or is refused: never lost.
PIN_NOT_LOST = both(
    *_PY_PIN, *_RS_PIN,
    note="python checks the pin against the number of engines it manages (the local count "
         "in hybrid / external LB, input_processor.py:395-396) and indexes its list of their "
         "identities with it (core_client.py:754, 1808); vllm-rs sends a pin only to a "
         "connected engine (state.rs:203-206). What a pin names differs (see "
         "dp.routing.pin_names_global_rank_*); that an accepted pin reaches an engine of the "
         "frontend, and any other is refused, holds in both")
PIN_GLOBAL = differ(
    *_PY_PIN, *_RS_PIN,
    note="vllm-rs takes the pin as the global engine rank, served only by a connected engine "
         "(state.rs:203-206; its test register_with_rank_uses_global_engine_identity serves "
         "rank 3 on engine 3 and refuses 0, state.rs:1241); python, whose frontend owns "
         "engines from a nonzero start only in hybrid / external LB, checks the pin against "
         "its local engine count and indexes its managed engines with it "
         "(input_processor.py:395-396, core_client.py:754, 1808): a pin is a local index "
         "there (with engines [2, 3], pin 0 goes to engine 2 and pin 3 is refused; its "
         "docs speak of ranks in [0, data_parallel_size), token_in_token_out.md:47, which "
         "agree with a local index only from start 0). vllm-rs chose the global reading in "
         "PR #51178 (its error names the connected ranks). Neither reading loses a request "
         "(dp.routing.pin_never_lost_*), so the difference is SHOULD")


def _pin_cases(start: int, count: int) -> None:
    ranks = list(range(start, start + count))
    pins = list(range(start + count + 1))  # from 0 to one past the highest rank
    label = f"start_{start}_count_{count}"

    async def outcome(ctx: CaseContext, group: EngineGroup, rank: int, seed: int
                      ) -> tuple[str, int | None]:
        """('refused' | 'served' | 'lost' | 'ended ...', the engine its ADD reached)."""
        p = prompt(seed)
        try:
            handle = await ctx.driver.generate(p, 2, data_parallel_rank=rank)
        except FrontendError as exc:
            result = f"refused: {exc}"
        else:
            try:
                await handle.wait(ctx.t(3))
            except TimeoutError:
                result = "lost: neither completed nor failed within 3 s"
            else:
                result = ("served" if handle.finish_reason == "length" else
                          f"refused: {handle.error}" if handle.finish_reason == "error" else
                          f"ended {handle.finish_reason}")
        found = request_for(group, p)
        return result, (found[0] if found else None)

    @case(f"dp.routing.pin_never_lost_{label}", Level.MUST,
          f"With engines {ranks} (engine start index {start}), a request pinned to any "
          f"data_parallel_rank from 0 to {start + count} is either refused with an error "
          "and sent nowhere, or served to completion by one of the frontend's engines: "
          "never sent to an engine the frontend does not have (where it would hang).",
          grounds=PIN_NOT_LOST, needs=PINNED)
    async def pin_never_lost(ctx: CaseContext) -> None:
        group = await ctx.start(count, rank_offset=start)
        for i, rank in enumerate(pins):
            result, at = await outcome(ctx, group, rank, 1100 + i)
            ok = ((result.startswith("refused") and at is None)
                  or (result == "served" and at in ranks))
            ctx.require(ok, expected=f"data_parallel_rank={rank} refused (no ADD) or served "
                                     f"by one of engines {ranks}",
                        observed=f"{result}; ADD at engine {at}")

    @case(f"dp.routing.pin_names_global_rank_{label}", Level.SHOULD,
          f"With engines {ranks} (engine start index {start}), data_parallel_rank should "
          f"name the engine's global rank: a request pinned to {ranks[-1]} (the highest) is "
          f"served by engine {ranks[-1]}, one pinned to {start} by engine {start}, and pins "
          f"to 0 and {start + count} (ranks outside the group) are refused, not taken as an "
          "index into the frontend's engines.", grounds=PIN_GLOBAL, needs=PINNED)
    async def pin_names_global_rank(ctx: CaseContext) -> None:
        group = await ctx.start(count, rank_offset=start)
        for i, rank in enumerate((ranks[-1], start)):
            result, at = await outcome(ctx, group, rank, 1200 + i)
            ctx.require(result == "served" and at == rank,
                        expected=f"data_parallel_rank={rank} served by engine {rank}",
                        observed=f"{result}; ADD at engine {at}")
        for i, rank in enumerate((0, start + count)):
            result, at = await outcome(ctx, group, rank, 1210 + i)
            ctx.require(result.startswith("refused") and at is None,
                        expected=f"data_parallel_rank={rank} (not a rank of engines "
                                 f"{ranks}) refused, no ADD",
                        observed=f"{result}; ADD at engine {at}")

    globals()[f"pin_never_lost_{label}"] = pin_never_lost
    globals()[f"pin_names_global_rank_{label}"] = pin_names_global_rank


for _start, _count in ((2, 2), (1, 3)):
    _pin_cases(_start, _count)
