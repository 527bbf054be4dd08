"""A dropped or aborted stream's ABORT reaches its engine promptly, one stream at a time.

vLLM's clients abort at once (AsyncLLM in the cancelled generate()'s except handler; the Rust
abort loop wakes on each queued id), and the engine takes ABORTs out of band to act on them
early; a port that batches aborts on a timer, or only flushes them with the next request,
leaves engines generating for nobody.
"""

from __future__ import annotations

import time

from conformance.abort.helpers import AL, CC, CLIENT, IMP, STREAM, TESTS, holding
from harness.cases.authoring import (
    Capability,
    CaseContext,
    Level,
    both,
    case,
    engine,
    prompt,
    py,
    request_for,
    rs,
)

PROMPT_BOUND = 0.5  # seconds (scaled): vLLM's clients abort at once, not on a timer
DONE = {"drop": "dropped", "abort": "explicitly aborted"}

# Python's cancelled generate() awaits its abort in the handler itself; the Rust stream's Drop
# queues the id on an unbounded channel and run_abort_loop's recv_many wakes on the first one.
PROMPT_ABORT = both(
    py(f"{AL}:809", "await self.abort(q.request_id, internal=True)"),
    py(f"{CC}:1884", "await self._abort_requests(request_ids, engine)"),
    rs(f"{STREAM}:237", "if self.abort_tx.send(abort_req).is_err() {"),
    rs(f"{IMP}:380", "`recv_many` returns as soon as at least one item is ready, so a"),
    rs(f"{IMP}:385", "while abort_rx.recv_many(&mut batch, MAX_DRAIN).await > 0 {"),
    rs(f"{TESTS}:1240",
       "timeout(Duration::from_secs(1), recv_engine_message(dealer)).await.unwrap();"),
    engine("vllm/v1/engine/core.py:2036", "self.aborts_queue.put_nowait(request)"),
)

# An explicit abort is sent within the call: Python awaits it in AsyncLLM.abort, Rust's
# abort_requests awaits each engine's frame after ending the streams locally.
PROMPT_EXPLICIT_ABORT = both(
    py(f"{AL}:955",
       "all_request_ids = self.output_processor.abort_requests(request_ids, internal)"),
    py(f"{AL}:956", "await self.engine_core.abort_requests_async(all_request_ids)"),
    rs(f"{CLIENT}:699", "for (engine_id, request_ids) in abortable {"),
    rs(f"{CLIENT}:700", "self.inner.do_abort_requests(&engine_id, &request_ids).await?;"),
    engine("vllm/v1/engine/core.py:2036", "self.aborts_queue.put_nowait(request)"),
)


@case("abort.{how}.reaches_engine_promptly_{engines}_engines", Level.MUST,
      "With {engines} engine(s), each of three streams {done} one after another (the "
      "next once the previous ABORT arrived) has its ABORT at its engine within "
      f"{PROMPT_BOUND} s: an engine keeps generating for nobody until it arrives.",
      params=[{"how": how, "engines": n, "done": DONE[how],
               "grounds": PROMPT_ABORT if how == "drop" else PROMPT_EXPLICIT_ABORT,
               "needs": [Capability.GENERATE,
                         Capability.DROP if how == "drop" else Capability.ABORT]}
              for n in (1, 2) for how in ("drop", "abort")])
async def reaches_engine_promptly(ctx: CaseContext, how: str, engines: int) -> None:
    group = await ctx.start(holding(engines))
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
