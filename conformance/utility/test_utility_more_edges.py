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
from collections.abc import Awaitable, Callable

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import Basis, Grounds, both, differ, engine, py, recommendation, rs
from harness.cases.helpers import hold, prompt
from harness.frontends.api import Capability, FrontendError, UnsupportedOperation
from harness.results.records import Level
from mock_engines.group import MockEngine
from mock_engines.script import EngineScript, UtilityReply, any_request

_CC = "vllm/v1/engine/core_client.py"
_AL = "vllm/v1/engine/async_llm.py"
_ECC = "rust/src/engine-core-client/src"
_CLIENT = f"{_ECC}/client.rs"
_IMP = f"{_ECC}/client/imp.rs"
_TESTS = f"{_ECC}/tests/client.rs"
# Rust: the first error closes the registries; every later call returns it (Error::Shared).
_RS_FIRST_ERROR = (
    rs(f"{_IMP}:364", "Error::Shared(self.health_error.load_full().expect("),
    rs(f"{_IMP}:121", "return Err(self.closed_error());"),
)
WHY_DEAD = both(
    py(f"{_CC}:586",
       "if len(frames) == 1 and (frames[0].buffer == EngineCoreProc.ENGINE_CORE_DEAD):"),
    py(f"{_CC}:809", "raise EngineDeadError()"),
    py(f"{_AL}:419", "raise EngineDeadError()"),
    rs(f"{_ECC}/transport.rs:615", "let _ = tx.send(Err(Error::EngineCoreDead)).await;"),
    rs(f"{_ECC}/error.rs:39", '#[error("engine core reported fatal failure")]'),
    *_RS_FIRST_ERROR,
    rs(f"{_TESTS}:1741", "async fn engine_core_dead_sentinel_marks_client_unhealthy_and_sticks()"),
    note="both name the death: python refuses later calls with EngineDeadError "
         "(core_client.py:809, async_llm.py:419), rust with its first error, EngineCoreDead "
         "(error.rs:39)",
)
WHY_DECODE = differ(
    py(f"{_CC}:1262", "outputs_queue.put_nowait(e)"),
    py(f"{_AL}:419", "raise EngineDeadError()"),
    py("vllm/v1/engine/exceptions.py:20",
       '"EngineCore encountered an issue. See stack trace (above) for the root cause."'),
    rs(f"{_IMP}:537", "inner.close_registries(Arc::new(error));"),
    *_RS_FIRST_ERROR,
    rs(f"{_TESTS}:1800",
       "async fn output_loop_failure_marks_client_unhealthy_and_records_first_error()"),
    note="rust records the decode error as its first error and returns it from every later "
         "call (imp.rs:537, :364); python logs the cause and refuses later requests with "
         "EngineDeadError's fixed text, which points to the log (exceptions.py:20)",
)
CAUSE_GROUNDS: dict[str, Grounds] = {"engine_dead": WHY_DEAD, "undecodable_output": WHY_DECODE}
LOST = recommendation(
    py(f"{_CC}:1217", "frames = await output_socket.recv_multipart(copy=False)"),
    py(f"{_CC}:1334", "return await future"),
    rs(f"{_CLIENT}:756", "rx.await"),
    rs(f"{_CLIENT}:757", ".map_err(|_| Error::UtilityCallClosed {"),
    note="neither 0.33.0 frontend watches its engine sockets: when an engine closes them "
         "without ENGINE_CORE_DEAD a pending utility call keeps waiting (python awaits a bare "
         "future, core_client.py:1334; rust its oneshot, client.rs:756). corewire advises "
         "failing it promptly so the caller is not left hanging",
)

# cause -> (what happens, how the engine causes it, what the later errors must mention)
CAUSES: dict[str, tuple[str, Callable[[MockEngine], None], str]] = {
    "engine_dead": ("ENGINE_CORE_DEAD", lambda eng: eng.send_dead(),
                    r"dead|died|fatal"),  # Rust: "engine core reported fatal failure"
    "undecodable_output": ("an output frame that is not msgpack",
                           lambda eng: eng.send_garbage([b"\xc1garbage"]),
                           r"decod|msgpack|malformed|opcode|protocol|deserializ|invalid"),
}


async def _later_generate_error(ctx: CaseContext) -> str:
    """The text a new request fails with (raised, or its stream's error)."""
    try:
        handle = await asyncio.wait_for(ctx.driver.generate(prompt(700), 2), ctx.t(2))
    except FrontendError as exc:
        return str(exc)
    except asyncio.TimeoutError:
        ctx.require(False, expected="a new request fails within 2 s",
                    observed="generate() still pending after 2 s")
        return ""
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
        ctx.require(False, expected="is_sleeping fails within 2 s",
                    observed="still pending after 2 s")
        return ""
    ctx.require(False, expected="is_sleeping fails after the failure",
                observed=f"it answered {value!r}")
    return ""


def _make_cause_case(cause: str, engines: int) -> None:
    what, trigger, pattern = CAUSES[cause]

    grounds = CAUSE_GROUNDS[cause]  # both hold it after engine death: a MUST by the rule
    level = Level.MUST if grounds.basis is Basis.BOTH else Level.SHOULD

    @case(f"utility.more_edges.after_{cause}_refusal_says_why_{engines}_engines", level,
          f"With {engines} engine(s), after {what} from engine {engines - 1}, a later "
          "is_sleeping call and a later request are refused with an error that names the "
          f"cause (matching /{pattern}/i), as the Rust client returns its first error from "
          "every later call; not a bare or empty refusal.",
          grounds=grounds, needs=[Capability.GENERATE, Capability.IS_SLEEPING,
                             Capability.ENGINE_DEATH], timeout=25)
    async def run(ctx: CaseContext) -> None:
        group = await ctx.start(engines)
        trigger(group.engines[-1])
        await ctx.quiet(0.3)
        texts = {"is_sleeping": await _later_utility_error(ctx),
                 "generate": await _later_generate_error(ctx)}
        vague = {call: text for call, text in texts.items()
                 if not re.search(pattern, text, re.I)}
        ctx.require(not vague, expected=f"both refusals name the cause (/{pattern}/i)",
                    observed=f"refusals without the cause: {vague}")

    run.__name__ = run.__qualname__ = f"after_{cause}_says_why_{engines}"
    globals()[run.__name__] = run


for _cause in CAUSES:
    for _n in (1, 2):
        _make_cause_case(_cause, _n)


# ---------------------------------------------------------------- a lost engine connection

def _make_lost_case(engines: int) -> None:
    lost = engines - 1

    @case(f"utility.more_edges.pending_call_fails_on_lost_engine_{engines}_engines",
          Level.SHOULD,
          f"With {engines} engine(s), an is_sleeping call waiting for engine {lost} (which "
          f"holds its reply) fails within 1.5 s once engine {lost} closes its sockets, "
          "rather than waiting out the call's bound; streams still open end with an error "
          "text that says the engine went away.",
          grounds=LOST, needs=[Capability.GENERATE, Capability.IS_SLEEPING,
                              Capability.ENGINE_DEATH], timeout=25)
    async def run(ctx: CaseContext) -> None:
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
            ctx.require(False, expected="the pending call fails",
                        observed=f"it answered {value!r}")
        except FrontendError as exc:
            elapsed = time.monotonic() - began
            ctx.require(elapsed <= ctx.t(1.5), expected="the call fails within 1.5 s",
                        observed=f"it failed after {elapsed:.2f}s: {exc}")
        except asyncio.TimeoutError:
            ctx.require(False, expected="the call fails within 1.5 s",
                        observed="still pending 3 s after the engine's sockets closed")
        await ctx.wait_until(lambda: all(h.ended for h in handles), 2)
        vague = [(h.finish_reason, h.error) for h in handles
                 if not (h.ended and h.error and re.search(
                     r"lost|disconnect|closed|gone|connection", h.error, re.I))]
        ctx.require(not vague, expected="every open stream ends with an error that says "
                                        "the engine connection was lost",
                    observed=f"(finish, error) of the others: {vague}")

    run.__name__ = run.__qualname__ = f"pending_call_lost_engine_{engines}"
    globals()[run.__name__] = run


for _n in (1, 2):
    _make_lost_case(_n)


# ---------------------------------------------------------------- a failure names its method

FAIL_NAMES = differ(
    py(f"{_CC}:941", "future.set_exception(Exception(failure_message))"),
    rs(f"{_ECC}/error.rs:84", "failed (call_id={call_id}): {message}"),
    rs(f"{_ECC}/protocol/utility.rs:245", "return Err(Error::UtilityCallFailed {"),
    engine("vllm/v1/engine/core.py:1850",
           'output.failure_message = f"Call to {name} method failed: {str(e)}"'),
    note="rust's UtilityCallFailed names the method (error.rs:84); python raises the engine's "
         "failure message as it came (core_client.py:941) and relies on the engine's own "
         "text naming it ('Call to {name} method failed', core.py:1850)",
)

# method -> (how the client calls it, what every other engine answers)
FAILING: dict[str, tuple[Callable[[CaseContext], Awaitable[object]], object]] = {
    "is_sleeping": (lambda ctx: ctx.driver.is_sleeping(), False),
    "reset_prefix_cache": (lambda ctx: ctx.driver.reset_prefix_cache(), True),
    "is_scheduler_paused": (lambda ctx: ctx.driver.call_utility("is_scheduler_paused", []),
                            False),
}
NEEDS: dict[str, list[Capability]] = {
    "is_sleeping": [Capability.IS_SLEEPING],
    "reset_prefix_cache": [Capability.RESET_PREFIX_CACHE],
    "is_scheduler_paused": [Capability.CALL_UTILITY],
}


def _make_method_named(method: str, engines: int, failing: int) -> None:
    call, answer = FAILING[method]

    @case(f"utility.more_edges.failure_names_method_{method}_{engines}_engines", Level.SHOULD,
          f"When engine {failing} of {engines} fails {method} (with a message that does not "
          f"name it), the caller's error should name the method {method!r} as well as carry "
          "the engine's message (Rust UtilityCallFailed names the method).",
          grounds=FAIL_NAMES, needs=NEEDS[method])
    async def run(ctx: CaseContext) -> None:
        text = f"cw-engine-{failing}-refused"
        scripts = [EngineScript(utilities={method: UtilityReply(answer)})
                   for _ in range(engines)]
        scripts[failing].utilities[method] = UtilityReply(failure=text)
        await ctx.start(scripts)
        try:
            value = await asyncio.wait_for(call(ctx), ctx.t(3))
        except UnsupportedOperation:
            raise  # the driver cannot make this call: UNSUPPORTED
        except FrontendError as exc:
            ctx.require(method in str(exc) and text in str(exc),
                        expected=f"an error naming {method!r} and carrying {text!r}",
                        observed=str(exc))
            return
        except asyncio.TimeoutError:
            ctx.require(False, expected="the call fails within 3 s",
                        observed="still pending after 3 s")
        ctx.require(False, expected=f"the call fails naming {method!r}",
                    observed=f"answered {value!r}")

    run.__name__ = run.__qualname__ = f"failure_names_{method}_{engines}"
    globals()[run.__name__] = run


for _method, _n, _failing in (("is_sleeping", 1, 0), ("reset_prefix_cache", 2, 1),
                              ("is_scheduler_paused", 3, 2)):
    _make_method_named(_method, _n, _failing)
