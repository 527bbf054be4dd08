"""Registration and ready-response sync (seed PR #42967, vllm/v1/engine/core_client.py).

Every engine registers with one ready frame; the frontend derives max_model_len (min),
num_gpu_blocks (sum) and block_size (synced) from them, and rejects unusable frames
promptly instead of hanging.
"""

from __future__ import annotations

import re
import time

import msgspec

from harness.case_context import CaseContext
from harness.casekit import prompt
from harness.frontends.driver import Capability, StartupError
from harness.verdicts import Level, case
from mock_engines.script import EngineScript, default_ready

CLIENT = "vllm/v1/engine/core_client.py (0.33.0)"
READY = "vllm/v1/engine/__init__.py EngineCoreReadyResponse (0.33.0)"


def _ready(rank: int, dp: int = 1, **fields: object) -> EngineScript:
    return EngineScript(ready=default_ready(rank, dp, **fields))


def _raw_ready(rank: int, drop: str | None = None, **extra: object) -> EngineScript:
    fields = msgspec.structs.asdict(default_ready(rank))
    if drop is not None:
        del fields[drop]
    fields.update(extra)
    return EngineScript(ready_payload=msgspec.msgpack.encode(fields))


async def _expect_startup_failure(ctx: CaseContext, scripts: list[EngineScript],
                                  within: float) -> str:
    """Start must fail with StartupError within `within` (scaled) seconds."""
    began = time.monotonic()
    try:
        await ctx.start(scripts, startup_timeout=within * 3)
    except StartupError as exc:
        elapsed = time.monotonic() - began
        ctx.require(elapsed <= ctx.t(within), expected=f"startup error within {within}s",
                    observed=f"startup error after {elapsed:.2f}s: {exc}")
        return str(exc)
    ctx.require(False, expected="the frontend refuses to start",
                observed="the frontend started and serves")
    return ""


@case("handshake.register.all_engines", Level.MUST,
      "The frontend serves only once every engine identity has registered, and then "
      "reaches each of them.", source=CLIENT, needs=[Capability.GENERATE, Capability.DP_RANK])
async def register_all(ctx: CaseContext) -> None:
    group = await ctx.start(2)
    for rank in (0, 1):
        handle = await ctx.driver.generate(prompt(rank), 3, data_parallel_rank=rank)
        await handle.wait(ctx.t(3))
        ctx.require(handle.finish_reason == "length" and len(handle.tokens) == 3,
                    expected=f"request on engine {rank} completes with 3 tokens",
                    observed=f"{handle.finish_reason} {handle.tokens} error={handle.error}")
        ctx.require(len(group.transcript.adds(rank)) == 1,
                    expected=f"one ADD at engine {rank}",
                    observed=f"{len(group.transcript.adds(rank))} ADDs")


@case("handshake.ready.max_model_len_min", Level.MUST,
      "max_model_len is the minimum over the engines' ready responses.",
      source=CLIENT, needs=[Capability.MAX_MODEL_LEN])
async def max_model_len_min(ctx: CaseContext) -> None:
    await ctx.start([_ready(0, 2, max_model_len=1000), _ready(1, 2, max_model_len=900)])
    cfg = await ctx.driver.observed_config()
    ctx.require(cfg.max_model_len == 900, expected="max_model_len 900 (min of 1000, 900)",
                observed=cfg.max_model_len)


@case("handshake.ready.num_gpu_blocks_sum", Level.MUST,
      "num_gpu_blocks is the sum over the engines' ready responses.",
      source=CLIENT, needs=[Capability.NUM_GPU_BLOCKS])
async def num_gpu_blocks_sum(ctx: CaseContext) -> None:
    await ctx.start([_ready(0, 2, num_gpu_blocks=100), _ready(1, 2, num_gpu_blocks=250)])
    cfg = await ctx.driver.observed_config()
    ctx.require(cfg.num_gpu_blocks == 350, expected="num_gpu_blocks 350 (100 + 250)",
                observed=cfg.num_gpu_blocks)


@case("handshake.ready.block_size_single", Level.MUST,
      "block_size is taken from the engine's ready response, not the frontend's default.",
      source="PR #42967", needs=[Capability.BLOCK_SIZE])
async def block_size_single(ctx: CaseContext) -> None:
    await ctx.start([_ready(0, block_size=1056)])
    cfg = await ctx.driver.observed_config()
    ctx.require(cfg.block_size == 1056, expected="block_size 1056 from the ready response",
                observed=cfg.block_size)


@case("handshake.ready.block_size_dp_equal", Level.MUST,
      "With DP engines reporting the same block_size, the frontend uses that value.",
      source="PR #42967", needs=[Capability.BLOCK_SIZE])
async def block_size_dp_equal(ctx: CaseContext) -> None:
    await ctx.start([_ready(0, 2, block_size=32), _ready(1, 2, block_size=32)])
    cfg = await ctx.driver.observed_config()
    ctx.require(cfg.block_size == 32, expected="block_size 32", observed=cfg.block_size)


@case("handshake.ready.block_size_dp_disagree", Level.SHOULD,
      "DP engines that report different block_size values should be detected (refusing "
      "to start), not silently resolved.", source="PR #42967; semantics.md (c)",
      needs=[Capability.BLOCK_SIZE])
async def block_size_dp_disagree(ctx: CaseContext) -> None:
    try:
        await ctx.start([_ready(0, 2, block_size=16), _ready(1, 2, block_size=32)])
    except StartupError as exc:
        ctx.note(f"frontend refused to start: {exc}")
        return
    cfg = await ctx.driver.observed_config()
    ctx.require(False, expected="startup refused because engines disagree on block_size",
                observed=f"frontend started with block_size={cfg.block_size}")


@case("handshake.ready.missing_block_size", Level.MUST,
      "A ready response without the required block_size key is rejected at startup with "
      "a clear error, promptly (no hang).", source="PR #42967")
async def missing_block_size(ctx: CaseContext) -> None:
    await _expect_startup_failure(ctx, [_raw_ready(0, drop="block_size")], within=4)


@case("handshake.ready.missing_max_model_len", Level.MUST,
      "A ready response without the required max_model_len key is rejected at startup, "
      "promptly.", source=READY)
async def missing_max_model_len(ctx: CaseContext) -> None:
    await _expect_startup_failure(ctx, [_raw_ready(0, drop="max_model_len")], within=4)


@case("handshake.ready.garbage_payload", Level.MUST,
      "A ready frame that is not msgpack is rejected at startup, promptly.", source=READY)
async def garbage_ready(ctx: CaseContext) -> None:
    await _expect_startup_failure(ctx, [EngineScript(ready_payload=b"\xc1\xc1garbage")],
                                  within=4)


@case("handshake.ready.wrong_field_type", Level.MUST,
      "A ready response whose block_size is a string is rejected at startup, promptly.",
      source=READY)
async def wrong_type_ready(ctx: CaseContext) -> None:
    await _expect_startup_failure(ctx, [_raw_ready(0, block_size="16")], within=4)


@case("handshake.ready.unknown_keys_ignored", Level.MUST,
      "Unknown extra keys in a ready response are ignored (newer engines add fields).",
      source=READY, needs=[Capability.GENERATE])
async def unknown_keys(ctx: CaseContext) -> None:
    await ctx.start([_raw_ready(0, some_future_field={"x": 1}, another=[1, 2])])
    handle = await ctx.driver.generate(prompt(0), 2)
    await handle.wait(ctx.t(3))
    ctx.require(handle.finish_reason == "length", expected="the frontend serves normally",
                observed=f"{handle.finish_reason} error={handle.error}")


@case("handshake.register.never_registers", Level.MUST,
      "An engine that never registers makes startup fail with a bounded error.",
      source=CLIENT, timeout=20)
async def never_registers(ctx: CaseContext) -> None:
    scripts = [EngineScript(), EngineScript(register=False)]
    began = time.monotonic()
    try:
        await ctx.start(scripts, startup_timeout=1.5)
    except StartupError as exc:
        ctx.note(f"startup error after {time.monotonic() - began:.2f}s: {exc}")
        return
    ctx.require(False, expected="startup error (engine 1 never registered)",
                observed="the frontend started")


@case("handshake.register.never_registers_named", Level.SHOULD,
      "The startup error for an engine that never registers should name that engine.",
      source=CLIENT, timeout=20)
async def never_registers_named(ctx: CaseContext) -> None:
    try:
        await ctx.start([EngineScript(), EngineScript(register=False)], startup_timeout=1.5)
    except StartupError as exc:
        text = str(exc)
        named = re.search(r"(engine|rank|dp)\D{0,20}\b1\b", text, re.I) or "0100" in text
        ctx.require(bool(named), expected="an error naming engine 1", observed=text)
        return
    ctx.require(False, expected="startup error naming engine 1", observed="it started")


@case("handshake.ready.empty_payload", Level.INFO,
      "Records whether the frontend accepts an empty ready payload (vLLM's Python client "
      "treats it as 'no config to sync').", source=CLIENT)
async def empty_payload(ctx: CaseContext) -> None:
    try:
        await ctx.start([EngineScript(ready_payload=b"")], startup_timeout=4)
        ctx.note("frontend started with an empty ready payload")
    except StartupError as exc:
        ctx.note(f"frontend refused an empty ready payload: {exc}")
