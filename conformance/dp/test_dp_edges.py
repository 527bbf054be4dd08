"""DP load from the coordinator's publications alone: a port that reads only
scheduler_stats, keeps the first publication, or stops reading after an undecodable one
routes by stale load.

vLLM 0.33.0: the Python DPLB client subscribes to the coordinator's stats publisher and
replaces its per-engine counts with each `[counts, wave, running]` publication
(core_client.py:1588-1598; score = max(inflight, waiting + running), :1786). vllm-rs
deliberately ignores the counts (coordinator/external.rs:31) and routes by its own in-flight
count and engines' scheduler_stats, so these rules are SHOULD.
"""

from __future__ import annotations

import asyncio

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, differ, engine, py, recommendation, rs
from harness.cases.helpers import hold, prompt, routed_engine
from harness.frontends.api import Capability
from harness.protocol.wire import messages as m
from harness.results.records import Level
from mock_engines.script import EngineScript, any_request

CC = "vllm/v1/engine/core_client.py"
EXT = "rust/src/engine-core-client/src/coordinator/external.rs"
# Python routes by the coordinator's published counts; Rust deliberately ignores them.
_PY_COUNTS = (
    py(f"{CC}:1598", "self.lb_engines = sliced_counts"),
    py(f"{CC}:1768", "current_counts = self.lb_engines"),
    py(f"{CC}:1786", "score: float = max(self.client_count * inflight, waiting + running)"),
)
_RS_IGNORES = (
    rs(f"{EXT}:31", "wire compatibility but intentionally ignores it for routing decisions."),
    rs("rust/src/engine-core-client/src/tests/client.rs:3332",
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
NEEDS = [Capability.GENERATE]


for _loads, _idle in (([(0, 5), (0, 0)], 1), ([(2, 3), (0, 0), (0, 4)], 1),
                      ([(0, 3), (1, 1), (0, 0)], 2)):
    def _make_only(loads: list[tuple[int, int]] = _loads, idle: int = _idle) -> None:
        n = len(loads)

        @case(f"dp.edges.coordinator_load_only_{n}_engines_idle_{idle}", Level.SHOULD,
              f"Load published only by the DP coordinator (counts {loads}, no "
              f"scheduler_stats) should count for routing: an unpinned request goes to "
              f"engine {idle}, the idle one (Python routes by the counts; Rust ignores "
              "them, coordinator/external.rs:31).", grounds=COUNTS_ONLY, needs=NEEDS)
        async def load_only(ctx: CaseContext) -> None:
            group = await ctx.start([EngineScript(reported_load=load) for load in loads])
            await ctx.quiet(0.4)  # several publications land
            at = await routed_engine(ctx, group, 500 + n)
            ctx.require(at == idle, expected=f"the request at engine {idle} (published "
                                             f"load {loads})", observed=f"at engine {at}")

        globals()[f"load_only_{n}_{idle}"] = load_only
    _make_only()


for _garbage in (False, True):
    def _make_moved(garbage: bool = _garbage) -> None:
        name = "after_undecodable_publication" if garbage else "follows_latest_publication"

        @case(f"dp.edges.load_{name}", Level.SHOULD,
              "When the published load moves from engine 0 to engine 1 (counts "
              "[(0,5),(0,0)] then [(0,0),(0,5)])"
              + (", with an undecodable publication in between," if garbage else "")
              + " the next unpinned request goes to engine 0: the newest publication counts"
              + (" and the frontend keeps reading after skipping the bad one (Python's "
                 "stats task dies on it, core_client.py:1588; vllm-rs stops serving)."
                 if garbage else " (Python replaces its counts per publication; Rust "
                 "ignores counts)."),
              grounds=UNDECODABLE if garbage else LATEST, needs=NEEDS)
        async def moved(ctx: CaseContext) -> None:
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

        globals()[f"load_{name}"] = moved
    _make_moved()


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
    group.coordinator.inject.append(group.codec.encode_dp_stats(m.DPStatsUpdate(
        [(0, 5, 0.0), (0, 0, 0.0), (7, 7, 0.0)], 0, True)))
    await ctx.quiet(0.3)
    group.engines[0].script.reported_load = (0, 0)
    group.engines[1].script.reported_load = (0, 5)
    await ctx.quiet(0.4)
    second = await routed_engine(ctx, group, 531)
    ctx.require(second == 0, expected="then the request at engine 0 (load moved to engine 1)",
                observed=f"at engine {second}")


# ---------------------------------------------------------------- death says why

DEATH = both(
    py(f"{CC}:588", "raise EngineDeadError()"),
    py("vllm/v1/engine/async_llm.py:944", "output_processor.propagate_error(e)"),
    py("vllm/v1/engine/output_processor.py:597", "state.queue.put(e)"),
    py("vllm/v1/engine/exceptions.py:20",
       "EngineCore encountered an issue. See stack trace (above) for the root cause."),
    rs("rust/src/engine-core-client/src/transport.rs:615",
       "let _ = tx.send(Err(Error::EngineCoreDead)).await;"),
    rs("rust/src/engine-core-client/src/client/imp.rs:537",
       "inner.close_registries(Arc::new(error));"),
    rs("rust/src/engine-core-client/src/client/imp.rs:223",
       "sender.send_error(Error::Shared(persistent_error.clone()));"),
    rs("rust/src/engine-core-client/src/error.rs:39",
       '#[error("engine core reported fatal failure")]'),
    engine("vllm/v1/engine/core.py:2078", "if output == EngineCoreProc.ENGINE_CORE_DEAD:"),
)

for _n in (1, 2, 3):
    def _make_death(n: int = _n) -> None:
        @case(f"dp.edges.engine_death_stream_error_text_{n}_engines", Level.MUST,
              f"With {n} engine(s), ENGINE_CORE_DEAD from the last engine ends every open "
              "stream with an error that says what happened (a non-empty error text), not "
              "a bare error finish.", grounds=DEATH,
              needs=[Capability.GENERATE, Capability.ENGINE_DEATH], timeout=20)
        async def death_text(ctx: CaseContext) -> None:
            group = await ctx.start([EngineScript(rules=[any_request(hold())])
                                     for _ in range(n)])
            handles = [await ctx.driver.generate(prompt(540 + i), 100) for i in range(n + 1)]
            await asyncio.gather(*(h.wait_first(ctx.t(3)) for h in handles))
            group.engines[-1].send_dead()
            await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
            bad = [(h.finish_reason, h.error) for h in handles
                   if not (h.ended and isinstance(h.error, str) and h.error.strip())]
            ctx.require(not bad, expected=f"all {n + 1} streams end with an error text",
                        observed=f"{len(bad)} did not (finish, error): {bad[:3]}")

        globals()[f"death_text_{n}"] = death_text
    _make_death()
