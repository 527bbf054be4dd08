"""Abort semantics (seed PR #44591, rust-client.md §1.5, semantics.md (b)).

Hard rules: every dropped live stream is aborted exactly once, at the engine that owns it,
never in an empty frame, never for finished or unknown ids. Coalescing a burst into one
frame per engine is timing-dependent over real transports, so it is graded SHOULD.
"""

from __future__ import annotations

from collections import Counter

from harness.case_context import CaseContext
from harness.casekit import hold, prompt, request_for, requests_for, trickle
from harness.frontends.driver import Capability, StreamHandle
from harness.verdicts import Level, case
from mock_engines.group import EngineGroup
from mock_engines.script import EngineScript, any_request, by_prompt, stream

PR = "PR #44591"
DROP = [Capability.GENERATE, Capability.DROP]
ABORT = [Capability.GENERATE, Capability.ABORT]


def _holding(n: int = 1) -> list[EngineScript]:
    return [EngineScript(rules=[any_request(hold())]) for _ in range(n)]


async def _open_streams(ctx: CaseContext, group: EngineGroup, count: int, offset: int = 0
                        ) -> tuple[list[StreamHandle], dict[str, int]]:
    """Start `count` held-open streams and return them with {engine id: owning rank}."""
    prompts = [prompt(offset + i) for i in range(count)]
    handles = [await ctx.driver.generate(p, 100) for p in prompts]
    for h in handles:
        await h.wait_first(ctx.t(5))
    ok = await ctx.wait_until(lambda: requests_for(group, prompts) is not None, 3)
    ctx.require(ok, expected=f"{count} ADDs at the engines", observed=len(group.transcript.adds()))
    owners = requests_for(group, prompts) or {}
    return handles, owners


def _check_exactly_once(ctx: CaseContext, group: EngineGroup, owners: dict[str, int]) -> None:
    frames = group.transcript.abort_frames()
    empty = [r.rank for r in frames if not r.message.request_ids]
    ctx.require(not empty, expected="no empty ABORT frame", observed=f"empty frames at {empty}")
    seen = Counter(rid for r in frames for rid in r.message.request_ids)
    dupes = {rid: n for rid, n in seen.items() if n > 1}
    ctx.require(not dupes, expected="each id aborted once", observed=f"duplicates {dupes}")
    missing = sorted(set(owners) - set(seen))
    ctx.require(not missing, expected=f"all {len(owners)} dropped ids aborted",
                observed=f"{len(missing)} never aborted, e.g. {missing[:5]}")
    extra = sorted(set(seen) - set(owners))
    ctx.require(not extra, expected="only the dropped ids aborted",
                observed=f"unexpected ids {extra[:5]}")
    wrong = [(rid, r.rank, owners[rid]) for r in frames for rid in r.message.request_ids
             if owners.get(rid, r.rank) != r.rank]
    ctx.require(not wrong, expected="each ABORT at the engine that received the ADD",
                observed=f"(id, aborted at, owner): {wrong[:5]}")


async def _wait_aborted(ctx: CaseContext, group: EngineGroup, ids: set[str],
                        timeout: float = 3) -> None:
    await ctx.wait_until(lambda: ids <= set(group.transcript.aborted_ids()), timeout)


async def _settle_aborts(ctx: CaseContext, group: EngineGroup, owners: dict[str, int],
                         timeout: float = 3) -> None:
    """Wait (bounded) for every owed ABORT, then a quiet window for stray extra ones."""
    await _wait_aborted(ctx, group, set(owners), timeout)
    await ctx.quiet(0.1)


@case("abort.drop.single", Level.MUST,
      "Dropping one live stream sends one ABORT with its id to its engine.", source=PR,
      needs=DROP)
async def drop_single(ctx: CaseContext) -> None:
    group = await ctx.start(_holding())
    handles, owners = await _open_streams(ctx, group, 1)
    await ctx.driver.drop(handles)
    await _settle_aborts(ctx, group, owners)
    _check_exactly_once(ctx, group, owners)


@case("abort.burst.exactly_once", Level.MUST,
      "A burst of dropped streams across DP engines aborts each id exactly once, at its "
      "owning engine, never in an empty frame.", source=PR, needs=DROP)
async def burst_exactly_once(ctx: CaseContext) -> None:
    group = await ctx.start(_holding(2))
    handles, owners = await _open_streams(ctx, group, 8)
    await ctx.driver.drop(handles)
    await _settle_aborts(ctx, group, owners)
    _check_exactly_once(ctx, group, owners)


@case("abort.burst.over_1024", Level.MUST,
      "More than 1024 simultaneous drops are all aborted exactly once at their engine.",
      source=PR, needs=DROP, timeout=60)
async def burst_over_1024(ctx: CaseContext) -> None:
    group = await ctx.start(_holding())
    handles, owners = await _open_streams(ctx, group, 1100)
    await ctx.driver.drop(handles)
    await _wait_aborted(ctx, group, set(owners), timeout=10)
    await ctx.quiet(0.1)
    _check_exactly_once(ctx, group, owners)
    sizes = [len(r.message.request_ids) for r in group.transcript.abort_frames()]
    ctx.note(f"{len(sizes)} ABORT frames, largest {max(sizes)} ids")


@case("abort.finished.not_aborted", Level.MUST,
      "Dropping a stream that already finished sends no ABORT.", source=PR, needs=DROP)
async def finished_not_aborted(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    handle = await ctx.driver.generate(prompt(0), 3)
    await handle.wait(ctx.t(3))
    await ctx.driver.drop([handle])
    await ctx.quiet(0.3)
    ids = group.transcript.aborted_ids()
    ctx.require(not ids, expected="no ABORT for a finished request", observed=ids)


@case("abort.finished_and_live.mixed_drop", Level.MUST,
      "Dropping a mix of finished and live streams aborts only the live ones.", source=PR,
      needs=DROP)
async def mixed_drop(ctx: CaseContext) -> None:
    finished_prompt = prompt(99)
    script = EngineScript(rules=[any_request(hold())])
    script.rules.insert(0, by_prompt(finished_prompt, stream([100, 101])))
    group = await ctx.start([script])
    done = await ctx.driver.generate(finished_prompt, 2)
    await done.wait(ctx.t(3))
    handles, owners = await _open_streams(ctx, group, 3)
    await ctx.driver.drop([done, *handles])
    await _wait_aborted(ctx, group, set(owners))
    await ctx.quiet(0.2)
    _check_exactly_once(ctx, group, owners)


@case("abort.explicit.mix", Level.MUST,
      "Explicit abort of live, finished and unknown ids sends only the live id, to its "
      "owner, and ends that stream.", source=PR, needs=ABORT)
async def explicit_mix(ctx: CaseContext) -> None:
    finished_prompt = prompt(50)
    script = EngineScript(rules=[by_prompt(finished_prompt, stream([100])),
                                 any_request(hold())])
    group = await ctx.start([script])
    done = await ctx.driver.generate(finished_prompt, 1)
    await done.wait(ctx.t(3))
    handles, owners = await _open_streams(ctx, group, 1)
    finished = request_for(group, finished_prompt)
    ids = [*owners, finished[1] if finished else "x", "no-such-request"]
    await ctx.driver.abort(ids)
    await _wait_aborted(ctx, group, set(owners))
    await ctx.quiet(0.2)
    _check_exactly_once(ctx, group, owners)
    await handles[0].wait(ctx.t(2))
    ctx.require(handles[0].finish_reason in ("abort", None) or handles[0].error is not None,
                expected="the aborted stream ends", observed=handles[0].finish_reason)


@case("abort.explicit.grouped_by_engine", Level.MUST,
      "Explicit abort of ids on two engines sends each engine only its own ids.",
      source="rust-client.md §1.5 (multi_engine_abort_is_grouped...)", needs=ABORT)
async def explicit_grouped(ctx: CaseContext) -> None:
    group = await ctx.start(_holding(2))
    _handles, owners = await _open_streams(ctx, group, 4)
    await ctx.driver.abort(list(owners))
    await _settle_aborts(ctx, group, owners)
    _check_exactly_once(ctx, group, owners)


@case("abort.explicit.unknown_only", Level.MUST,
      "Explicitly aborting only unknown ids sends no ABORT frame at all (never an empty "
      "one).", source=PR, needs=ABORT)
async def explicit_unknown(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    await ctx.driver.abort(["no-such-request", "another-unknown"])
    await ctx.quiet(0.3)
    frames = group.transcript.abort_frames()
    ctx.require(not frames, expected="no ABORT frame",
                observed=[r.message.request_ids for r in frames])


@case("abort.explicit.then_drop_once", Level.MUST,
      "A stream aborted explicitly and then dropped is aborted exactly once.", source=PR,
      needs=[*ABORT, Capability.DROP])
async def abort_then_drop(ctx: CaseContext) -> None:
    group = await ctx.start(_holding())
    handles, owners = await _open_streams(ctx, group, 2)
    await ctx.driver.abort(list(owners))
    await ctx.driver.drop(handles)
    await _wait_aborted(ctx, group, set(owners))
    await ctx.quiet(0.3)
    _check_exactly_once(ctx, group, owners)


@case("abort.stop_string.aborts_engine", Level.MUST,
      "A stop string matched by the frontend ends the stream with 'stop' and aborts the "
      "request at its engine.", source="semantics.md (b); vllm/v1/engine/output_processor.py",
      needs=[Capability.GENERATE, Capability.STOP_STRINGS])
async def stop_string(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(trickle(0.01))])])
    p = prompt(0)
    handle = await ctx.driver.generate(p, 1000, stop=["t103"])
    await handle.wait(ctx.t(3))
    ctx.require(handle.finish_reason == "stop", expected="finish_reason stop",
                observed=f"{handle.finish_reason} error={handle.error}")
    found = request_for(group, p)
    ctx.require(found is not None, expected="an ADD", observed=None)
    assert found is not None
    await _wait_aborted(ctx, group, {found[1]})
    await ctx.quiet(0.1)
    _check_exactly_once(ctx, group, {found[1]: found[0]})


@case("abort.dead_engine.no_abort", Level.SHOULD,
      "After ENGINE_CORE_DEAD, dropped streams should not be aborted at the dead engine.",
      source="vllm/v1/engine/core_client.py abort_requests_async (0.33.0)",
      needs=[*DROP, Capability.ENGINE_DEATH])
async def dead_no_abort(ctx: CaseContext) -> None:
    group = await ctx.start(_holding())
    handles, _owners = await _open_streams(ctx, group, 2)
    group[0].send_dead()
    await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    await ctx.driver.drop(handles)
    await ctx.quiet(0.3)
    ids = group.transcript.aborted_ids()
    ctx.require(not ids, expected="no ABORT after engine death", observed=ids)




# abort.burst.shares_frame: a batching abort loop sends whatever queued up while it was away
# in one frame per engine; a never-batching one sends one frame per id whatever the timing.
# Each burst of drops of streaming requests is one more chance for drops to queue behind the
# loop (docs/abort-batching.md has the why and the 20-run tally under load).
SHARE_BURSTS = 6
SHARE_BURST_SIZE = 16


@case("abort.burst.shares_frame", Level.SHOULD,
      "Drops that queue up before the frontend's abort loop runs should leave together: "
      "over several bursts of streaming drops, some ABORT frame carries >= 2 ids.",
      source=f"{PR}; rust-client.md §1.5 (run_abort_loop recv_many); "
             "docs/abort-batching.md", needs=DROP, timeout=90)
async def burst_shares_frame(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(trickle(0.005))])])
    all_owners: dict[str, int] = {}
    per_burst: list[list[int]] = []
    for b in range(SHARE_BURSTS):
        handles, owners = await _open_streams(ctx, group, SHARE_BURST_SIZE,
                                              offset=b * SHARE_BURST_SIZE)
        before = len(group.transcript.abort_frames())
        await ctx.driver.drop(handles)
        await _settle_aborts(ctx, group, owners)
        all_owners.update(owners)
        per_burst.append([len(r.message.request_ids)
                          for r in group.transcript.abort_frames()[before:]])
    _check_exactly_once(ctx, group, all_owners)
    ctx.note(f"ABORT frame sizes per burst {per_burst}")
    ctx.require(any(n >= 2 for burst in per_burst for n in burst),
                expected="some ABORT frame with >= 2 ids",
                observed=f"only 1-id frames; sizes per burst {per_burst}")
