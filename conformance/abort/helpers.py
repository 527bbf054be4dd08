"""What the abort area's case files share: the grounds several of them cite, the capability
sets, and the opening and closing moves of most abort cases.

The hard rule every abort case checks in the end (`check_exactly_once`): each dropped or
aborted live stream is aborted exactly once, at the engine that owns it, never in an empty
frame, never for finished or unknown ids (seed PR #44591; the grounds cite the vLLM 0.33.0
lines).
"""

from __future__ import annotations

from collections import Counter

from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineGroup,
    EngineScript,
    StreamHandle,
    any_request,
    both,
    engine,
    hold,
    prompt,
    py,
    requests_for,
    rs,
)

# The vLLM 0.33.0 files the abort grounds cite.
AL = "vllm/v1/engine/async_llm.py"
CC = "vllm/v1/engine/core_client.py"
OP = "vllm/v1/engine/output_processor.py"
IMP = "rust/src/engine-core-client/src/client/imp.rs"
STREAM = "rust/src/engine-core-client/src/client/stream.rs"
STATE = "rust/src/engine-core-client/src/client/state.rs"
CLIENT = "rust/src/engine-core-client/src/client.rs"
TESTS = "rust/src/engine-core-client/src/tests/client.rs"

# The engine finishes an ABORT's ids in its scheduler and skips ids it does not hold, so an
# ABORT at the wrong engine (or none) leaves the request generating for nobody.
ENGINE_ABORT = (
    engine("vllm/v1/engine/core.py:1763", "self.abort_requests(request)"),
    engine("vllm/v1/core/sched/scheduler.py:2994",
           "if request is None or request.is_finished():"),
)

# A dropped live stream is aborted once, at the engine its ADD went to: Python's generate()
# aborts in its cancellation handler and routes by reqs_in_flight; the Rust stream's Drop queues
# the id for run_abort_loop, which takes the owning engine out of the registry.
DROP_ONCE = both(
    py(f"{AL}:809", "await self.abort(q.request_id, internal=True)"),
    py(f"{OP}:633", "req_state = self.request_states.pop(request_id, None)"),
    py(f"{CC}:1345", "if request_ids and not self.resources.engine_dead:"),
    py(f"{CC}:1884", "await self._abort_requests(request_ids, engine)"),
    rs(f"{STREAM}:232", "let abort_req = AbortRequest {"),
    rs(f"{IMP}:389", "let Some(engine_id) = inner.take_auto_abort_target(&request_id) else {"),
    rs(f"{IMP}:335", "let (_, engine_id) = registry.remove(request_id)?;"),
    rs(f"{TESTS}:1243", 'assert_eq!(aborted_ids, vec!["req-1".to_string()]);'),
    *ENGINE_ABORT,
)

# A burst of drops over DP engines: each id once, at its owner, no empty frame (Python: one
# abort per stream via reqs_in_flight; Rust: run_abort_loop groups the drained ids per engine).
BURST_ONCE = both(
    py(f"{AL}:809", "await self.abort(q.request_id, internal=True)"),
    py(f"{CC}:1810", "self.reqs_in_flight[request.request_id] = chosen_engine"),
    py(f"{CC}:1884", "await self._abort_requests(request_ids, engine)"),
    py(f"{OP}:633", "req_state = self.request_states.pop(request_id, None)"),
    rs(f"{IMP}:389", "let Some(engine_id) = inner.take_auto_abort_target(&request_id) else {"),
    rs(f"{IMP}:406", "by_engine.entry(engine_id).or_default().push(request_id);"),
    rs(f"{IMP}:410", "inner.do_abort_requests(&engine_id, &request_ids).await"),
    rs(f"{TESTS}:1272", "async fn dropping_multiple_live_streams_aborts_all_in_a_burst()"),
    rs(f"{TESTS}:1319", "// No spurious extra aborts."),
    *ENGINE_ABORT,
)

# Dropping a stream whose request already ended sends nothing: Python's generate() returned on
# the finished output and the request left the output processor; the Rust stream is terminated
# and its registry entry was removed with the finished output.
FINISHED_DROP = both(
    py(f"{AL}:800", "finished = out.finished"),
    py(f"{OP}:919", "self.request_states.pop(req_id)"),
    py(f"{OP}:634", "if req_state is not None:"),
    rs(f"{STREAM}:224", "if self.is_terminated() {"),
    rs(f"{STATE}:252", "if output.finished() {"),
    rs(f"{IMP}:390", 'debug!(request_id, "skip auto-abort for inactive request");'),
)

# An explicit abort forwards only the ids the frontend still holds, each to its owner ...
EXPLICIT_LIVE = both(
    py(f"{AL}:955", "all_request_ids = self.output_processor.abort_requests(request_ids,"),
    py(f"{OP}:633", "req_state = self.request_states.pop(request_id, None)"),
    py(f"{OP}:636", "request_ids_to_abort.append(request_id)"),
    py(f"{CC}:1895", "elif engine := self.reqs_in_flight.get(req_id):"),
    py(f"{CC}:1897", "for engine, req_ids in by_engine.items():"),
    rs(f"{STATE}:229", "let Some(tracked) = self.requests.get(request_id.as_str()) else {"),
    rs(f"{CLIENT}:699", "for (engine_id, request_ids) in abortable {"),
    rs(f"{TESTS}:2306", '"unknown".to_string(),'),
    *ENGINE_ABORT,
)

# ... and ends each aborted stream with a final ABORT output (no error).
EXPLICIT_ENDS = both(
    *EXPLICIT_LIVE.cites,
    py(f"{OP}:646", "finish_reason=FinishReason.ABORT,"),
    py(f"{OP}:652", "req_state.queue.put(request_output)"),
    rs(f"{CLIENT}:697", "self.inner.abort_requests_locally(&all_request_ids);"),
    rs(f"{STATE}:369", "finish_reason: Some(EngineCoreFinishReason::Abort),"),
    rs(f"{TESTS}:2325", "assert_eq!(final_2.finish_reason, Some(EngineCoreFinishReason::Abort));"),
)

# A request is aborted at most once: the first abort (explicit or by drop) takes it out of the
# frontend's table, so a later abort or drop finds nothing to send.
ABORT_ONCE = both(
    py(f"{OP}:633", "req_state = self.request_states.pop(request_id, None)"),
    py(f"{CC}:1345", "if request_ids and not self.resources.engine_dead:"),
    rs(f"{STATE}:360", "let Some((mut sender, engine_id)) = self.remove(request_id) else {"),
    rs(f"{IMP}:335", "let (_, engine_id) = registry.remove(request_id)?;"),
    rs(f"{IMP}:390", 'debug!(request_id, "skip auto-abort for inactive request");'),
    rs(f"{CLIENT}:691", "if abortable.is_empty() {"),
)

DROP = [Capability.GENERATE, Capability.DROP]
ABORT = [Capability.GENERATE, Capability.ABORT]


def holding(n: int = 1) -> list[EngineScript]:
    """`n` engines that answer every request with a first token and then hold it open."""
    return [EngineScript(rules=[any_request(hold())]) for _ in range(n)]


async def open_streams(ctx: CaseContext, group: EngineGroup, count: int, offset: int = 0
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


async def open_pinned(ctx: CaseContext, group: EngineGroup, per_engine: list[int]
                      ) -> tuple[list[StreamHandle], dict[str, int]]:
    """Open `per_engine[r]` held streams pinned to engine r with data_parallel_rank."""
    prompts: list[list[int]] = []
    handles: list[StreamHandle] = []
    for rank, count in enumerate(per_engine):
        for _ in range(count):
            prompts.append(prompt(len(prompts)))
            handles.append(await ctx.driver.generate(prompts[-1], 100,
                                                     data_parallel_rank=rank))
    for h in handles:
        await h.wait_first(ctx.t(5))
    await ctx.wait_until(lambda: requests_for(group, prompts) is not None, 3)
    owners = requests_for(group, prompts) or {}
    ctx.require(len(owners) == len(prompts), expected=f"{len(prompts)} ADDs",
                observed=len(owners))
    placed = [sum(1 for r in owners.values() if r == rank) for rank in range(len(per_engine))]
    ctx.require(placed == per_engine, expected=f"streams per engine {per_engine}",
                observed=placed)
    return handles, owners


def check_exactly_once(ctx: CaseContext, group: EngineGroup, owners: dict[str, int]) -> None:
    """Every id of `owners` aborted once, at its owning engine; no other id, no empty frame."""
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


async def wait_aborted(ctx: CaseContext, group: EngineGroup, ids: set[str],
                       timeout: float = 3) -> None:
    """Wait (bounded) until every id of `ids` was named by some ABORT."""
    await ctx.wait_until(lambda: ids <= set(group.transcript.aborted_ids()), timeout)


async def settle_aborts(ctx: CaseContext, group: EngineGroup, owners: dict[str, int],
                        timeout: float = 3) -> None:
    """Wait (bounded) for every owed ABORT, then a quiet window for stray extra ones."""
    await wait_aborted(ctx, group, set(owners), timeout)
    await ctx.quiet(0.1)
