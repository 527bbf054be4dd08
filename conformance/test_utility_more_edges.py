"""Utility calls (and new requests) after the client failed: the refusal must say WHY.

Once an engine reported ENGINE_CORE_DEAD or sent an output message that cannot be decoded,
both vLLM 0.33.0 frontends refuse every later call. The Rust client records the first
error and returns it from every later `call` / `call_utility` (`Error::Shared(first_error)`,
rust-client.md §1.9), so an operator sees the cause, not just "failed". A port that
refuses with a bare or generic text loses the one clue to the outage. Dimensions: the cause
(the dead sentinel, an undecodable frame), the engine count (the last of 1 or 2 engines
fails), and the kind of later call (a utility call and a new request).

A utility call still waiting when an engine's connection drops must fail promptly rather
than sit out its bound (the reference watches its sockets; vLLM's clients do not notice a
silent disconnect, rust-client.md §1.9 last sentence, protocol-python.md §10.1).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable

from harness.case_context import CaseContext
from harness.casekit import hold, prompt
from harness.frontends.driver import Capability, FrontendError, UnsupportedOperation
from harness.verdicts import Level, case
from mock_engines.group import MockEngine
from mock_engines.script import EngineScript, UtilityReply, any_request

WHY = ("rust-client.md §1.9 (close_registries: later call / call_utility return "
       "Error::Shared(first_error)); Rust test engine_core_dead_sentinel_marks_client_"
       "unhealthy_and_sticks; protocol-python.md §10.1 (EngineDeadError)")
LOST = ("rust-client.md §1.9 (silent engine exit is not detected by the Rust client); "
        "protocol-python.md §10.1; the reference's socket monitor (frontend.py)")

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

    @case(f"utility.more_edges.after_{cause}_refusal_says_why_{engines}_engines", Level.SHOULD,
          f"With {engines} engine(s), after {what} from engine {engines - 1}, a later "
          "is_sleeping call and a later request are refused with an error that names the "
          f"cause (matching /{pattern}/i), as the Rust client returns its first error from "
          "every later call; not a bare or empty refusal.",
          source=WHY, needs=[Capability.GENERATE, Capability.IS_SLEEPING,
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
          source=LOST, needs=[Capability.GENERATE, Capability.IS_SLEEPING,
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
            value = await asyncio.wait_for(call, ctx.t(6))
            ctx.require(False, expected="the pending call fails",
                        observed=f"it answered {value!r}")
        except FrontendError as exc:
            elapsed = time.monotonic() - began
            ctx.require(elapsed <= ctx.t(1.5), expected="the call fails within 1.5 s",
                        observed=f"it failed after {elapsed:.2f}s: {exc}")
        except asyncio.TimeoutError:
            ctx.require(False, expected="the call fails within 1.5 s",
                        observed="still pending 6 s after the engine's sockets closed")
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

FAIL_SRC = ("rust-client.md §1.7 (Error::UtilityCallFailed{method, call_id, message}); "
            "core_client.py _process_utility_output (the failure message becomes the "
            "caller's exception, 0.33.0)")

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
          source=FAIL_SRC, needs=NEEDS[method])
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
