"""The wave control of a frontend-owned DP coordinator, seen from the engines (handshake
mode, `coordinated`).

When the frontend launches the deployment it owns the DP coordinator (its INIT addresses are
handshake.init cases, conformance/handshake/test_init.py): every engine subscribes and waits
for its READY, engines PUSH `start_wave` / `wave_complete` / stats to it, and it publishes
`START_DP_WAVE (wave, exclude_engine_index)` so the other engines join a wave one of them
started (coordinator.py:412-456; coordinator/inproc.rs:96-130). vLLM runs wave coordination
for MoE models (utils.py:1268 `enable_wave_coordination=is_moe`; vllm-rs `serve` starts its
coordinator for MoE with >1 engine, server/src/config.rs:384-401). A driver that cannot run
such a frontend refuses the start: UNSUPPORTED with its reason. A start_wave older than the
coordinator's wave (an engine's late notice, after wave_complete moved the wave on) changes
nothing in either (coordinator.py:426-428, inproc.rs:113-115; vLLM PR #46833 fixed the Rust
one rewinding).
"""

from __future__ import annotations

import time

from conformance.dp.helpers import PINNED
from harness.cases.authoring import (
    CaseContext,
    EngineGroup,
    Level,
    both,
    case,
    engine,
    prompt,
    py,
    rs,
)

REBROADCAST = both(
    py("vllm/v1/engine/coordinator.py:440",
       "self._send_start_wave(publish_back, wave, eng_index)"),
    py("vllm/v1/engine/coordinator.py:455",
       "wave_encoded = msgspec.msgpack.encode((wave, exclude_engine_index))"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:130",
       "self.broadcast_start_wave(wave, Some(engine_index)).await?;"),
    rs("rust/src/engine-core-client/src/tests/client.rs:843",
       "assert_eq!((wave, exclude_engine), (4, Some(1)));"),
    engine("vllm/v1/engine/core.py:2425",
           "if exclude_eng_index != self.engine_index and ("),
)
DUPLICATE = both(
    py("vllm/v1/engine/coordinator.py:427", "wave > current_wave"),
    py("vllm/v1/engine/coordinator.py:428",
       "or (wave == current_wave and not engines_running)"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:114",
       "if wave > state.current_wave"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:115",
       "|| (wave == state.current_wave && !state.engines_running)"),
)
WAVES = both(
    py("vllm/v1/engine/coordinator.py:416", "if current_wave <= wave:"),
    py("vllm/v1/engine/coordinator.py:444",
       "publish_front.send(msgspec.msgpack.encode(message))"),
    py("vllm/v1/engine/core_client.py:1589", "self.current_wave = wave"),
    py("vllm/v1/engine/core_client.py:1610", "request.current_wave = self.current_wave"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:105",
       "state.current_wave = wave + 1;"),
    rs("rust/src/engine-core-client/src/client.rs:662",
       "req.current_wave = coordinator.snapshot().current_wave;"),
    rs("rust/src/engine-core-client/src/tests/client.rs:687",
       "assert_eq!(request.current_wave, 1);"),
    engine("vllm/v1/engine/core.py:2532",
           "EngineCoreOutputs(wave_complete=self.current_wave),"),
)
STATS = both(
    py("vllm/v1/engine/coordinator.py:368", "if scheduler_stats:"),
    py("vllm/v1/engine/coordinator.py:404", "stats[0] = scheduler_stats.num_waiting_reqs"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:83",
       "if batch.outputs.is_empty() && batch.finished_requests.is_none() =>"),
    rs("rust/src/engine-core-client/src/tests/client.rs:898",
       "async fn coordinator_accepts_stats_only_outputs()"),
    engine("vllm/v1/engine/core.py:2453",
           "self.output_queue.put_nowait((-1, EngineCoreOutputs(scheduler_stats=stats)))"),
)
ALONE = both(
    py("vllm/v1/engine/coordinator.py:45", "Only the engines start waves"),
    py("vllm/v1/engine/core_client.py:1613",
       "# The engine that receives it wakes the other ranks if they are idle."),
    rs("rust/src/engine-core-client/src/client.rs:660",
       "// The engine that receives it wakes the other ranks if they are idle."),
    rs("rust/src/engine-core-client/src/tests/client.rs:628",
       "// An idle engine handed a request starts the wave itself."),
    engine("vllm/v1/engine/core.py:2381",
           "# Engines alone start waves: have the coordinator wake the others."),
)


def _waves(group: EngineGroup, rank: int) -> list[tuple[int, int | None]]:
    return [(w.wave, w.exclude_engine_index) for w in group.transcript.start_dp_waves(rank)]


def _all_waves(group: EngineGroup) -> dict[int, list[tuple[int, int | None]]]:
    return {e.rank: _waves(group, e.rank) for e in group.engines}


async def _rebroadcast_seen(ctx: CaseContext, group: EngineGroup, expected: tuple[int, int],
                            count: int = 1) -> bool:
    """Bounded wait until every engine holds `count` copies of START_DP_WAVE `expected`."""
    return await ctx.wait_until(
        lambda: all(_waves(group, e.rank).count(expected) >= count for e in group.engines), 3)


@case("dp.coordinator.start_wave_rebroadcast_{n}_engines", Level.MUST,
      "With {n} engines, engine {sender} reporting start_wave(4) makes the "
      "coordinator publish START_DP_WAVE (4, exclude={sender}) once to every "
      "engine: the others join the wave, the sender is not woken again.",
      grounds=REBROADCAST, needs=PINNED,
      params=[{"n": 2, "sender": 1}, {"n": 3, "sender": 1}])  # the last engine, or a middle one
async def start_wave_rebroadcast(ctx: CaseContext, n: int, sender: int) -> None:
    group = await ctx.start(n, coordinated=True)
    group[sender].start_wave(4)
    await _rebroadcast_seen(ctx, group, (4, sender))
    await ctx.quiet(0.3)
    seen = _all_waves(group)
    ctx.require(all(v == [(4, sender)] for v in seen.values()),
                expected=f"exactly one START_DP_WAVE (4, {sender}) at every engine",
                observed=seen)


@case("dp.coordinator.duplicate_start_wave_not_rebroadcast", Level.MUST,
      "Once wave 0 runs (engine 0 started it), engine 1 reporting start_wave(0) too is a "
      "duplicate: the coordinator publishes nothing more.", grounds=DUPLICATE, needs=PINNED)
async def duplicate_start_wave(ctx: CaseContext) -> None:
    group = await ctx.start(2, coordinated=True)
    group[0].start_wave(0)
    first = await _rebroadcast_seen(ctx, group, (0, 0))
    ctx.require(first, expected="START_DP_WAVE (0, 0) at both engines",
                observed=_all_waves(group))
    group[1].start_wave(0)
    await ctx.quiet(0.4)
    seen = _all_waves(group)
    ctx.require(all(v == [(0, 0)] for v in seen.values()),
                expected="only the first START_DP_WAVE (0, 0); the duplicate is dropped",
                observed=seen)


@case("dp.coordinator.engines_alone_start_waves", Level.MUST,
      "A request sent while the engines are paused does not make the frontend's coordinator "
      "publish START_DP_WAVE: only the engine that gets it starts the wave (reporting "
      "start_wave), and then the others hear (0, exclude=that engine) first.",
      grounds=ALONE, needs=PINNED)
async def engines_alone_start_waves(ctx: CaseContext) -> None:
    group = await ctx.start(2, coordinated=True)
    handle = await ctx.driver.generate(prompt(0), 2, data_parallel_rank=0)
    await handle.wait(ctx.t(3))
    await ctx.quiet(0.4)
    ctx.require(_all_waves(group) == {0: [], 1: []},
                expected="no START_DP_WAVE while no engine reported start_wave",
                observed=_all_waves(group))
    group[0].start_wave(0)
    await _rebroadcast_seen(ctx, group, (0, 0))
    ctx.require(_waves(group, 1)[:1] == [(0, 0)],
                expected="engine 1 first hears START_DP_WAVE (0, 0)",
                observed=_all_waves(group))


@case("dp.coordinator.wave_complete_next_wave", Level.MUST,
      "Engine 0 reporting wave_complete(0) to the coordinator moves the deployment to wave "
      "1: a request sent afterwards carries current_wave 1 (the first one carried 0).",
      grounds=WAVES, needs=PINNED)
async def wave_complete_next_wave(ctx: CaseContext) -> None:
    group = await ctx.start(2, coordinated=True)
    first = await ctx.driver.generate(prompt(0), 2, data_parallel_rank=0)
    await first.wait(ctx.t(3))
    group[0].start_wave(0)
    await _rebroadcast_seen(ctx, group, (0, 0))
    group[0].wave_complete(0)
    await ctx.quiet(0.3)  # the coordinator's publication reaches the frontend
    second = await ctx.driver.generate(prompt(1), 2, data_parallel_rank=1)
    await second.wait(ctx.t(3))
    waves = {tuple(r.prompt_token_ids): r.current_wave for r in group.transcript.adds()}
    observed = [waves.get(tuple(prompt(0))), waves.get(tuple(prompt(1)))]
    ctx.require(observed == [0, 1],
                expected="current_wave 0 on the first ADD, 1 after wave_complete(0)",
                observed=observed)


@case("dp.coordinator.stats_only_tolerated", Level.MUST,
      "Stats-only messages from every engine on the coordinator path carry load, not wave "
      "control: the coordinator keeps working (a later start_wave(2) is rebroadcast) and the "
      "frontend keeps serving.", grounds=STATS, needs=PINNED)
async def stats_only_tolerated(ctx: CaseContext) -> None:
    group = await ctx.start(2, coordinated=True)
    for each in group.engines:
        each.coordinator_stats(waiting=1, running=2)
    await ctx.quiet(0.3)
    group[1].start_wave(2)
    rebroadcast = await _rebroadcast_seen(ctx, group, (2, 1))
    ctx.require(rebroadcast, expected="START_DP_WAVE (2, 1) at both engines after stats",
                observed=_all_waves(group))
    handle = await ctx.driver.generate(prompt(0), 2, data_parallel_rank=0)
    await handle.wait(ctx.t(3))
    ctx.require(handle.finish_reason == "length",
                expected="the frontend still serves after stats-only messages",
                observed=f"{handle.finish_reason} error={handle.error}")


# A start_wave older than the coordinator's wave changes nothing (PR #46833 in vllm-rs).
STALE = both(
    py("vllm/v1/engine/coordinator.py:416", "if current_wave <= wave:"),
    py("vllm/v1/engine/coordinator.py:427", "wave > current_wave"),
    py("vllm/v1/engine/coordinator.py:428",
       "or (wave == current_wave and not engines_running)"),
    py("vllm/v1/engine/coordinator.py:440",
       "self._send_start_wave(publish_back, wave, eng_index)"),
    py("vllm/v1/engine/core_client.py:1610", "request.current_wave = self.current_wave"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:105",
       "state.current_wave = wave + 1;"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:114",
       "if wave > state.current_wave"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:115",
       "|| (wave == state.current_wave && !state.engines_running)"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:130",
       "self.broadcast_start_wave(wave, Some(engine_index)).await?;"),
    rs("rust/src/engine-core-client/src/client.rs:662",
       "req.current_wave = coordinator.snapshot().current_wave;"),
)


async def _stamped_wave(ctx: CaseContext, group: EngineGroup, seed: int, rank: int) -> int | None:
    """The current_wave on the ADD of one finished request pinned to `rank`."""
    p = prompt(seed)
    await (await ctx.driver.generate(p, 2, data_parallel_rank=rank)).wait(ctx.t(3))
    return next((r.current_wave for r in group.transcript.adds(rank)
                 if r.prompt_token_ids == p), None)


async def _probe_wave(ctx: CaseContext, group: EngineGroup, want: int, seed: int
                      ) -> list[int | None]:
    """current_wave on successive ADDs (engine 0), until `want` is stamped (bounded)."""
    seen: list[int | None] = []
    deadline = time.monotonic() + ctx.t(2)
    while not seen or (seen[-1] != want and time.monotonic() < deadline):
        if seen:
            await ctx.quiet(0.02)
        seen.append(await _stamped_wave(ctx, group, seed + len(seen), 0))
    return seen


@case("dp.coordinator.stale_start_wave_ignored_{n}_engines", Level.MUST,
      "With {n} engines, once wave 0 ran and wave_complete(0) moved the coordinator "
      "to wave 1 (paused), engine {stale}'s late start_wave(0) is stale: nothing is "
      "rebroadcast and the wave is not rewound (the next ADD carries current_wave 1; "
      "engine {stale}'s start_wave(1) afterwards is the only START_DP_WAVE after "
      "(0, 0)).", grounds=STALE, needs=PINNED,
      params=[{"n": 2, "stale": 1}, {"n": 3, "stale": 2}])
async def stale_start_wave(ctx: CaseContext, n: int, stale: int) -> None:
    group = await ctx.start(n, coordinated=True)
    group[0].start_wave(0)
    started = await _rebroadcast_seen(ctx, group, (0, 0))
    ctx.require(started, expected="START_DP_WAVE (0, 0) at every engine",
                observed=_all_waves(group))
    group[0].wave_complete(0)
    seen = await _probe_wave(ctx, group, 1, 50)  # wave_complete(0) was taken
    ctx.require(seen[-1] == 1, expected="ADDs carry current_wave 1 after "
                                        "wave_complete(0) (precondition)",
                observed=f"current_wave on successive ADDs: {seen}")
    group[stale].start_wave(0)  # stale: wave 0 ended
    # Ends at once on a rebroadcast of the stale wave; otherwise a short bound.
    await ctx.wait_until(lambda: any(len(_waves(group, e.rank)) > 1
                                     for e in group.engines), 0.5)
    after = await _stamped_wave(ctx, group, 190, stale)
    group[stale].start_wave(1)  # the same engine's next wave: a barrier behind it
    barrier = await _rebroadcast_seen(ctx, group, (1, stale))
    waves = _all_waves(group)
    ctx.require(barrier and all(v == [(0, 0), (1, stale)] for v in waves.values()),
                expected=f"START_DP_WAVE (0, 0) then (1, {stale}) only, at every "
                         f"engine: the stale start_wave(0) not rebroadcast",
                observed=waves)
    ctx.require(after == 1, expected="the ADD after the stale start_wave(0) carries "
                                     "current_wave 1",
                observed=f"current_wave {after}")


@case("dp.coordinator.stale_wave_complete_ignored_{n}_engines", Level.MUST,
      "With {n} engines, once wave_complete(0) and wave_complete(1) moved the "
      "coordinator to wave 2, a late wave_complete(0) from engine {last} changes "
      "nothing: the next ADD still carries current_wave 2, and engine "
      "{last}'s start_wave(2) afterwards is the only START_DP_WAVE after (1, 0).",
      grounds=STALE, needs=PINNED, params=[{"n": n, "last": n - 1} for n in (2, 3)])
async def stale_wave_complete(ctx: CaseContext, n: int, last: int) -> None:
    group = await ctx.start(n, coordinated=True)
    for wave in (0, 1):
        group[0].start_wave(wave)
        started = await _rebroadcast_seen(ctx, group, (wave, 0))
        ctx.require(started, expected=f"START_DP_WAVE ({wave}, 0) at every engine",
                    observed=_all_waves(group))
        group[0].wave_complete(wave)
        seen = await _probe_wave(ctx, group, wave + 1, 300 + 20 * wave)
        ctx.require(seen[-1] == wave + 1,
                    expected=f"ADDs carry current_wave {wave + 1} after "
                             f"wave_complete({wave}) (precondition)",
                    observed=f"current_wave on successive ADDs: {seen}")
    group[last].wave_complete(0)  # stale: wave 0 ended long ago
    await ctx.wait_until(lambda: any(len(_waves(group, e.rank)) > 2
                                     for e in group.engines), 0.5)
    after = await _stamped_wave(ctx, group, 390, last)
    group[last].start_wave(2)  # a barrier behind the stale message
    barrier = await _rebroadcast_seen(ctx, group, (2, last))
    waves = _all_waves(group)
    ctx.require(barrier and all(v == [(0, 0), (1, 0), (2, last)]
                                for v in waves.values()),
                expected=f"START_DP_WAVE (0, 0), (1, 0), then (2, {last}) only, at "
                         "every engine: nothing for the stale wave_complete(0)",
                observed=waves)
    ctx.require(after == 2, expected="the ADD after the stale wave_complete(0) "
                                     "carries current_wave 2",
                observed=f"current_wave {after}")
