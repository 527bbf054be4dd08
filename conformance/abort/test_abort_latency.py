"""A dropped or aborted stream's ABORT reaches its engine promptly, one stream at a time.

vLLM's clients abort at once (AsyncLLM in the cancelled generate()'s except handler; the Rust
abort loop wakes on each queued id), and the engine takes ABORTs out of band to act on them
early; a port that batches aborts on a timer, or only flushes them with the next request,
leaves engines generating for nobody.
"""

from __future__ import annotations

import time

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, engine, py, rs
from harness.cases.helpers import hold, prompt, request_for
from harness.frontends.api import Capability
from harness.results.records import Level
from mock_engines.script import EngineScript, any_request

# ----------------------------------------------------------------- abort latency

PROMPT_BOUND = 0.5  # seconds (scaled): vLLM's clients abort at once, not on a timer
DONE = {"drop": "dropped", "abort": "explicitly aborted"}

_IMP = "rust/src/engine-core-client/src/client/imp.rs"

# Python's cancelled generate() awaits its abort in the handler itself; the Rust stream's Drop
# queues the id on an unbounded channel and run_abort_loop's recv_many wakes on the first one.
PROMPT_ABORT = both(
    py("vllm/v1/engine/async_llm.py:809", "await self.abort(q.request_id, internal=True)"),
    py("vllm/v1/engine/core_client.py:1884", "await self._abort_requests(request_ids, engine)"),
    rs("rust/src/engine-core-client/src/client/stream.rs:237",
       "if self.abort_tx.send(abort_req).is_err() {"),
    rs(f"{_IMP}:380", "`recv_many` returns as soon as at least one item is ready, so a"),
    rs(f"{_IMP}:385", "while abort_rx.recv_many(&mut batch, MAX_DRAIN).await > 0 {"),
    rs("rust/src/engine-core-client/src/tests/client.rs:1240",
       "timeout(Duration::from_secs(1), recv_engine_message(dealer)).await.unwrap();"),
    engine("vllm/v1/engine/core.py:2036", "self.aborts_queue.put_nowait(request)"),
)

# An explicit abort is sent within the call: Python awaits it in AsyncLLM.abort, Rust's
# abort_requests awaits each engine's frame after ending the streams locally.
PROMPT_EXPLICIT_ABORT = both(
    py("vllm/v1/engine/async_llm.py:955",
       "all_request_ids = self.output_processor.abort_requests(request_ids, internal)"),
    py("vllm/v1/engine/async_llm.py:956",
       "await self.engine_core.abort_requests_async(all_request_ids)"),
    rs("rust/src/engine-core-client/src/client.rs:699",
       "for (engine_id, request_ids) in abortable {"),
    rs("rust/src/engine-core-client/src/client.rs:700",
       "self.inner.do_abort_requests(&engine_id, &request_ids).await?;"),
    engine("vllm/v1/engine/core.py:2036", "self.aborts_queue.put_nowait(request)"),
)


def _make_prompt_abort(how: str, engines: int) -> None:
    @case(f"abort.{how}.reaches_engine_promptly_{engines}_engines", Level.MUST,
          f"With {engines} engine(s), each of three streams {DONE[how]} one after another (the "
          f"next once the previous ABORT arrived) has its ABORT at its engine within "
          f"{PROMPT_BOUND} s: an engine keeps generating for nobody until it arrives.",
          grounds=PROMPT_ABORT if how == "drop" else PROMPT_EXPLICIT_ABORT,
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
    for _how in ("drop", "abort"):
        _make_prompt_abort(_how, _n)
