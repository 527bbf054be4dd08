"""Utility edges a port gets wrong: flags passed through, the fold over every engine count
(one engine included), engine 0's answer for first-answer methods, and a failing engine's
own message reaching the caller.

Sources: Python DPLB `call_utility_all_async` / the per-method folds (core_client.py
:1305-1320, :1361-1415, :1814-1816), a failure reply becoming the caller's exception
(core_client.py `_process_utility_output`); Rust `call_utility` (rust-client.md §1.7).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

from conformance.utility.test_utility import CALL, LORA
from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import Grounds, both, differ, engine, py, recommendation, rs
from harness.cases.helpers import UTILITY_GIVE_UP_S, same_value
from harness.frontends.api import Capability, FrontendError
from harness.results.records import Level
from mock_engines.script import EngineScript, UtilityReply, default_ready

_CC = "vllm/v1/engine/core_client.py"
_CORE = "vllm/v1/engine/core.py"
_ECC = "rust/src/engine-core-client/src"
_CLIENT = f"{_ECC}/client.rs"
_UTIL = f"{_ECC}/protocol/utility.rs"
_TESTS = f"{_ECC}/tests/client.rs"
_ROUTES = "rust/src/server/src/routes"
_FIRST = py(f"{_CC}:1816", "return (await self.call_utility_all_async(method, *args))[0]")
# The server turns a client error into the HTTP error text with the error's report.
_RS_REPORT = rs("rust/src/server/src/utils.rs:57",
                'ApiError::server_error(format!("failed to call {method}: {}", error.as_report()))')

RESET = both(
    py(f"{_CC}:1389", '"reset_prefix_cache", reset_running_requests, reset_connector'),
    rs(f"{_ROUTES}/cache.rs:36",
       ".reset_prefix_cache(params.reset_running_requests, params.reset_external)"),
    rs(f"{_CLIENT}:928", "(reset_running_requests, reset_connector),"),
    engine(f"{_CORE}:884",
           "self, reset_running_requests: bool = False, reset_connector: bool = False"),
)
WAKE = both(
    py(f"{_CC}:1403", 'return all(await self.call_utility_all_async("wake_up", tags))'),
    rs(f"{_CLIENT}:969", '.call_utility::<bool, _>("wake_up", (tags,))'),
    rs(f"{_ROUTES}/sleep.rs:105", '.filter(|(key, _)| key == "tags")'),
    rs(f"{_TESTS}:2363", "assert_eq!(array[3], Value::Array(vec![tags]));"),
    engine(f"{_CORE}:1031", "def wake_up(self, tags: list[str] | None = None) -> bool:"),
)
ARGS = both(
    py(f"{_CC}:1397", 'await self.call_utility_async("sleep", level, mode)'),
    py(f"{_CC}:1356", 'await self.call_utility_async("pause_generation", mode, clear_cache)'),
    py(f"{_CC}:1442", '"collective_rpc", method, timeout, args, kwargs'),
    _FIRST,
    rs(f"{_CLIENT}:955", 'self.call_utility::<(), _>("sleep", (level, mode)).await?;'),
    rs(f"{_CLIENT}:978",
       'self.call_utility::<(), _>("pause_generation", (mode, clear_cache)).await?;'),
    rs(f"{_CLIENT}:803",
       '.call_utility::<rmpv::Value, _>("collective_rpc", (method, timeout, args, kwargs))'),
    rs(f"{_ROUTES}/sleep.rs:61", "let Query(SleepParams { level, mode }) = params.map_err("),
    rs(f"{_ROUTES}/pause.rs:51", ".pause_generation(params.mode, params.clear_cache)"),
    rs(f"{_ROUTES}/collective_rpc.rs:49",
       ".collective_rpc(&method, body.timeout, body.args, body.kwargs)"),
    engine(f"{_CORE}:993", 'def sleep(self, level: int = 1, mode: PauseMode = "abort")'),
    engine(f"{_CORE}:2226", 'self, mode: PauseMode = "abort", clear_cache: bool = True'),
)
CONSENSUS = both(
    py(f"{_CC}:1316", "if any(result != results[0] for result in results):"),
    py(f"{_CC}:1362", 'return await self.call_utility_consensus_async("is_scheduler_paused")'),
    py(f"{_CC}:1415", 'return await self.call_utility_consensus_async("get_weight_version")'),
    rs(f"{_CLIENT}:777", "if results.iter().all_equal() {"),
    rs(f"{_CLIENT}:990", 'self.call_utility_consensus("is_scheduler_paused", ()).await'),
    rs(f"{_CLIENT}:896", 'self.call_utility_consensus("get_weight_version", ()).await'),
)
ADD_LORA_TRUE = both(
    py(f"{_CC}:1418", 'return await self.call_utility_async("add_lora", lora_request)'),
    _FIRST,
    rs(f"{_CLIENT}:941", ".all(|loaded| loaded))"),
    note="rust ANDs and python returns engine 0's answer (the and_across_engines cases); with "
         "every engine answering true both give true",
)
LIST_LORAS = both(
    py(f"{_CC}:1424", 'return await self.call_utility_async("list_loras")'),
    _FIRST,
    py(f"{_CC}:944", "future.set_result(output.result.result)"),
    rs(f"{_UTIL}:252", "let result = self.result.map(|e| e.result).unwrap_or(Value::Nil);"),
    rs(f"{_CLIENT}:713",
       "pub async fn call_utility<T, A>(&self, method: &str, args: A) -> Result<Vec<T>>"),
    engine(f"{_CORE}:1094", "def list_loras(self) -> set[int]:"),
    note="vllm-rs never sends list_loras (it lists its own adapter registry, "
         "server/src/state.rs:168); its call_utility hands any engine's answer back as sent",
)
FAIL = both(
    py(f"{_CC}:941", "future.set_exception(Exception(failure_message))"),
    rs(f"{_UTIL}:245", "return Err(Error::UtilityCallFailed {"),
    rs(f"{_ECC}/error.rs:84",
       "#[error(\"utility call `{method}` failed (call_id={call_id}): {message}\")]"),
    _RS_REPORT,
    engine(f"{_CORE}:1850", 'output.failure_message = f"Call to {name} method failed: {str(e)}"'),
)
NON_BOOL = differ(
    py(f"{_CC}:1406", 'return await self.call_utility_consensus_async("is_sleeping")'),
    py(f"{_CC}:1316", "if any(result != results[0] for result in results):"),
    rs(f"{_CLIENT}:901", 'self.call_utility_consensus("is_sleeping", ()).await'),
    rs(f"{_UTIL}:254",
       "rmpv::ext::from_value(result).map_err(|error| Error::UtilityResultDecode {"),
    note="rust decodes is_sleeping as a bool and refuses anything else (utility.rs:254); "
         "python compares the engines' answers and returns whatever they agree on "
         "(core_client.py:1316)",
)
SILENT = recommendation(
    py(f"{_CC}:1334", "return await future"),
    rs(f"{_CLIENT}:756", "rx.await"),
    rs(f"{_CLIENT}:757", ".map_err(|_| Error::UtilityCallClosed {"),
    note="neither 0.33.0 frontend bounds a utility wait (python awaits a bare future, "
         "core_client.py:1334; rust awaits its oneshot, client.rs:756); corewire advises a "
         "bound so a silent engine cannot hang the caller, and an error naming that engine",
)
DISAGREE = both(
    py(f"{_CC}:1318", 'f"Engines returned different {method} results: {results}"'),
    rs(f"{_CLIENT}:784", 'values: format!("{results:?}"),'),
    rs(f"{_ECC}/error.rs:98", "returned inconsistent results across engines: {values}"),
    _RS_REPORT,
)
UNLISTED = differ(
    _FIRST,
    py(f"{_CC}:1815", "# Only the result from the first engine is returned."),
    rs(f"{_CLIENT}:713",
       "pub async fn call_utility<T, A>(&self, method: &str, args: A) -> Result<Vec<T>>"),
    note="python's DPLB client answers any method with engine 0's result "
         "(core_client.py:1816); rust's call_utility returns one result per engine for its "
         "caller to fold (client.rs:713), and vllm-rs serves no route for a method it does "
         "not know",
)


def _engines(n: int, method: str, reply: UtilityReply, lora: bool = False
             ) -> list[EngineScript]:
    """n engines answering `method` alike; LoRA methods need engines that report LoRA."""
    if not lora:
        return [EngineScript(utilities={method: reply}) for _ in range(n)]
    return [EngineScript(ready=default_ready(rank, n, supports_lora=True, max_loras=4),
                         utilities={"add_lora": UtilityReply(True), method: reply})
            for rank in range(n)]


# ---------------------------------------------------------------- reset_prefix_cache flags

for _rr, _rc in ((True, False), (False, True), (True, True)):
    def _make_reset(rr: bool = _rr, rc: bool = _rc) -> None:
        @case(f"utility.edges.reset_prefix_cache_flags_{int(rr)}{int(rc)}", Level.MUST,
              f"reset_prefix_cache(reset_running_requests={rr}, reset_connector={rc}) "
              f"reaches each of 2 engines with args [{rr}, {rc}], in that order.",
              grounds=RESET, needs=[Capability.RESET_PREFIX_CACHE])
        async def reset_flags(ctx: CaseContext) -> None:
            group = await ctx.start(2)
            before = len(group.transcript.utility_calls("reset_prefix_cache"))
            await ctx.driver.reset_prefix_cache(reset_running_requests=rr,
                                                reset_connector=rc)
            calls = group.transcript.utility_calls("reset_prefix_cache")[before:]
            args = sorted((c.rank, c.message.args) for c in calls)
            ctx.require(args == [(0, [rr, rc]), (1, [rr, rc])],
                        expected=f"engines 0 and 1 each get args [{rr}, {rc}]",
                        observed=args)

        globals()[f"reset_flags_{int(rr)}{int(rc)}"] = reset_flags
    _make_reset()


# ---------------------------------------------------------------- wake_up tags

for _tags in (["weights"], ["weights", "kv_cache"]):
    def _make_tags(tags: list[str] = _tags) -> None:
        @case(f"utility.wake_up.tags_forwarded_{len(tags)}", Level.MUST,
              f"wake_up(tags={tags}) reaches each of 2 engines once with args [{tags}]: the "
              "tags as one list, in the caller's order (not dropped, not split, not "
              "replaced by null).", grounds=WAKE, needs=CALL)
        async def tags_forwarded(ctx: CaseContext) -> None:
            group = await ctx.start(_engines(2, "wake_up", UtilityReply(True)))
            before = {e.rank: len(group.transcript.utility_calls("wake_up", rank=e.rank))
                      for e in group.engines}
            await ctx.driver.call_utility("wake_up", [tags])
            seen = {e.rank: [c.message.args for c in group.transcript.utility_calls(
                "wake_up", rank=e.rank)[before[e.rank]:]] for e in group.engines}
            ctx.require(seen == {0: [[tags]], 1: [[tags]]},
                        expected=f"engines 0 and 1 each get one wake_up with args [{tags}]",
                        observed=seen)

        globals()[f"wake_up_tags_{len(tags)}"] = tags_forwarded
    _make_tags()


# ---------------------------------------------------------------- non-default arguments

# (case suffix, method, the caller's wire args: each row differs from the method's defaults
# in at least one argument, and every optional argument is non-default in some row)
NON_DEFAULT: tuple[tuple[str, str, list[Any]], ...] = (
    ("sleep_level_2_wait", "sleep", [2, "wait"]),
    ("sleep_level_1_keep", "sleep", [1, "keep"]),
    ("pause_generation_wait_keep_cache", "pause_generation", ["wait", False]),
    ("pause_generation_keep", "pause_generation", ["keep", True]),
    ("collective_rpc_timeout_args_kwargs", "collective_rpc",
     ["cw_probe", 5.0, [1, "a", None], {"k": [2], "flag": False}]),
)
NON_DEFAULT_ANSWER = {"sleep": None, "pause_generation": None, "collective_rpc": ["w"]}

for _suffix, _method, _args in NON_DEFAULT:
    def _make_args(suffix: str = _suffix, method: str = _method, args: list[Any] = _args
                   ) -> None:
        @case(f"utility.args.{suffix}", Level.MUST,
              f"{method} called with arguments other than its defaults reaches each of 2 "
              f"engines once with exactly the wire args {args} (none replaced by a "
              "default, dropped or re-typed).", grounds=ARGS, needs=CALL)
        async def non_default_args(ctx: CaseContext) -> None:
            group = await ctx.start(_engines(2, method, UtilityReply(
                NON_DEFAULT_ANSWER[method])))
            before = {e.rank: len(group.transcript.utility_calls(method, rank=e.rank))
                      for e in group.engines}
            await ctx.driver.call_utility(method, args)
            seen = {e.rank: [c.message.args for c in group.transcript.utility_calls(
                method, rank=e.rank)[before[e.rank]:]] for e in group.engines}
            ok = all(len(calls) == 1 and same_value(calls[0], args)
                     for calls in seen.values())
            ctx.require(ok, expected=f"engines 0 and 1 each get one {method} with args "
                                     f"{args}", observed=seen)

        globals()[f"non_default_{suffix}"] = non_default_args
    _make_args()


# ---------------------------------------------------------------- folds at every count

def _fold_case(case_id: str, requirement: str, method: str, args: list[Any], answer: Any,
               expected: Any, n: int, grounds: Grounds, lora: bool = False
               ) -> Callable[[CaseContext], Awaitable[None]]:
    async def run(ctx: CaseContext) -> None:
        await ctx.start(_engines(n, method, UtilityReply(answer), lora))
        if method == "remove_lora":
            await ctx.driver.call_utility("add_lora", [LORA])
        result = await ctx.driver.call_utility(method, args)
        ctx.require(result == expected and type(result) is type(expected),
                    expected=f"{method} over {n} engine(s) answering {answer!r}: "
                             f"{expected!r}", observed=repr(result))

    return case(case_id, Level.MUST, requirement, grounds=grounds, needs=CALL)(run)


for _n in (1, 2, 3):
    globals()[f"consensus_weight_version_{_n}"] = _fold_case(
        f"utility.edges.get_weight_version_agree_{_n}",
        f"get_weight_version over {_n} engine(s) that all answer 'v7' is 'v7' (a single "
        "engine is its own consensus).", "get_weight_version", [], "v7", "v7", _n, CONSENSUS)
    globals()[f"consensus_paused_{_n}"] = _fold_case(
        f"utility.edges.is_scheduler_paused_agree_{_n}",
        f"is_scheduler_paused over {_n} engine(s) that all answer false is false.",
        "is_scheduler_paused", [], False, False, _n, CONSENSUS)
    globals()[f"and_add_lora_true_{_n}"] = _fold_case(
        f"utility.edges.add_lora_all_true_{_n}",
        f"add_lora over {_n} engine(s) that all answer true is true (AND, or engine 0's "
        "answer: the same here).", "add_lora", [LORA], True, True, _n, ADD_LORA_TRUE,
        lora=True)
    globals()[f"list_loras_first_{_n}"] = _fold_case(
        f"utility.edges.list_loras_answer_{_n}",
        f"list_loras over {_n} engine(s) that all hold adapter 1 answers [1] (engine 0's "
        "list; the engines hold the same adapters).", "list_loras", [], [1], [1], _n,
        LIST_LORAS, lora=True)


# ---------------------------------------------------------------- a failure's own message

for _n, _failing in ((1, 0), (2, 0), (3, 1)):
    def _make_failure(n: int = _n, failing: int = _failing) -> None:
        @case(f"utility.edges.failure_message_reaches_caller_{n}", Level.MUST,
              f"When engine {failing} of {n} fails is_scheduler_paused with its own "
              "message, the caller's error carries that message (not a bare 'failed').",
              grounds=FAIL, needs=CALL)
        async def failure_message(ctx: CaseContext) -> None:
            text = f"cw-boom-{failing}-scheduler-on-fire"
            scripts = _engines(n, "is_scheduler_paused", UtilityReply(False))
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
            ctx.require(False, expected=f"an error carrying {text!r}",
                        observed=f"answered {value!r}")

        globals()[f"failure_message_{n}"] = failure_message
    _make_failure()


@case("utility.edges.is_sleeping_non_bool_refused", Level.SHOULD,
      "is_sleeping answered with a non-boolean (1) by both of 2 engines is refused as a "
      "malformed answer, not passed on (Rust deserializes a bool; Python passes any value).",
      grounds=NON_BOOL, needs=CALL)
async def is_sleeping_non_bool(ctx: CaseContext) -> None:
    await ctx.start(_engines(2, "is_sleeping", UtilityReply(1)))
    try:
        value = await ctx.driver.call_utility("is_sleeping", [])
    except FrontendError as exc:
        ctx.note(f"refused: {exc}")
        return
    ctx.require(False, expected="an error: is_sleeping answered 1, not a boolean",
                observed=f"answered {value!r}")


# ---------------------------------------------------------------- a silent engine, named

for _n, _silent in ((2, 0), (3, 1)):
    def _make_silent(n: int = _n, silent: int = _silent) -> None:
        @case(f"utility.edges.silent_engine_named_{n}", Level.SHOULD,
              f"A reset_prefix_cache call that engine {silent} of {n} never answers should "
              f"fail within a bound with an error naming engine {silent} and none of the "
              "engines that answered (Rust and Python 0.33.0 wait without a bound).",
              grounds=SILENT,
              needs=[Capability.RESET_PREFIX_CACHE], timeout=40)
        async def silent_named(ctx: CaseContext) -> None:
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
                ctx.require(False, expected=f"an error within {UTILITY_GIVE_UP_S:g} s",
                            observed=f"the call was still pending after "
                                     f"{UTILITY_GIVE_UP_S:g} s (no bound)")
                return
            ctx.require(False, expected=f"an error naming engine {silent}",
                        observed=f"answered {value!r}")

        globals()[f"silent_named_{n}"] = silent_named
    _make_silent()


def _names(text: str, rank: int) -> bool:
    """The error names engine `rank` (as 'engine 1', 'engines [0, 1]', 'rank 1'...)."""
    return bool(re.search(rf"(engine|rank|dp)\w*\W{{0,3}}(\[[\d, ]*)?\b{rank}\b", text,
                          re.I))


# ---------------------------------------------------------------- disagreement, shown

for _method, _values in (("get_weight_version", ["v1", "v1", "cw-v9"]),
                         ("get_weight_version", ["cw-v9", "v1"])):
    def _make_disagree(method: str = _method, values: list[Any] = _values) -> None:
        odd = "cw-v9"
        n = len(values)

        @case(f"utility.edges.disagreement_shows_values_{n}", Level.MUST,
              f"When {n} engines disagree on {method} ({values}), the error shows "
              f"the odd answer {odd!r} (Python: 'Engines returned different {method} "
              "results: [...]', core_client.py:1316-1319).", grounds=DISAGREE, needs=CALL)
        async def disagree_shown(ctx: CaseContext) -> None:
            await ctx.start([EngineScript(utilities={method: UtilityReply(v)})
                             for v in values])
            try:
                value = await ctx.driver.call_utility(method, [])
            except FrontendError as exc:
                ctx.require(odd in str(exc), expected=f"an error showing {odd!r}",
                            observed=str(exc))
                return
            ctx.require(False, expected=f"an error showing {odd!r}",
                        observed=f"answered {value!r}")

        globals()[f"disagree_shown_{n}"] = disagree_shown
    _make_disagree()


@case("utility.edges.unlisted_method_answered", Level.SHOULD,
      "A utility method the frontend has no folding rule for (cw_custom_probe, 2 engines "
      "answering 'cw-custom') should still be answered with engine 0's answer (Python DPLB "
      "returns engine 0's, core_client.py:1814-1816), not dropped as None.",
      grounds=UNLISTED, needs=CALL)
async def unlisted_method(ctx: CaseContext) -> None:
    method = "cw_custom_probe"
    await ctx.start([EngineScript(utilities={method: UtilityReply("cw-custom")})
                     for _ in range(2)])
    value = await ctx.driver.call_utility(method, [])
    ctx.require(value == "cw-custom", expected="'cw-custom' (engine 0's answer)",
                observed=repr(value))
