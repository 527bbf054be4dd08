"""What a failed utility call's error tells the caller: the failing engine's own message,
the method that failed, the engine that stayed silent, the answers the engines disagreed on.

A failure reply becomes the caller's exception (Python core_client.py
`_process_utility_output`; Rust `Error::UtilityCallFailed`, which names the method), and a
disagreement on a consensus method is raised with the engines' values. A port that
answers with a bare 'failed' loses the one clue to what went wrong.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from conformance.utility.helpers import (
    CALL,
    CC,
    CLIENT,
    CORE,
    ECC,
    UTIL,
    utility_engines,
)
from harness.cases.authoring import (
    UTILITY_GIVE_UP_S,
    Capability,
    CaseContext,
    EngineScript,
    FrontendError,
    Level,
    UnsupportedOperation,
    UtilityReply,
    both,
    case,
    differ,
    engine,
    py,
    recommendation,
    rs,
)

# The server turns a client error into the HTTP error text with the error's report.
_RS_REPORT = rs("rust/src/server/src/utils.rs:57",
                'ApiError::server_error(format!("failed to call {method}: {}", error.as_report()))')
FAIL = both(
    py(f"{CC}:941", "future.set_exception(Exception(failure_message))"),
    rs(f"{UTIL}:245", "return Err(Error::UtilityCallFailed {"),
    rs(f"{ECC}/error.rs:84",
       "#[error(\"utility call `{method}` failed (call_id={call_id}): {message}\")]"),
    _RS_REPORT,
    engine(f"{CORE}:1850", 'output.failure_message = f"Call to {name} method failed: {str(e)}"'),
)
FAIL_NAMES = differ(
    py(f"{CC}:941", "future.set_exception(Exception(failure_message))"),
    rs(f"{ECC}/error.rs:84", "failed (call_id={call_id}): {message}"),
    rs(f"{ECC}/protocol/utility.rs:245", "return Err(Error::UtilityCallFailed {"),
    engine("vllm/v1/engine/core.py:1850",
           'output.failure_message = f"Call to {name} method failed: {str(e)}"'),
    note="rust's UtilityCallFailed names the method (error.rs:84); python raises the engine's "
         "failure message as it came (core_client.py:941) and relies on the engine's own "
         "text naming it ('Call to {name} method failed', core.py:1850)",
)
SILENT = recommendation(
    py(f"{CC}:1334", "return await future"),
    rs(f"{CLIENT}:756", "rx.await"),
    rs(f"{CLIENT}:757", ".map_err(|_| Error::UtilityCallClosed {"),
    note="neither 0.33.0 frontend bounds a utility wait (python awaits a bare future, "
         "core_client.py:1334; rust awaits its oneshot, client.rs:756); corewire advises a "
         "bound so a silent engine cannot hang the caller, and an error naming that engine",
)
DISAGREE = both(
    py(f"{CC}:1318", 'f"Engines returned different {method} results: {results}"'),
    rs(f"{CLIENT}:784", 'values: format!("{results:?}"),'),
    rs(f"{ECC}/error.rs:98", "returned inconsistent results across engines: {values}"),
    _RS_REPORT,
)


# ---------------------------------------------------------------- a failure's own message

@case("utility.edges.failure_message_reaches_caller_{n}", Level.MUST,
      "When engine {failing} of {n} fails is_scheduler_paused with its own "
      "message, the caller's error carries that message (not a bare 'failed').",
      grounds=FAIL, needs=CALL,
      params=[{"n": n, "failing": failing} for n, failing in ((1, 0), (2, 0), (3, 1))])
async def failure_message(ctx: CaseContext, n: int, failing: int) -> None:
    text = f"cw-boom-{failing}-scheduler-on-fire"
    scripts = utility_engines("is_scheduler_paused", *[UtilityReply(False)] * n)
    group = await ctx.start(scripts)
    group.engines[failing].script.utilities["is_scheduler_paused"] = UtilityReply(
        failure=text)
    try:
        value = await ctx.driver.call_utility("is_scheduler_paused", [])
    except FrontendError as exc:
        ctx.require(text in str(exc),
                    expected=f"an error carrying the engine's message {text!r}",
                    observed=str(exc))
        return
    ctx.fail(expected=f"an error carrying {text!r}", observed=f"answered {value!r}")


# ---------------------------------------------------------------- a failure names its method

# method -> what every other engine answers
OTHERS_ANSWER: dict[str, Any] = {
    "is_sleeping": False, "reset_prefix_cache": True, "is_scheduler_paused": False}
NEEDS: dict[str, list[Capability]] = {
    "is_sleeping": [Capability.IS_SLEEPING],
    "reset_prefix_cache": [Capability.RESET_PREFIX_CACHE],
    "is_scheduler_paused": [Capability.CALL_UTILITY],
}


async def _call(ctx: CaseContext, method: str) -> Any:
    """`method` the way the client calls it: its own surface where it has one."""
    if method == "is_sleeping":
        return await ctx.driver.is_sleeping()
    if method == "reset_prefix_cache":
        return await ctx.driver.reset_prefix_cache()
    return await ctx.driver.call_utility(method, [])


@case("utility.more_edges.failure_names_method_{method}_{engines}_engines", Level.SHOULD,
      "When engine {failing} of {engines} fails {method} (with a message that does not "
      "name it), the caller's error should name the method {method!r} as well as carry "
      "the engine's message (Rust UtilityCallFailed names the method).",
      grounds=FAIL_NAMES, needs=[Capability.CALL_UTILITY],
      params=[{"method": method, "engines": engines, "failing": failing,
               "needs": NEEDS[method]}
              for method, engines, failing in (("is_sleeping", 1, 0),
                                               ("reset_prefix_cache", 2, 1),
                                               ("is_scheduler_paused", 3, 2))])
async def failure_names_method(ctx: CaseContext, method: str, engines: int,
                               failing: int) -> None:
    text = f"cw-engine-{failing}-refused"
    scripts = [EngineScript(utilities={method: UtilityReply(OTHERS_ANSWER[method])})
               for _ in range(engines)]
    scripts[failing].utilities[method] = UtilityReply(failure=text)
    await ctx.start(scripts)
    try:
        value = await asyncio.wait_for(_call(ctx, method), ctx.t(3))
    except UnsupportedOperation:
        raise  # the driver cannot make this call: UNSUPPORTED
    except FrontendError as exc:
        ctx.require(method in str(exc) and text in str(exc),
                    expected=f"an error naming {method!r} and carrying {text!r}",
                    observed=str(exc))
        return
    except asyncio.TimeoutError:
        ctx.fail(expected="the call fails within 3 s", observed="still pending after 3 s")
    ctx.fail(expected=f"the call fails naming {method!r}", observed=f"answered {value!r}")


# ---------------------------------------------------------------- a silent engine, named

def _names(text: str, rank: int) -> bool:
    """The error names engine `rank` (as 'engine 1', 'engines [0, 1]', 'rank 1'...)."""
    return bool(re.search(rf"(engine|rank|dp)\w*\W{{0,3}}(\[[\d, ]*)?\b{rank}\b", text,
                          re.I))


@case("utility.edges.silent_engine_named_{n}", Level.SHOULD,
      "A reset_prefix_cache call that engine {silent} of {n} never answers should "
      "fail within a bound with an error naming engine {silent} and none of the "
      "engines that answered (Rust and Python 0.33.0 wait without a bound).",
      grounds=SILENT, needs=[Capability.RESET_PREFIX_CACHE], timeout=40,
      params=[{"n": n, "silent": silent} for n, silent in ((2, 0), (3, 1))])
async def silent_named(ctx: CaseContext, n: int, silent: int) -> None:
    scripts = [EngineScript(utilities={"reset_prefix_cache": UtilityReply(
        True, never=rank == silent)}) for rank in range(n)]
    await ctx.start(scripts)
    try:
        value = await asyncio.wait_for(ctx.driver.reset_prefix_cache(),
                                       ctx.t(UTILITY_GIVE_UP_S))
    except FrontendError as exc:
        text = str(exc)
        answered = [r for r in range(n) if r != silent and _names(text, r)]
        ctx.require(_names(text, silent) and not answered,
                    expected=f"an error naming engine {silent} only", observed=text)
        return
    except asyncio.TimeoutError:
        ctx.fail(expected=f"an error within {UTILITY_GIVE_UP_S:g} s",
                 observed=f"the call was still pending after "
                          f"{UTILITY_GIVE_UP_S:g} s (no bound)")
    ctx.fail(expected=f"an error naming engine {silent}", observed=f"answered {value!r}")


# ---------------------------------------------------------------- disagreement, shown

@case("utility.edges.disagreement_shows_values_{n}", Level.MUST,
      "When {n} engines disagree on {method} ({values}), the error shows "
      "the odd answer {odd!r} (Python: 'Engines returned different {method} "
      "results: [...]', core_client.py:1316-1319).", grounds=DISAGREE, needs=CALL,
      params=[{"n": len(values), "values": values, "method": "get_weight_version",
               "odd": "cw-v9"}
              for values in (["v1", "v1", "cw-v9"], ["cw-v9", "v1"])])
async def disagreement_shown(ctx: CaseContext, method: str, values: list[Any],
                             odd: str) -> None:
    await ctx.start([EngineScript(utilities={method: UtilityReply(v)}) for v in values])
    try:
        value = await ctx.driver.call_utility(method, [])
    except FrontendError as exc:
        ctx.require(odd in str(exc), expected=f"an error showing {odd!r}",
                    observed=str(exc))
        return
    ctx.fail(expected=f"an error showing {odd!r}", observed=f"answered {value!r}")
