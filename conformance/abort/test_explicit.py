"""Explicit aborts: only the live ids of the list, each once at its owner, streams end 'abort'.

An explicit abort names ids the frontend may no longer know (finished, already aborted,
never issued). vLLM's clients skip those per id and still abort every live id of the list,
wherever it stands in the list and on whichever engine it lives (output_processor.py:633-636
keeps only live ids, core_client.py:1887-1898 groups them per engine; the Rust client's
abortable_request_ids, state.rs:226-236, skips unknown ids one by one). A port that stops at
the first unknown id leaves the live ones running on their engines; one that forwards the
whole list sends engines ids they never held; one that matches ids by prefix aborts a
neighbour. Ids on several engines are grouped: one ABORT per engine with only its own ids.
"""

from __future__ import annotations

from collections import Counter

from conformance.abort.helpers import (
    ABORT,
    CC,
    CLIENT,
    ENGINE_ABORT,
    EXPLICIT_ENDS,
    OP,
    STATE,
    TESTS,
    check_exactly_once,
    holding,
    open_pinned,
    open_streams,
    settle_aborts,
    wait_aborted,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineGroup,
    EngineScript,
    Level,
    StreamHandle,
    any_request,
    both,
    by_prompt,
    case,
    defect,
    engine,
    hold,
    prompt,
    py,
    request_for,
    requests_for,
    rs,
    stream,
)

# Ids owned by several engines are grouped: one ABORT per engine with only its own ids.
EXPLICIT_GROUPED = both(
    py(f"{CC}:1887", "by_engine = defaultdict[EngineIdentity, list[str]](list)"),
    py(f"{CC}:1895", "elif engine := self.reqs_in_flight.get(req_id):"),
    py(f"{CC}:1898", "await self._abort_requests(req_ids, engine)"),
    rs(f"{STATE}:226", "pub fn abortable_request_ids(&self, request_ids: &[String])"),
    rs(f"{CLIENT}:699", "for (engine_id, request_ids) in abortable {"),
    rs(f"{TESTS}:2166", "async fn multi_engine_abort_is_grouped_and_utility_fans_out_to_all"),
    *ENGINE_ABORT,
)

# An abort list that names a live id twice: rust skips per id and forwards the rest (the
# engine skips an id it no longer holds); python's OutputProcessor.abort_requests raises on
# the repeat before anything is aborted.
REPEATED_ID = defect(
    py(f"{OP}:621", "if req_state := self.request_states.get(request_id):"),
    py(f"{OP}:624", "internal_ids.remove(request_id)"),
    py(f"{OP}:633", "req_state = self.request_states.pop(request_id, None)"),
    rs(f"{STATE}:229", "let Some(tracked) = self.requests.get(request_id.as_str()) else {"),
    engine("vllm/v1/core/sched/scheduler.py:2994",
           "if request is None or request.is_finished():"),
    note="python deviates: AsyncLLM.abort(ids, internal=True) with an id named twice looks "
         "the request up again on the repeat (output_processor.py:621, its state is popped "
         "only in the second loop, :633) and removes it from the external-id mapping a second "
         "time (:624): ValueError before any ABORT is sent, so every live id of the call keeps "
         "running (lost abort). rust looks each id up and forwards it to its engine "
         "(state.rs:229), which skips an id it no longer holds (scheduler.py:2994). vLLM's own "
         "callers pass unique internal ids; a client-supplied list reaches this path through "
         "the engine client's public abort()")

# Where the ids the frontend no longer knows stand in the abort list, relative to the live
# ones: the live ids must be aborted in every arrangement.
ORDERS = {
    "unknown_first": ("unknown", "live0", "live1"),
    "finished_first": ("finished", "live0", "live1"),
    "stale_between": ("live0", "finished", "unknown", "live1"),
    "stale_last": ("live0", "live1", "finished", "unknown"),
}


async def _live_pair(ctx: CaseContext, group: EngineGroup
                     ) -> tuple[list[list[int]], list[StreamHandle], dict[str, int]]:
    """Two live streams, each past its first token, with their ADDs at the engines:
    (prompts, handles, {engine-side id: owning rank})."""
    live_prompts = [prompt(i) for i in range(2)]
    handles = [await ctx.driver.generate(p, 100) for p in live_prompts]
    for h in handles:
        await h.wait_first(ctx.t(5))
    ok = await ctx.wait_until(lambda: requests_for(group, live_prompts) is not None, 3)
    ctx.require(ok, expected="both live ADDs at the engines",
                observed=len(group.transcript.adds()))
    return live_prompts, handles, requests_for(group, live_prompts) or {}


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
    handles, owners = await open_streams(ctx, group, 1)
    finished = request_for(group, finished_prompt)
    ids = [*owners, finished[1] if finished else "x", "no-such-request"]
    await ctx.driver.abort(ids)
    await wait_aborted(ctx, group, set(owners))
    await ctx.quiet(0.2)
    check_exactly_once(ctx, group, owners)
    await handles[0].wait(ctx.t(2))
    ctx.require(handles[0].finish_reason in ("abort", None) or handles[0].error is not None,
                expected="the aborted stream ends", observed=handles[0].finish_reason)


@case("abort.explicit.grouped_by_engine", Level.MUST,
      "Explicit abort of ids on two engines sends each engine only its own ids.",
      grounds=EXPLICIT_GROUPED, needs=ABORT)
async def explicit_grouped(ctx: CaseContext) -> None:
    group = await ctx.start(holding(2))
    _handles, owners = await open_streams(ctx, group, 4)
    await ctx.driver.abort(list(owners))
    await settle_aborts(ctx, group, owners)
    check_exactly_once(ctx, group, owners)


@case("abort.explicit.three_engines_one_call", Level.MUST,
      "One explicit abort naming ids owned by three engines sends each engine only its own "
      "ids, once.", grounds=EXPLICIT_GROUPED,
      needs=[*ABORT, Capability.DP_RANK])
async def explicit_three_engines(ctx: CaseContext) -> None:
    group = await ctx.start(holding(3))
    _handles, owners = await open_pinned(ctx, group, [3, 1, 2])
    await ctx.driver.abort(sorted(owners, reverse=True))
    await settle_aborts(ctx, group, owners)
    check_exactly_once(ctx, group, owners)


@case("abort.explicit.unknown_only", Level.MUST,
      "Explicitly aborting only unknown ids sends no ABORT frame at all (never an empty "
      "one).",
      grounds=both(
          py(f"{OP}:634", "if req_state is not None:"),
          py(f"{CC}:1345", "if request_ids and not self.resources.engine_dead:"),
          py(f"{CC}:1875", "if not request_ids or self.resources.engine_dead:"),
          rs(f"{STATE}:229", "let Some(tracked) = self.requests.get(request_id.as_str()) else {"),
          rs(f"{CLIENT}:691", "if abortable.is_empty() {"),
          rs("rust/src/llm/src/lib.rs:160", "if internal_ids.is_empty() {"),
      ), needs=ABORT)
async def explicit_unknown(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    await ctx.driver.abort(["no-such-request", "another-unknown"])
    await ctx.quiet(0.3)
    frames = group.transcript.abort_frames()
    ctx.require(not frames, expected="no ABORT frame",
                observed=[r.message.request_ids for r in frames])


@case("abort.explicit.prefix_related_id_spared", Level.MUST,
      "Two live requests whose client ids are 'cwp' and 'cwp-1' (one a prefix of the other): "
      "an explicit abort of the first's id aborts it alone; the second gets no ABORT and keeps "
      "streaming (ids are matched exactly, never by prefix).",
      grounds=EXPLICIT_ENDS, needs=[*ABORT, Capability.CLIENT_REQUEST_ID])
async def prefix_related_id_spared(ctx: CaseContext) -> None:
    group = await ctx.start(holding())
    prompts = [prompt(0), prompt(1)]
    handles = [await ctx.driver.generate(p, 100, request_id=client_id)
               for p, client_id in zip(prompts, ("cwp", "cwp-1"), strict=True)]
    for h in handles:
        await h.wait_first(ctx.t(5))
    found = [request_for(group, p) for p in prompts]
    ctx.require(all(found), expected="both ADDs at the engine", observed=found)
    if not all(found):
        return
    target, other = (f[1] for f in found if f is not None)
    await ctx.driver.abort([target])
    await ctx.wait_until(lambda: target in group.transcript.aborted_ids(), 3)
    await ctx.quiet(0.2)
    ids = group.transcript.aborted_ids()
    ctx.require(ids == [target], expected=f"one ABORT naming {target} only",
                observed=f"ABORTed ids {ids}")
    ctx.require(not handles[1].ended, expected="the other request ('cwp-1') still streaming",
                observed=f"ended {handles[1].finish_reason!r} error {handles[1].error!r}")
    ctx.note(f"engine-side ids: {target}, {other}")


@case("abort.explicit_list.{name}_{engines}_engines", Level.MUST,
      "With {engines} engine(s), an explicit abort of the list {order} (finished "
      "and never-issued ids mixed in) aborts both live ids exactly once, each at its "
      "own engine, and nothing else.", grounds=EXPLICIT_ENDS, needs=ABORT,
      params=[{"name": name, "order": list(order), "engines": engines}
              for name, order in ORDERS.items() for engines in (1, 2)])
async def explicit_list(ctx: CaseContext, order: list[str], engines: int) -> None:
    finished_prompt = prompt(50)
    rules = [by_prompt(finished_prompt, stream([100])), any_request(hold())]
    group = await ctx.start([EngineScript(rules=list(rules)) for _ in range(engines)])
    done = await ctx.driver.generate(finished_prompt, 1)
    await done.wait(ctx.t(3))
    live_prompts, handles, owners = await _live_pair(ctx, group)
    found_live = [request_for(group, p) for p in live_prompts]
    live_ids = [f[1] if f else f"missing-{i}" for i, f in enumerate(found_live)]
    finished = request_for(group, finished_prompt)
    names = {"live0": live_ids[0], "live1": live_ids[1],
             "finished": finished[1] if finished else "finished-unknown",
             "unknown": "no-such-request"}
    await ctx.driver.abort([names[k] for k in order])
    await ctx.wait_until(lambda: set(owners) <= set(group.transcript.aborted_ids()), 3)
    await ctx.quiet(0.2)
    sent = Counter((rid, r.rank) for r in group.transcript.abort_frames()
                   for rid in r.message.request_ids)
    want = Counter(owners.items())
    ctx.require(sent == want, expected=f"each live id once at its owner {sorted(want)}",
                observed=f"(id, rank) aborted: {sorted(sent.items())}")
    ended = await ctx.wait_until(lambda: all(h.ended for h in handles), 2)
    ctx.require(ended, expected="both aborted streams end",
                observed=[(h.finish_reason, h.error) for h in handles])


@case("abort.explicit_list.same_live_id_twice_{engines}_engines", Level.MUST,
      "With {engines} engine(s), an explicit abort naming one live id twice "
      "([live0, live0, live1]) aborts both live ids at their own engines and nothing "
      "else, and ends both streams 'abort': the repeat neither fails the call nor "
      "spills to another engine (the repeat may be forwarded: vllm-rs does not dedupe, "
      "state.rs:226-236, the engine skips an id it no longer holds).",
      grounds=REPEATED_ID, needs=ABORT, params=[{"engines": n} for n in (1, 2)])
async def explicit_list_same_live_twice(ctx: CaseContext, engines: int) -> None:
    group = await ctx.start(holding(engines))
    live_prompts, handles, owners = await _live_pair(ctx, group)
    live = [f[1] if (f := request_for(group, p)) else f"missing-{i}"
            for i, p in enumerate(live_prompts)]
    await ctx.driver.abort([live[0], live[0], live[1]])
    await ctx.wait_until(lambda: set(owners) <= set(group.transcript.aborted_ids()), 3)
    await ctx.quiet(0.2)
    sent = Counter((rid, r.rank) for r in group.transcript.abort_frames()
                   for rid in r.message.request_ids)
    wrong = sorted(pair for pair in sent if pair not in owners.items())
    missing = sorted(pair for pair in owners.items() if pair not in sent)
    ctx.require(not wrong and not missing and sent[(live[1], owners.get(live[1], -1))] == 1,
                expected=f"both live ids at their owners {sorted(owners.items())}, the "
                         "unrepeated one once, nothing else",
                observed=f"(id, rank) aborted: {sorted(sent.items())}")
    ended = await ctx.wait_until(lambda: all(h.ended for h in handles), 2)
    seen = [(h.finish_reason, h.error) for h in handles]
    ctx.require(ended and all(x == ("abort", None) for x in seen),
                expected="both streams end 'abort'", observed=seen)


@case("abort.explicit_list.streams_end_abort", Level.MUST,
      "Streams ended by an explicit abort (live ids on 2 engines, listed after a stale id) "
      "end with finish_reason 'abort' and no error: the client can tell an abort from a "
      "completion or a failure.",
      grounds=EXPLICIT_ENDS, needs=ABORT)
async def explicit_list_streams_end_abort(ctx: CaseContext) -> None:
    group = await ctx.start(holding(2))
    _live_prompts, handles, owners = await _live_pair(ctx, group)
    await ctx.driver.abort(["no-such-request", *owners])
    ended = await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    ctx.require(ended, expected="both aborted streams end",
                observed=[(h.ended, h.finish_reason) for h in handles])
    seen = [(h.finish_reason, h.error) for h in handles]
    ctx.require(all(s == ("abort", None) for s in seen),
                expected="finish_reason 'abort', no error, on both streams",
                observed=f"(finish_reason, error): {seen}")
