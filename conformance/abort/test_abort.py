"""Abort semantics (seed PR #44591; grounds below cite the vLLM 0.33.0 lines).

Hard rules: every dropped live stream is aborted exactly once, at the engine that owns it,
never in an empty frame, never for finished or unknown ids. Coalescing a burst into one
frame per engine is what vllm-rs does and AsyncLLM does not (one ABORT per cancelled
stream), so it is graded SHOULD.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, differ, engine, py, rs
from harness.cases.helpers import hold, prompt, request_for, requests_for, trickle
from harness.frontends.api import Capability, FrontendError, StreamHandle
from harness.results.records import Level
from mock_engines.group import EngineGroup
from mock_engines.script import EngineScript, any_request, by_prompt, stream

_AL = "vllm/v1/engine/async_llm.py"
_CC = "vllm/v1/engine/core_client.py"
_OP = "vllm/v1/engine/output_processor.py"
_IMP = "rust/src/engine-core-client/src/client/imp.rs"
_STREAM = "rust/src/engine-core-client/src/client/stream.rs"
_STATE = "rust/src/engine-core-client/src/client/state.rs"
_CLIENT = "rust/src/engine-core-client/src/client.rs"
_TESTS = "rust/src/engine-core-client/src/tests/client.rs"

# The engine finishes an ABORT's ids in its scheduler and skips ids it does not hold, so an
# ABORT at the wrong engine (or none) leaves the request generating for nobody.
_ENGINE_ABORT = (
    engine("vllm/v1/engine/core.py:1763", "self.abort_requests(request)"),
    engine("vllm/v1/core/sched/scheduler.py:2994",
           "if request is None or request.is_finished():"),
)

# A dropped live stream is aborted once, at the engine its ADD went to: Python's generate()
# aborts in its cancellation handler and routes by reqs_in_flight; the Rust stream's Drop queues
# the id for run_abort_loop, which takes the owning engine out of the registry.
DROP_ONCE = both(
    py(f"{_AL}:809", "await self.abort(q.request_id, internal=True)"),
    py(f"{_OP}:633", "req_state = self.request_states.pop(request_id, None)"),
    py(f"{_CC}:1345", "if request_ids and not self.resources.engine_dead:"),
    py(f"{_CC}:1884", "await self._abort_requests(request_ids, engine)"),
    rs(f"{_STREAM}:232", "let abort_req = AbortRequest {"),
    rs(f"{_IMP}:389", "let Some(engine_id) = inner.take_auto_abort_target(&request_id) else {"),
    rs(f"{_IMP}:335", "let (_, engine_id) = registry.remove(request_id)?;"),
    rs(f"{_TESTS}:1243", 'assert_eq!(aborted_ids, vec!["req-1".to_string()]);'),
    *_ENGINE_ABORT,
)

# A burst of drops over DP engines: each id once, at its owner, no empty frame (Python: one
# abort per stream via reqs_in_flight; Rust: run_abort_loop groups the drained ids per engine).
BURST_ONCE = both(
    py(f"{_AL}:809", "await self.abort(q.request_id, internal=True)"),
    py(f"{_CC}:1810", "self.reqs_in_flight[request.request_id] = chosen_engine"),
    py(f"{_CC}:1884", "await self._abort_requests(request_ids, engine)"),
    py(f"{_OP}:633", "req_state = self.request_states.pop(request_id, None)"),
    rs(f"{_IMP}:389", "let Some(engine_id) = inner.take_auto_abort_target(&request_id) else {"),
    rs(f"{_IMP}:406", "by_engine.entry(engine_id).or_default().push(request_id);"),
    rs(f"{_IMP}:410", "inner.do_abort_requests(&engine_id, &request_ids).await"),
    rs(f"{_TESTS}:1272", "async fn dropping_multiple_live_streams_aborts_all_in_a_burst()"),
    rs(f"{_TESTS}:1319", "// No spurious extra aborts."),
    *_ENGINE_ABORT,
)

# Dropping a stream whose request already ended sends nothing: Python's generate() returned on
# the finished output and the request left the output processor; the Rust stream is terminated
# and its registry entry was removed with the finished output.
FINISHED_DROP = both(
    py(f"{_AL}:800", "finished = out.finished"),
    py(f"{_OP}:919", "self.request_states.pop(req_id)"),
    py(f"{_OP}:634", "if req_state is not None:"),
    rs(f"{_STREAM}:224", "if self.is_terminated() {"),
    rs(f"{_STATE}:252", "if output.finished() {"),
    rs(f"{_IMP}:390", 'debug!(request_id, "skip auto-abort for inactive request");'),
)

# An explicit abort forwards only the ids the frontend still holds, each to its owner.
EXPLICIT_LIVE = both(
    py(f"{_AL}:955", "all_request_ids = self.output_processor.abort_requests(request_ids,"),
    py(f"{_OP}:633", "req_state = self.request_states.pop(request_id, None)"),
    py(f"{_OP}:636", "request_ids_to_abort.append(request_id)"),
    py(f"{_CC}:1895", "elif engine := self.reqs_in_flight.get(req_id):"),
    py(f"{_CC}:1897", "for engine, req_ids in by_engine.items():"),
    rs(f"{_STATE}:229", "let Some(tracked) = self.requests.get(request_id.as_str()) else {"),
    rs(f"{_CLIENT}:699", "for (engine_id, request_ids) in abortable {"),
    rs(f"{_TESTS}:2306", '"unknown".to_string(),'),
    *_ENGINE_ABORT,
)

# ... and ends each aborted stream with a final ABORT output (no error).
EXPLICIT_ENDS = both(
    *EXPLICIT_LIVE.cites,
    py(f"{_OP}:646", "finish_reason=FinishReason.ABORT,"),
    py(f"{_OP}:652", "req_state.queue.put(request_output)"),
    rs(f"{_CLIENT}:697", "self.inner.abort_requests_locally(&all_request_ids);"),
    rs(f"{_STATE}:369", "finish_reason: Some(EngineCoreFinishReason::Abort),"),
    rs(f"{_TESTS}:2325", "assert_eq!(final_2.finish_reason, Some(EngineCoreFinishReason::Abort));"),
)

# Ids owned by several engines are grouped: one ABORT per engine with only its own ids.
EXPLICIT_GROUPED = both(
    py(f"{_CC}:1887", "by_engine = defaultdict[EngineIdentity, list[str]](list)"),
    py(f"{_CC}:1895", "elif engine := self.reqs_in_flight.get(req_id):"),
    py(f"{_CC}:1898", "await self._abort_requests(req_ids, engine)"),
    rs(f"{_STATE}:226", "pub fn abortable_request_ids(&self, request_ids: &[String])"),
    rs(f"{_CLIENT}:699", "for (engine_id, request_ids) in abortable {"),
    rs(f"{_TESTS}:2166", "async fn multi_engine_abort_is_grouped_and_utility_fans_out_to_all"),
    *_ENGINE_ABORT,
)

# A request is aborted at most once: the first abort (explicit or by drop) takes it out of the
# frontend's table, so a later abort or drop finds nothing to send.
ABORT_ONCE = both(
    py(f"{_OP}:633", "req_state = self.request_states.pop(request_id, None)"),
    py(f"{_CC}:1345", "if request_ids and not self.resources.engine_dead:"),
    rs(f"{_STATE}:360", "let Some((mut sender, engine_id)) = self.remove(request_id) else {"),
    rs(f"{_IMP}:335", "let (_, engine_id) = registry.remove(request_id)?;"),
    rs(f"{_IMP}:390", 'debug!(request_id, "skip auto-abort for inactive request");'),
    rs(f"{_CLIENT}:691", "if abortable.is_empty() {"),
)

# A stop string matched in the frontend ends the stream with STOP and aborts the engine's
# request (the engine has not finished it).
STOP_STRING = both(
    py(f"{_OP}:829", "finish_reason = FinishReason.STOP"),
    py(f"{_OP}:878", "if req_state.streaming_input or not engine_core_output.finished:"),
    py(f"{_AL}:920", "await engine_core.abort_requests_async("),
    rs("rust/src/text/src/output/decoded.rs:302",
       "AbortCause::StopStringMatched.drop_as(raw_stream);"),
    rs(f"{_IMP}:398", "AbortCause::StopStringMatched => {"),
    rs("rust/src/llm/src/output.rs:529",
       "AbortCause::StopStringMatched => FinishReason::Stop(None),"),
    *_ENGINE_ABORT,
)

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
      "Dropping one live stream sends one ABORT with its id to its engine.",
      grounds=DROP_ONCE, needs=DROP)
async def drop_single(ctx: CaseContext) -> None:
    group = await ctx.start(_holding())
    handles, owners = await _open_streams(ctx, group, 1)
    await ctx.driver.drop(handles)
    await _settle_aborts(ctx, group, owners)
    _check_exactly_once(ctx, group, owners)


@case("abort.burst.exactly_once", Level.MUST,
      "A burst of dropped streams across DP engines aborts each id exactly once, at its "
      "owning engine, never in an empty frame.", grounds=BURST_ONCE, needs=DROP)
async def burst_exactly_once(ctx: CaseContext) -> None:
    group = await ctx.start(_holding(2))
    handles, owners = await _open_streams(ctx, group, 8)
    await ctx.driver.drop(handles)
    await _settle_aborts(ctx, group, owners)
    _check_exactly_once(ctx, group, owners)


@case("abort.burst.over_1024", Level.MUST,
      "More than 1024 simultaneous drops are all aborted exactly once at their engine.",
      grounds=both(
          py(f"{_AL}:809", "await self.abort(q.request_id, internal=True)"),
          rs(f"{_IMP}:382", "const MAX_DRAIN: usize = 1024;"),
          rs(f"{_IMP}:385", "while abort_rx.recv_many(&mut batch, MAX_DRAIN).await > 0 {"),
          *_ENGINE_ABORT,
      ), needs=DROP, timeout=60)
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
      "Dropping a stream that already finished sends no ABORT.", grounds=FINISHED_DROP,
      needs=DROP)
async def finished_not_aborted(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    handle = await ctx.driver.generate(prompt(0), 3)
    await handle.wait(ctx.t(3))
    await ctx.driver.drop([handle])
    await ctx.quiet(0.3)
    ids = group.transcript.aborted_ids()
    ctx.require(not ids, expected="no ABORT for a finished request", observed=ids)


@case("abort.finished_and_live.mixed_drop", Level.MUST,
      "Dropping a mix of finished and live streams aborts only the live ones.",
      grounds=both(*FINISHED_DROP.cites, *DROP_ONCE.cites), needs=DROP)
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
      "owner, and ends that stream.", grounds=EXPLICIT_ENDS, needs=ABORT)
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
      grounds=EXPLICIT_GROUPED, needs=ABORT)
async def explicit_grouped(ctx: CaseContext) -> None:
    group = await ctx.start(_holding(2))
    _handles, owners = await _open_streams(ctx, group, 4)
    await ctx.driver.abort(list(owners))
    await _settle_aborts(ctx, group, owners)
    _check_exactly_once(ctx, group, owners)


@case("abort.explicit.unknown_only", Level.MUST,
      "Explicitly aborting only unknown ids sends no ABORT frame at all (never an empty "
      "one).",
      grounds=both(
          py(f"{_OP}:634", "if req_state is not None:"),
          py(f"{_CC}:1345", "if request_ids and not self.resources.engine_dead:"),
          py(f"{_CC}:1875", "if not request_ids or self.resources.engine_dead:"),
          rs(f"{_STATE}:229", "let Some(tracked) = self.requests.get(request_id.as_str()) else {"),
          rs(f"{_CLIENT}:691", "if abortable.is_empty() {"),
          rs("rust/src/llm/src/lib.rs:160", "if internal_ids.is_empty() {"),
      ), needs=ABORT)
async def explicit_unknown(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    await ctx.driver.abort(["no-such-request", "another-unknown"])
    await ctx.quiet(0.3)
    frames = group.transcript.abort_frames()
    ctx.require(not frames, expected="no ABORT frame",
                observed=[r.message.request_ids for r in frames])


@case("abort.explicit.then_drop_once", Level.MUST,
      "A stream aborted explicitly and then dropped is aborted exactly once.",
      grounds=ABORT_ONCE,
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
      "request at its engine.", grounds=STOP_STRING,
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


@case("abort.dead_engine.no_abort", Level.MUST,
      "After ENGINE_CORE_DEAD, dropped streams are not aborted at the dead engine.",
      grounds=both(
          py(f"{_AL}:814", "# Engine is dead. Do not abort since we shut down."),
          py(f"{_CC}:1345", "if request_ids and not self.resources.engine_dead:"),
          py(f"{_CC}:1875", "if not request_ids or self.resources.engine_dead:"),
          rs(f"{_IMP}:218", "let request_senders = self.request_reg.lock().close();"),
          rs(f"{_IMP}:336", "if registry.is_closed() {"),
          rs(f"{_STREAM}:224", "if self.is_terminated() {"),
      ),
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


@case("abort.dead_engine.explicit_no_abort", Level.MUST,
      "After ENGINE_CORE_DEAD ended the streams, an explicit abort of their ids sends no "
      "ABORT and returns (or fails) within 2 s instead of hanging.",
      grounds=both(
          py(f"{_CC}:1875", "if not request_ids or self.resources.engine_dead:"),
          rs(f"{_IMP}:218", "let request_senders = self.request_reg.lock().close();"),
          rs("rust/src/engine-core-client/src/client.rs:687",
             "let abortable = self.inner.abortable_request_ids(ids)?;"),
      ),
      needs=[*ABORT, Capability.ENGINE_DEATH])
async def dead_explicit_no_abort(ctx: CaseContext) -> None:
    group = await ctx.start(_holding())
    handles, owners = await _open_streams(ctx, group, 2)
    group[0].send_dead()
    await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    try:
        await asyncio.wait_for(ctx.driver.abort(list(owners)), ctx.t(2))
    except FrontendError as exc:
        ctx.note(f"abort after death refused: {exc}")
    except TimeoutError:
        ctx.require(False, expected="the abort returns or fails within 2 s",
                    observed="still waiting after 2 s")
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
      grounds=differ(
          py(f"{_AL}:809", "await self.abort(q.request_id, internal=True)"),
          rs(f"{_IMP}:377", "Coalesce bursts of auto-aborts into a single Abort message"),
          rs(f"{_IMP}:385", "while abort_rx.recv_many(&mut batch, MAX_DRAIN).await > 0 {"),
          rs(f"{_IMP}:406", "by_engine.entry(engine_id).or_default().push(request_id);"),
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
