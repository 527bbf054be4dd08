"""Utility calls (and new requests) after the client failed: the refusal should say WHY.

Once an engine reported ENGINE_CORE_DEAD or sent an output message that cannot be decoded,
both vLLM 0.33.0 frontends refuse every later call. The Rust client records the first
error and returns it from every later `call` / `call_utility` (`Error::Shared(first_error)`,
rust-client.md §1.9), so an operator sees the cause, not just "failed". A port that
refuses with a bare or generic text loses the one clue to the outage. Dimensions: the cause
(the dead sentinel, an undecodable frame), the engine count (the last of 1 or 2 engines
fails), and the kind of later call (a utility call and a new request).

A utility call still waiting when an engine's connection drops should fail promptly rather
than sit out its bound (the reference watches its sockets; vLLM's clients do not notice a
silent disconnect, rust-client.md §1.9 last sentence, protocol-python.md §10.1).
"""

from __future__ import annotations

import asyncio
import re
import time

from conformance.utility.helpers import AL, CC, CLIENT, ECC, IMP, TESTS
from harness.cases.authoring import (
    Basis,
    Capability,
    CaseContext,
    EngineScript,
    FrontendError,
    Grounds,
    Level,
    MockEngine,
    UtilityReply,
    any_request,
    both,
    case,
    differ,
    hold,
    prompt,
    py,
    recommendation,
    rs,
)

# Rust: the first error closes the registries; every later call returns it (Error::Shared).
_RS_FIRST_ERROR = (
    rs(f"{IMP}:364", "Error::Shared(self.health_error.load_full().expect("),
    rs(f"{IMP}:121", "return Err(self.closed_error());"),
)
WHY_DEAD = both(
    py(f"{CC}:586",
       "if len(frames) == 1 and (frames[0].buffer == EngineCoreProc.ENGINE_CORE_DEAD):"),
    py(f"{CC}:809", "raise EngineDeadError()"),
    py(f"{AL}:419", "raise EngineDeadError()"),
    rs(f"{ECC}/transport.rs:615", "let _ = tx.send(Err(Error::EngineCoreDead)).await;"),
    rs(f"{ECC}/error.rs:39", '#[error("engine core reported fatal failure")]'),
    *_RS_FIRST_ERROR,
    rs(f"{TESTS}:1741", "async fn engine_core_dead_sentinel_marks_client_unhealthy_and_sticks()"),
    note="both name the death: python refuses later calls with EngineDeadError "
         "(core_client.py:809, async_llm.py:419), rust with its first error, EngineCoreDead "
         "(error.rs:39)",
)
WHY_DECODE = differ(
    py(f"{CC}:1262", "outputs_queue.put_nowait(e)"),
    py(f"{AL}:419", "raise EngineDeadError()"),
    py("vllm/v1/engine/exceptions.py:20",
       '"EngineCore encountered an issue. See stack trace (above) for the root cause."'),
    rs(f"{IMP}:537", "inner.close_registries(Arc::new(error));"),
    *_RS_FIRST_ERROR,
    rs(f"{TESTS}:1800",
       "async fn output_loop_failure_marks_client_unhealthy_and_records_first_error()"),
    note="rust records the decode error as its first error and returns it from every later "
         "call (imp.rs:537, :364); python logs the cause and refuses later requests with "
         "EngineDeadError's fixed text, which points to the log (exceptions.py:20)",
)
LOST = recommendation(
    py(f"{CC}:1217", "frames = await output_socket.recv_multipart(copy=False)"),
    py(f"{CC}:1334", "return await future"),
    rs(f"{CLIENT}:756", "rx.await"),
    rs(f"{CLIENT}:757", ".map_err(|_| Error::UtilityCallClosed {"),
    note="neither 0.33.0 frontend watches its engine sockets: when an engine closes them "
         "without ENGINE_CORE_DEAD a pending utility call keeps waiting (python awaits a bare "
         "future, core_client.py:1334; rust its oneshot, client.rs:756). corewire advises "
         "failing it promptly so the caller is not left hanging",
)
# cause -> (what happens, what the later errors must mention, its grounds)
CAUSES: dict[str, tuple[str, str, Grounds]] = {
    "engine_dead": ("ENGINE_CORE_DEAD",
                    r"dead|died|fatal",  # Rust: "engine core reported fatal failure"
                    WHY_DEAD),
    "undecodable_output": ("an output frame that is not msgpack",
                           r"decod|msgpack|malformed|opcode|protocol|deserializ|invalid",
                           WHY_DECODE),
}


def _trigger(eng: MockEngine, cause: str) -> None:
    """The engine causes the failure."""
    if cause == "engine_dead":
        eng.send_dead()
    else:
        eng.send_garbage([b"\xc1garbage"])


async def _later_generate_error(ctx: CaseContext) -> str:
    """The text a new request fails with (raised, or its stream's error)."""
    try:
        handle = await asyncio.wait_for(ctx.driver.generate(prompt(700), 2), ctx.t(2))
    except FrontendError as exc:
        return str(exc)
    except asyncio.TimeoutError:
        ctx.fail(expected="a new request fails within 2 s",
                 observed="generate() still pending after 2 s")
    ended = await ctx.wait_until(lambda: handle.ended, 2)
    ctx.require(ended and handle.finish_reason not in ("length", "stop"),
                expected="a new request fails within 2 s",
                observed=(f"it finished {handle.finish_reason!r} with {handle.tokens}" if ended
                          else "its stream is still open after 2 s"))
    return handle.error or ""


async def _later_utility_error(ctx: CaseContext) -> str:
    try:
        value = await asyncio.wait_for(ctx.driver.is_sleeping(), ctx.t(2))
    except FrontendError as exc:
        return str(exc)
    except asyncio.TimeoutError:
        ctx.fail(expected="is_sleeping fails within 2 s", observed="still pending after 2 s")
    ctx.fail(expected="is_sleeping fails after the failure", observed=f"it answered {value!r}")


# ---------------------------------------------------------------- the refusal says why

# The level follows each cause's grounds: both frontends name engine death (a MUST by the
# level rule); they differ on an undecodable frame (a SHOULD).
@case("utility.more_edges.after_{cause}_refusal_says_why_{engines}_engines", Level.MUST,
      "With {engines} engine(s), after {what} from engine {last}, a later "
      "is_sleeping call and a later request are refused with an error that names the "
      "cause (matching /{pattern}/i), as the Rust client returns its first error from "
      "every later call; not a bare or empty refusal.",
      grounds=WHY_DEAD, needs=[Capability.GENERATE, Capability.IS_SLEEPING,
                               Capability.ENGINE_DEATH], timeout=25,
      params=[{"cause": cause, "engines": n, "last": n - 1, "what": what, "pattern": pattern,
               "grounds": grounds,
               "level": Level.MUST if grounds.basis is Basis.BOTH else Level.SHOULD}
              for cause, (what, pattern, grounds) in CAUSES.items() for n in (1, 2)])
async def refusal_says_why(ctx: CaseContext, cause: str, engines: int, pattern: str) -> None:
    group = await ctx.start(engines)
    _trigger(group.engines[-1], cause)
    await ctx.quiet(0.3)
    texts = {"is_sleeping": await _later_utility_error(ctx),
             "generate": await _later_generate_error(ctx)}
    vague = {call: text for call, text in texts.items()
             if not re.search(pattern, text, re.I)}
    ctx.require(not vague, expected=f"both refusals name the cause (/{pattern}/i)",
                observed=f"refusals without the cause: {vague}")


# ---------------------------------------------------------------- a lost engine connection

@case("utility.more_edges.pending_call_fails_on_lost_engine_{engines}_engines",
      Level.SHOULD,
      "With {engines} engine(s), an is_sleeping call waiting for engine {lost} (which "
      "holds its reply) fails within 1.5 s once engine {lost} closes its sockets, "
      "rather than waiting out the call's bound; streams still open end with an error "
      "text that says the engine went away.",
      grounds=LOST, needs=[Capability.GENERATE, Capability.IS_SLEEPING,
                           Capability.ENGINE_DEATH], timeout=25,
      params=[{"engines": n, "lost": n - 1} for n in (1, 2)])
async def pending_call_lost_engine(ctx: CaseContext, engines: int, lost: int) -> None:
    scripts = [EngineScript(rules=[any_request(hold())]) for _ in range(engines)]
    scripts[lost].utilities["is_sleeping"] = UtilityReply(never=True)
    group = await ctx.start(scripts)
    handles = [await ctx.driver.generate(prompt(710 + i), 100,
                                         data_parallel_rank=i if engines > 1 else None)
               for i in range(engines)]
    await asyncio.gather(*(h.wait_first(ctx.t(3)) for h in handles))
    call = asyncio.ensure_future(ctx.driver.is_sleeping())
    await ctx.quiet(0.2)
    ctx.require(not call.done(), expected=f"the call waits for engine {lost}",
                observed="it returned before the engine's sockets closed")
    group.engines[lost].close_sockets()
    began = time.monotonic()
    try:
        value = await asyncio.wait_for(call, ctx.t(3))  # twice the 1.5 s asked for
        ctx.fail(expected="the pending call fails", observed=f"it answered {value!r}")
    except FrontendError as exc:
        elapsed = time.monotonic() - began
        ctx.require(elapsed <= ctx.t(1.5), expected="the call fails within 1.5 s",
                    observed=f"it failed after {elapsed:.2f}s: {exc}")
    except asyncio.TimeoutError:
        ctx.fail(expected="the call fails within 1.5 s",
                 observed="still pending 3 s after the engine's sockets closed")
    await ctx.wait_until(lambda: all(h.ended for h in handles), 2)
    vague = [(h.finish_reason, h.error) for h in handles
             if not (h.ended and h.error and re.search(
                 r"lost|disconnect|closed|gone|connection", h.error, re.I))]
    ctx.require(not vague, expected="every open stream ends with an error that says "
                                    "the engine connection was lost",
                observed=f"(finish, error) of the others: {vague}")
