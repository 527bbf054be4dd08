"""What a utility call puts on the wire (protocol-python.md §5.4): the UTILITY frame and the
method's arguments exactly as the caller gave them.

The frame is type byte 0x03, then [client_index, call_id, method, args]. What a port gets
wrong: flags passed through in the wrong order or not at all, wake_up's tags dropped, split
or replaced by null, and optional arguments replaced by their defaults or re-typed.
"""

from __future__ import annotations

from typing import Any

from conformance.utility.helpers import (
    CALL,
    CC,
    CLIENT,
    CORE,
    ECC,
    ENGINE_ZERO,
    ROUTES,
    TESTS,
    UTIL,
    call_counts,
    calls_since,
    utility_engines,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    Level,
    UtilityReply,
    both,
    case,
    engine,
    py,
    rs,
    same_value,
)

# The UTILITY frame: type byte 0x03, then [client_index, call_id, method, args].
WIRE_SHAPE = both(
    py("vllm/v1/engine/__init__.py:308", r'UTILITY = b"\x03"'),
    py(f"{CC}:1325", "call_id = uuid.uuid1().int >> 64"),
    py(f"{CC}:1330", "*self.encoder.encode((self.client_index, call_id, method, args)),"),
    rs(f"{ECC}/protocol/request.rs:55", r'Self::Utility => b"\x03",'),
    rs(f"{UTIL}:159", "pub client_index: u32,"),
    rs(f"{UTIL}:185", "Value::Nil => Value::Array(Vec::new()),"),
    rs(f"{TESTS}:1448", "assert_eq!(array[3], Value::Array(Vec::new()));"),
    engine(f"{CORE}:1765", "client_idx, call_id, method_name, args = request"),
)
# reset_prefix_cache() with its defaults: both send the two flags, false.
RESET_DEFAULTS = both(
    py(f"{CC}:1385", "self, reset_running_requests: bool = False, reset_connector: bool = False"),
    py(f"{CC}:1389", '"reset_prefix_cache", reset_running_requests, reset_connector'),
    rs(f"{ROUTES}/cache.rs:36",
       ".reset_prefix_cache(params.reset_running_requests, params.reset_external)"),
    rs(f"{CLIENT}:928", "(reset_running_requests, reset_connector),"),
    engine(f"{CORE}:884",
           "self, reset_running_requests: bool = False, reset_connector: bool = False"),
    note="SHOULD, not MUST: the engine's reset_prefix_cache defaults both flags to False "
         "(core.py:884), so args [] act the same; no engine relies on the explicit falses",
)
RESET = both(
    py(f"{CC}:1389", '"reset_prefix_cache", reset_running_requests, reset_connector'),
    rs(f"{ROUTES}/cache.rs:36",
       ".reset_prefix_cache(params.reset_running_requests, params.reset_external)"),
    rs(f"{CLIENT}:928", "(reset_running_requests, reset_connector),"),
    engine(f"{CORE}:884",
           "self, reset_running_requests: bool = False, reset_connector: bool = False"),
)
WAKE = both(
    py(f"{CC}:1403", 'return all(await self.call_utility_all_async("wake_up", tags))'),
    rs(f"{CLIENT}:969", '.call_utility::<bool, _>("wake_up", (tags,))'),
    rs(f"{ROUTES}/sleep.rs:105", '.filter(|(key, _)| key == "tags")'),
    rs(f"{TESTS}:2363", "assert_eq!(array[3], Value::Array(vec![tags]));"),
    engine(f"{CORE}:1031", "def wake_up(self, tags: list[str] | None = None) -> bool:"),
)
ARGS = both(
    py(f"{CC}:1397", 'await self.call_utility_async("sleep", level, mode)'),
    py(f"{CC}:1356", 'await self.call_utility_async("pause_generation", mode, clear_cache)'),
    py(f"{CC}:1442", '"collective_rpc", method, timeout, args, kwargs'),
    ENGINE_ZERO,
    rs(f"{CLIENT}:955", 'self.call_utility::<(), _>("sleep", (level, mode)).await?;'),
    rs(f"{CLIENT}:978",
       'self.call_utility::<(), _>("pause_generation", (mode, clear_cache)).await?;'),
    rs(f"{CLIENT}:803",
       '.call_utility::<rmpv::Value, _>("collective_rpc", (method, timeout, args, kwargs))'),
    rs(f"{ROUTES}/sleep.rs:61", "let Query(SleepParams { level, mode }) = params.map_err("),
    rs(f"{ROUTES}/pause.rs:51", ".pause_generation(params.mode, params.clear_cache)"),
    rs(f"{ROUTES}/collective_rpc.rs:49",
       ".collective_rpc(&method, body.timeout, body.args, body.kwargs)"),
    engine(f"{CORE}:993", 'def sleep(self, level: int = 1, mode: PauseMode = "abort")'),
    engine(f"{CORE}:2226", 'self, mode: PauseMode = "abort", clear_cache: bool = True'),
)


@case("utility.is_sleeping.wire_shape", Level.MUST,
      "is_sleeping is sent as UTILITY [client_index:int, call_id:uint64, 'is_sleeping', []].",
      grounds=WIRE_SHAPE, needs=[Capability.IS_SLEEPING])
async def is_sleeping_shape(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    await ctx.driver.is_sleeping()
    calls = group.transcript.utility_calls("is_sleeping")
    ctx.require(len(calls) == 1, expected="one is_sleeping frame", observed=len(calls))
    msg = calls[0].message
    ctx.require(calls[0].frames[0] == b"\x03", expected="type frame 0x03",
                observed=calls[0].frames[0].hex())
    ctx.require(isinstance(msg.client_index, int) and 0 <= msg.call_id < 2**64
                and msg.args == [],
                expected="[int, uint64, 'is_sleeping', []]",
                observed=[msg.client_index, msg.call_id, msg.method, msg.args])


@case("utility.reset_prefix_cache.wire_args", Level.SHOULD,
      "reset_prefix_cache() should be sent with args [false, false] "
      "(reset_running_requests, reset_connector).", grounds=RESET_DEFAULTS,
      needs=[Capability.RESET_PREFIX_CACHE])
async def reset_args(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    await ctx.driver.reset_prefix_cache()
    calls = group.transcript.utility_calls("reset_prefix_cache")
    ctx.require([c.message.args for c in calls] == [[False, False]],
                expected="one call with args [false, false]",
                observed=[c.message.args for c in calls])


# ---------------------------------------------------------------- reset_prefix_cache flags

@case("utility.edges.reset_prefix_cache_flags_{bits}", Level.MUST,
      "reset_prefix_cache(reset_running_requests={rr}, reset_connector={rc}) "
      "reaches each of 2 engines with args [{rr}, {rc}], in that order.",
      grounds=RESET, needs=[Capability.RESET_PREFIX_CACHE],
      params=[{"rr": rr, "rc": rc, "bits": f"{int(rr)}{int(rc)}"}
              for rr, rc in ((True, False), (False, True), (True, True))])
async def reset_flags(ctx: CaseContext, rr: bool, rc: bool) -> None:
    group = await ctx.start(2)
    before = len(group.transcript.utility_calls("reset_prefix_cache"))
    await ctx.driver.reset_prefix_cache(reset_running_requests=rr, reset_connector=rc)
    calls = group.transcript.utility_calls("reset_prefix_cache")[before:]
    args = sorted((c.rank, c.message.args) for c in calls)
    ctx.require(args == [(0, [rr, rc]), (1, [rr, rc])],
                expected=f"engines 0 and 1 each get args [{rr}, {rc}]",
                observed=args)


# ---------------------------------------------------------------- wake_up tags

@case("utility.wake_up.tags_forwarded_{count}", Level.MUST,
      "wake_up(tags={tags}) reaches each of 2 engines once with args [{tags}]: the "
      "tags as one list, in the caller's order (not dropped, not split, not "
      "replaced by null).", grounds=WAKE, needs=CALL,
      params=[{"tags": tags, "count": len(tags)}
              for tags in (["weights"], ["weights", "kv_cache"])])
async def tags_forwarded(ctx: CaseContext, tags: list[str]) -> None:
    group = await ctx.start(utility_engines("wake_up", *[UtilityReply(True)] * 2))
    before = call_counts(group, "wake_up")
    await ctx.driver.call_utility("wake_up", [tags])
    seen = calls_since(group, "wake_up", before)
    ctx.require(seen == {0: [[tags]], 1: [[tags]]},
                expected=f"engines 0 and 1 each get one wake_up with args [{tags}]",
                observed=seen)


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


@case("utility.args.{suffix}", Level.MUST,
      "{method} called with arguments other than its defaults reaches each of 2 "
      "engines once with exactly the wire args {args} (none replaced by a "
      "default, dropped or re-typed).", grounds=ARGS, needs=CALL,
      params=[{"suffix": suffix, "method": method, "args": args}
              for suffix, method, args in NON_DEFAULT])
async def non_default_args(ctx: CaseContext, method: str, args: list[Any]) -> None:
    group = await ctx.start(utility_engines(
        method, *[UtilityReply(NON_DEFAULT_ANSWER[method])] * 2))
    before = call_counts(group, method)
    await ctx.driver.call_utility(method, args)
    seen = calls_since(group, method, before)
    ok = all(len(calls) == 1 and same_value(calls[0], args) for calls in seen.values())
    ctx.require(ok, expected=f"engines 0 and 1 each get one {method} with args {args}",
                observed=seen)
