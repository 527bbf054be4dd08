"""A request that ends frees exactly its own routing slot, whichever way it ended.

A DP frontend routes an unpinned request to the engine with the least work: its own
in-flight count per engine (vllm-rs `EngineRoutingState.inflight`; vLLM's Python DPLB
`engine_inflight`, decremented through finished_requests). Port authors release that slot
on one path and forget another (an explicit abort, an engine ERROR, a stop string the
frontend ended), or release too much (reset the count when one request ends, decrement
twice). Either way later requests pile onto a busy engine. These cases end requests on
one engine in each way and then probe the routing twice: once where the busy engine must
still count its remaining requests, once where it must no longer count the ended ones.
The DP coordinator's snapshot shows no load (as a stale one does), so nothing but the
frontend's own count can steer the routing.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from harness.case_context import CaseContext
from harness.casekit import hold, prompt, request_for
from harness.frontends.driver import Capability, StreamHandle
from harness.verdicts import Level, case
from harness.wire import messages as m
from mock_engines.group import EngineGroup
from mock_engines.script import Emit, EngineScript, Finish, Rule, any_request, by_prompt

F = m.FinishReason
SOURCE = ("vllm 0.33.0 core_client.py:1781-1790 (score = max(inflight, waiting + running)), "
          "1819-1826 (finished_requests release the slot); rust-client.md §1.6 "
          "(EngineRoutingState.inflight, released when the request leaves the registry)")
PINNED = [Capability.GENERATE, Capability.DP_RANK]
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
    found = request_for(group, p)
    return found[0] if found else None


def _make_slot_case(kind: EndKind) -> None:
    @case(f"dp.routing.ended_frees_one_slot_{kind.name}", Level.MUST,
          f"With 2 engines (the DP coordinator's snapshot showing no load), 3 requests held "
          f"on engine 0 and 2 on engine 1, two more on engine "
          f"0 that {kind.text} free exactly their own slots: the next unpinned request goes "
          "to engine 1 (3 vs 2 in flight); after one more is pinned to engine 1 (3 vs 4), "
          "the next goes to engine 0.", source=SOURCE, needs=[*PINNED, *kind.needs])
    async def run(ctx: CaseContext) -> None:
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

    run.__name__ = run.__qualname__ = f"ended_frees_one_slot_{kind.name}"
    globals()[run.__name__] = run


for _kind in KINDS:
    _make_slot_case(_kind)


# ----------------------------------------------------------------- abort latency

PROMPT_BOUND = 0.5  # seconds (scaled): vLLM's clients abort at once, not on a timer


def _make_prompt_abort(how: str, engines: int) -> None:
    @case(f"abort.{how}.reaches_engine_promptly_{engines}_engines", Level.MUST,
          f"With {engines} engine(s), each of three streams {how}ped one after another (the "
          f"next once the previous ABORT arrived) has its ABORT at its engine within "
          f"{PROMPT_BOUND} s: an engine keeps generating for nobody until it arrives.",
          source="vllm 0.33.0 async_llm.py generate() (a cancelled stream aborts in its "
                 "finally, at once); rust-client.md §1.5 (the abort loop wakes on each "
                 "queued id and drains immediately)",
          needs=[Capability.GENERATE,
                 Capability.DROP if how == "drop" else Capability.ABORT])
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start([EngineScript(rules=[any_request(hold())])
                                 for _ in range(engines)])
        prompts = [prompt(800 + i) for i in range(3)]
        handles = [await ctx.driver.generate(p, 50) for p in prompts]
        for h in handles:
            await h.wait_first(ctx.t(3))
        ok = await ctx.wait_until(lambda: all(request_for(group, p) for p in prompts), 3)
        ctx.require(ok, expected="three ADDs at the engines",
                    observed=len(group.transcript.adds()))
        delays: list[float | None] = []
        for p, h in zip(prompts, handles, strict=True):
            found = request_for(group, p)
            assert found is not None
            rid = found[1]
            started = time.monotonic()
            if how == "drop":
                await ctx.driver.drop([h])
            else:
                await ctx.driver.abort([rid])
            arrived = await ctx.wait_until(lambda rid=rid: rid in  # type: ignore[misc]
                                           group.transcript.aborted_ids(), 3)
            times = [r.t for r in group.transcript.abort_frames()
                     if rid in r.message.request_ids]
            delays.append(round(min(times) - started, 3) if arrived and times else None)
        bound = ctx.t(PROMPT_BOUND)
        ctx.note(f"ABORT delays {delays} s")
        ctx.require(all(d is not None and d <= bound for d in delays),
                    expected=f"each ABORT at its engine within {bound:.2f} s",
                    observed=f"delays (s) {delays}")

    run.__name__ = run.__qualname__ = f"{how}_reaches_engine_promptly_{engines}"
    globals()[run.__name__] = run


for _n in (1, 2):
    _make_prompt_abort("drop", _n)
