"""The DP client as one client: it speaks to every engine under one client_index, and an
engine's death ends every open stream with a reason.

Engines route a client's outputs to its output socket by the client_index it stamps on each
ADD and UTILITY (core.py:1775, 2102; scheduler.py:2511), so a single frontend stamps the
same index (0) everywhere. When the last engine reports ENGINE_CORE_DEAD both 0.33.0
frontends fail every open stream with an error that says what happened (Python
EngineDeadError, exceptions.py:20; Rust Error::EngineCoreDead, error.rs:39), not a bare
error finish.
"""

from __future__ import annotations

import asyncio

from conformance.dp.helpers import CC, RC, SCHED, holding_engines
from harness.cases.authoring import (
    Capability,
    CaseContext,
    Level,
    both,
    case,
    engine,
    prompt,
    py,
    rs,
)


@case("dp.client.index_on_every_message_{n}_engines", Level.MUST,
      "With {n} engine(s), a single frontend stamps one client_index (0) on every "
      "ADD and UTILITY it sends, so engines route its outputs to its output socket.",
      grounds=both(
          py(f"{CC}:1340", "request.client_index = self.client_index"),
          py(f"{CC}:1611", "request.client_index = self.client_index"),
          py(f"{CC}:1330",
             "*self.encoder.encode((self.client_index, call_id, method, args)),"),
          rs(f"{RC}:626", "req.client_index = self.config.client_index;"),
          rs(f"{RC}:747", "EngineCoreUtilityRequest::new(self.config.client_index"),
          engine("vllm/v1/engine/core.py:1775",
                 "(client_idx, EngineCoreOutputs(utility_output=out))"),
          engine(f"{SCHED}:2511", "outputs[request.client_index].append("),
          engine("vllm/v1/engine/core.py:2102", "sockets[client_index], buffers"),
      ),
      needs=[Capability.GENERATE, Capability.IS_SLEEPING], params=[{"n": 1}, {"n": 2}])
async def client_index(ctx: CaseContext, n: int) -> None:
    group = await ctx.start(n)
    handles = [await ctx.driver.generate(prompt(500 + i), 2) for i in range(2 * n)]
    for h in handles:
        await h.wait(ctx.t(3))
    await ctx.driver.is_sleeping()
    adds = [r.client_index for r in group.transcript.adds()]
    calls = [r.message.client_index for r in group.transcript.utility_calls()]
    ctx.require(bool(adds) and set(adds) | set(calls) == {0},
                expected="client_index 0 on every ADD and UTILITY",
                observed=f"ADDs {adds}, UTILITY {calls}")


DEATH = both(
    py(f"{CC}:588", "raise EngineDeadError()"),
    py("vllm/v1/engine/async_llm.py:944", "output_processor.propagate_error(e)"),
    py("vllm/v1/engine/output_processor.py:597", "state.queue.put(e)"),
    py("vllm/v1/engine/exceptions.py:20",
       "EngineCore encountered an issue. See stack trace (above) for the root cause."),
    rs("rust/src/engine-core-client/src/transport.rs:615",
       "let _ = tx.send(Err(Error::EngineCoreDead)).await;"),
    rs("rust/src/engine-core-client/src/client/imp.rs:537",
       "inner.close_registries(Arc::new(error));"),
    rs("rust/src/engine-core-client/src/client/imp.rs:223",
       "sender.send_error(Error::Shared(persistent_error.clone()));"),
    rs("rust/src/engine-core-client/src/error.rs:39",
       '#[error("engine core reported fatal failure")]'),
    engine("vllm/v1/engine/core.py:2078", "if output == EngineCoreProc.ENGINE_CORE_DEAD:"),
)


@case("dp.edges.engine_death_stream_error_text_{n}_engines", Level.MUST,
      "With {n} engine(s), ENGINE_CORE_DEAD from the last engine ends every open "
      "stream with an error that says what happened (a non-empty error text), not "
      "a bare error finish.", grounds=DEATH,
      needs=[Capability.GENERATE, Capability.ENGINE_DEATH], timeout=20,
      params=[{"n": n} for n in (1, 2, 3)])
async def death_text(ctx: CaseContext, n: int) -> None:
    group = await ctx.start(holding_engines(n))
    handles = [await ctx.driver.generate(prompt(540 + i), 100) for i in range(n + 1)]
    await asyncio.gather(*(h.wait_first(ctx.t(3)) for h in handles))
    group.engines[-1].send_dead()
    await ctx.wait_until(lambda: all(h.ended for h in handles), 3)
    bad = [(h.finish_reason, h.error) for h in handles
           if not (h.ended and isinstance(h.error, str) and h.error.strip())]
    ctx.require(not bad, expected=f"all {n + 1} streams end with an error text",
                observed=f"{len(bad)} did not (finish, error): {bad[:3]}")
