"""A dropped or aborted stream's ABORT reaches its engine promptly, one stream at a time.

vLLM's clients abort at once (AsyncLLM in the cancelled stream's finally; the Rust abort loop
wakes on each queued id); a port that batches aborts on a timer, or only flushes them with
the next request, leaves engines generating for nobody.
"""

from __future__ import annotations

import time

from harness.case_context import CaseContext
from harness.casekit import hold, prompt, request_for
from harness.frontends.driver import Capability
from harness.verdicts import Level, case
from mock_engines.script import EngineScript, any_request

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
