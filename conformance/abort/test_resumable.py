"""Aborts of streaming-input sessions reach every engine.

A continuation in flight when a session ends may re-create it on any engine, so vLLM's
Python client aborts a session's id at every engine (core_client.py:1889-1894), whether
the session is mid-segment or between segments. vllm-rs 0.33.0 has no streaming-input
sessions at all (every request it builds is resumable: false): UNSUPPORTED there.
"""

from __future__ import annotations

from conformance.abort.helpers import AL, CC
from harness.cases.authoring import Capability, CaseContext, Level, case, engine, only, py, rs
from harness.cases.resumable import finish_segment, open_first_segment, scripts

NEEDS = [Capability.STREAMING_INPUT, Capability.DROP]

SESSION_ABORT = only(
    py(f"{CC}:1753", "self.streaming_reqs.add(request.request_id)"),
    py(f"{CC}:1889", "if req_id in self.streaming_reqs:"),
    py(f"{CC}:1892", "self.streaming_reqs.discard(req_id)"),
    py(f"{CC}:1893", "for engine in self.core_engines:"),
    py(f"{AL}:809", "await self.abort(q.request_id, internal=True)"),
    rs("rust/src/llm/src/request.rs:121", "resumable: false,"),
    engine("vllm/v1/core/sched/scheduler.py:2946", "if request.resumable:"),
    engine("vllm/v1/core/sched/scheduler.py:2739",
           "request.status = RequestStatus.WAITING_FOR_STREAMING_REQ"),
    note="rust has no streaming-input sessions (it sends every request resumable: false, "
         "llm/src/request.rs:121), so only python can hold the rule, and does "
         "(core_client.py:1889-1894); a frontend with sessions that aborts one only at its "
         "owning engine leaves a session that an in-flight chunk re-created on another engine "
         "(scheduler.py:2946) parked in WAITING_FOR_STREAMING_REQ for ever "
         "(scheduler.py:2739): an engine left in a wrong state, holding its slot and KV",
)


@case("abort.resumable.drop_{phase}_{engines}_engines", Level.MUST,
      "With {engines} engine(s), dropping a streaming-input session "
      "{when} aborts its id at every engine, exactly once each.",
      grounds=SESSION_ABORT, needs=NEEDS,
      params=[{"phase": phase, "when": phase.replace("_", " "), "engines": n}
              for phase in ("mid_segment", "between_segments") for n in (1, 2, 3, 4)])
async def drop_session(ctx: CaseContext, phase: str, engines: int) -> None:
    held = (0,) if phase == "mid_segment" else ()
    group = await ctx.start(scripts(engines, 1, 1, held=held))
    handle, rid = await open_first_segment(ctx, group)
    if phase == "mid_segment":
        await ctx.wait_until(lambda: len(handle.tokens) >= 2, 3)
    else:
        await finish_segment(ctx, group, handle, rid, 1, 2)
        await ctx.quiet(0.1)
    ctx.require(not handle.ended, expected="the session's stream open before the drop",
                observed=f"ended {handle.finish_reason!r} ({handle.error})")
    await ctx.driver.drop([handle])
    ranks = [e.rank for e in group.engines]

    def counts() -> dict[int, int]:
        return {r: group.transcript.aborted_ids(r).count(rid) for r in ranks}

    await ctx.wait_until(lambda: all(counts().values()), 3)
    await ctx.quiet(0.2)
    ctx.require(all(n == 1 for n in counts().values()),
                expected=f"one ABORT naming {rid} at each engine {ranks}",
                observed=f"ABORTs naming it per engine: {counts()}")
