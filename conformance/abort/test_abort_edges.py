"""Explicit abort lists whose order a port gets wrong.

An explicit abort names ids the frontend may no longer know (finished, already aborted,
never issued). vLLM's clients skip those per id and still abort every live id of the list,
wherever it stands in the list and on whichever engine it lives (output_processor.py:633-636
keeps only live ids, core_client.py:1887-1898 groups them per engine; the Rust client's
abortable_request_ids, state.rs:226-236, skips unknown ids one by one).
A port that stops at the first unknown id leaves the live ones running on their engines.
"""

from __future__ import annotations

from collections import Counter

from conformance.abort.test_abort import EXPLICIT_ENDS
from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import defect, engine, py, rs
from harness.cases.helpers import hold, prompt, request_for, requests_for
from harness.frontends.api import Capability, StreamHandle
from harness.results.records import Level
from mock_engines.group import EngineGroup
from mock_engines.script import EngineScript, any_request, by_prompt, stream

ABORT = [Capability.GENERATE, Capability.ABORT]

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


def _make_order_case(name: str, order: tuple[str, ...], engines: int) -> None:
    @case(f"abort.explicit_list.{name}_{engines}_engines", Level.MUST,
          f"With {engines} engine(s), an explicit abort of the list {list(order)} (finished "
          "and never-issued ids mixed in) aborts both live ids exactly once, each at its "
          "own engine, and nothing else.", grounds=EXPLICIT_ENDS, needs=ABORT)
    async def run(ctx: CaseContext) -> None:
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

    run.__name__ = run.__qualname__ = f"explicit_list_{name}_{engines}"
    globals()[run.__name__] = run


for _name, _order in ORDERS.items():
    for _engines in (1, 2):
        _make_order_case(_name, _order, _engines)


# An abort list that names a live id twice: rust skips per id and forwards the rest (the
# engine skips an id it no longer holds); python's OutputProcessor.abort_requests raises on
# the repeat before anything is aborted.
REPEATED_ID = defect(
    py("vllm/v1/engine/output_processor.py:621",
       "if req_state := self.request_states.get(request_id):"),
    py("vllm/v1/engine/output_processor.py:624", "internal_ids.remove(request_id)"),
    py("vllm/v1/engine/output_processor.py:633",
       "req_state = self.request_states.pop(request_id, None)"),
    rs("rust/src/engine-core-client/src/client/state.rs:229",
       "let Some(tracked) = self.requests.get(request_id.as_str()) else {"),
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


def _make_repeat_case(engines: int) -> None:
    @case(f"abort.explicit_list.same_live_id_twice_{engines}_engines", Level.MUST,
          f"With {engines} engine(s), an explicit abort naming one live id twice "
          "([live0, live0, live1]) aborts both live ids at their own engines and nothing "
          "else, and ends both streams 'abort': the repeat neither fails the call nor "
          "spills to another engine (the repeat may be forwarded: vllm-rs does not dedupe, "
          "state.rs:226-236, the engine skips an id it no longer holds).",
          grounds=REPEATED_ID, needs=ABORT)
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start([EngineScript(rules=[any_request(hold())])
                                 for _ in range(engines)])
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
        ctx.require(not wrong and not missing and sent[(live[1], owners.get(live[1]))] == 1,
                    expected=f"both live ids at their owners {sorted(owners.items())}, the "
                             "unrepeated one once, nothing else",
                    observed=f"(id, rank) aborted: {sorted(sent.items())}")
        ended = await ctx.wait_until(lambda: all(h.ended for h in handles), 2)
        seen = [(h.finish_reason, h.error) for h in handles]
        ctx.require(ended and all(x == ("abort", None) for x in seen),
                    expected="both streams end 'abort'", observed=seen)

    run.__name__ = run.__qualname__ = f"explicit_list_same_live_twice_{engines}"
    globals()[run.__name__] = run


for _engines in (1, 2):
    _make_repeat_case(_engines)


@case("abort.explicit.prefix_related_id_spared", Level.MUST,
      "Two live requests whose client ids are 'cwp' and 'cwp-1' (one a prefix of the other): "
      "an explicit abort of the first's id aborts it alone; the second gets no ABORT and keeps "
      "streaming (ids are matched exactly, never by prefix).",
      grounds=EXPLICIT_ENDS, needs=[*ABORT, Capability.CLIENT_REQUEST_ID])
async def prefix_related_id_spared(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())])])
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


@case("abort.explicit_list.streams_end_abort", Level.MUST,
      "Streams ended by an explicit abort (live ids on 2 engines, listed after a stale id) "
      "end with finish_reason 'abort' and no error: the client can tell an abort from a "
      "completion or a failure.",
      grounds=EXPLICIT_ENDS, needs=ABORT)
async def explicit_list_streams_end_abort(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())]) for _ in range(2)])
    live_prompts, handles, owners = await _live_pair(ctx, group)
    await ctx.driver.abort(["no-such-request", *owners])
    ended = await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    ctx.require(ended, expected="both aborted streams end",
                observed=[(h.ended, h.finish_reason) for h in handles])
    seen = [(h.finish_reason, h.error) for h in handles]
    ctx.require(all(s == ("abort", None) for s in seen),
                expected="finish_reason 'abort', no error, on both streams",
                observed=f"(finish_reason, error): {seen}")
