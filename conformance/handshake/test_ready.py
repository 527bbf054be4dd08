"""Ready-response sync (seed PR #42967, vllm/v1/engine/core_client.py): what the frontend
derives from its engines' ready frames, at 1..4 engines and in any arrival order.

Every engine registers with one ready frame; the frontend derives max_model_len (min),
num_gpu_blocks (sum) and block_size (synced) from them. Python `_apply_ready_response`
(`core_client.py:851-883`): max_model_len = min, num_gpu_blocks = sum, block_size = the
engines' value. Ready frames arrive reversed and interleaved, so a first-wins or last-wins
frontend is caught. Engines that disagree on block_size should be refused, and the refusal
should show the values: with many engines the operator needs the engine and the value, and
neither 0.33.0 frontend compares block_size at all.
"""

from __future__ import annotations

import re

from conformance.handshake.helpers import CC, CL, CORE, INTERLEAVED, startup_refused
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineScript,
    Level,
    StartupError,
    both,
    case,
    default_ready,
    engine,
    py,
    recommendation,
    rs,
)

MAX_LEN_MIN = both(
    py(f"{CC}:869", "vllm_config.model_config.max_model_len = min("),
    rs(f"{CL}:547", ".map(|engine| engine.ready_response.max_model_len as u32)"),
    engine(f"{CORE}:1887", "max_model_len=self.vllm_config.model_config.max_model_len,"),
)
GPU_BLOCKS_SUM = both(
    py(f"{CC}:876", "num_gpu_blocks += response.num_gpu_blocks"),
    rs(f"{CL}:528", ".map(|engine| engine.ready_response.num_gpu_blocks).sum()"),
    engine(f"{CORE}:1888", "num_gpu_blocks=self.vllm_config.cache_config.num_gpu_blocks"),
)
BLOCK_SIZE = both(
    py(f"{CC}:882", "cache_config.block_size = response.block_size"),
    rs("rust/src/server/src/grpc/control.rs:214",
       "kv_block_size: ready.block_size.min(u64::from(u32::MAX)) as u32,"),
    rs(f"{CL}:499", "pub fn ready_response(&self) -> &EngineCoreReadyResponse {"),
    engine(f"{CORE}:1889", "block_size=self.vllm_config.cache_config.block_size,"),
)
# The agreed value over every engine's ready response, however many engines.
BLOCK_SIZE_AGREE = both(
    py(f"{CC}:882", "cache_config.block_size = response.block_size"),
    rs("rust/src/server/src/grpc/control.rs:214",
       "kv_block_size: ready.block_size.min(u64::from(u32::MAX)) as u32,"),
    engine(f"{CORE}:1889", "block_size=self.vllm_config.cache_config.block_size,"),
)
BLOCK_SIZE_DISAGREE = recommendation(
    py(f"{CC}:882", "cache_config.block_size = response.block_size"),
    rs(f"{CL}:495", "Return the first engine's ready response."),
    rs("rust/src/server/src/grpc/control.rs:214",
       "kv_block_size: ready.block_size.min(u64::from(u32::MAX)) as u32,"),
    note="corewire's advice: neither 0.33.0 frontend compares block_size across engines "
         "(python keeps the last registered engine's, core_client.py:882; rust reports the "
         "first engine's, client.rs:495); a silent pick hides a misconfigured engine",
)
BLOCK_SIZE_VALUES = recommendation(
    py(f"{CC}:882", "cache_config.block_size = response.block_size"),
    rs(f"{CL}:495", "Return the first engine's ready response."),
    rs("rust/src/server/src/grpc/control.rs:214",
       "kv_block_size: ready.block_size.min(u64::from(u32::MAX)) as u32,"),
    note="corewire's advice: neither 0.33.0 frontend detects a block_size disagreement "
         "(python keeps the last registered engine's, core_client.py:882; rust the first "
         "engine's, client.rs:495), so neither refuses, let alone shows the values",
)


def _ready(rank: int, dp: int = 1, **fields: object) -> EngineScript:
    return EngineScript(ready=default_ready(rank, dp, **fields))


def _scripts(field: str, values: list[int], delays: list[float] | None = None
             ) -> list[EngineScript]:
    n = len(values)
    return [EngineScript(ready=default_ready(r, n, **{field: v}),
                         ready_delay=(delays[r] if delays else 0.0))
            for r, v in enumerate(values)]


@case("handshake.ready.max_model_len_min", Level.MUST,
      "max_model_len is the minimum over the engines' ready responses.",
      grounds=MAX_LEN_MIN, needs=[Capability.MAX_MODEL_LEN])
async def max_model_len_min(ctx: CaseContext) -> None:
    await ctx.start([_ready(0, 2, max_model_len=1000), _ready(1, 2, max_model_len=900)])
    cfg = await ctx.driver.observed_config()
    ctx.require(cfg.max_model_len == 900, expected="max_model_len 900 (min of 1000, 900)",
                observed=cfg.max_model_len)


@case("handshake.ready.num_gpu_blocks_sum", Level.MUST,
      "num_gpu_blocks is the sum over the engines' ready responses.",
      grounds=GPU_BLOCKS_SUM, needs=[Capability.NUM_GPU_BLOCKS])
async def num_gpu_blocks_sum(ctx: CaseContext) -> None:
    await ctx.start([_ready(0, 2, num_gpu_blocks=100), _ready(1, 2, num_gpu_blocks=250)])
    cfg = await ctx.driver.observed_config()
    ctx.require(cfg.num_gpu_blocks == 350, expected="num_gpu_blocks 350 (100 + 250)",
                observed=cfg.num_gpu_blocks)


# ------------------------------------------------------------------ 1..4 engines

MAX_LEN = {1: [700], 2: [600, 1000], 3: [1000, 500, 900], 4: [1000, 900, 800, 300]}
BLOCKS = {1: [123], 2: [100, 7], 3: [10, 200, 3000], 4: [1, 2, 3, 4000]}


@case("handshake.ready.max_model_len_min_{n}_engines", Level.MUST,
      "With {n} engine(s) reporting max_model_len {lens}, the frontend uses {least}.",
      grounds=MAX_LEN_MIN, needs=[Capability.MAX_MODEL_LEN],
      params=[{"n": n, "lens": lens, "least": min(lens)} for n, lens in MAX_LEN.items()])
async def max_len(ctx: CaseContext, n: int, lens: list[int]) -> None:
    # Registration in rank order (0.1 s apart, scaled), so which value arrives first and
    # last is fixed, not thread timing: a first-wins or last-wins frontend is caught
    # wherever the minimum is not first or last.
    await ctx.start(_scripts("max_model_len", lens, [r * ctx.t(0.1) for r in range(n)]))
    cfg = await ctx.driver.observed_config()
    ctx.require(cfg.max_model_len == min(lens),
                expected=f"max_model_len {min(lens)} (min of {lens})",
                observed=cfg.max_model_len)


@case("handshake.ready.num_gpu_blocks_sum_{n}_engines", Level.MUST,
      "With {n} engine(s) reporting num_gpu_blocks {blocks}, the frontend uses {total}.",
      grounds=GPU_BLOCKS_SUM, needs=[Capability.NUM_GPU_BLOCKS],
      params=[{"n": n, "blocks": blocks, "total": sum(blocks)}
              for n, blocks in BLOCKS.items()])
async def gpu_blocks(ctx: CaseContext, blocks: list[int]) -> None:
    await ctx.start(_scripts("num_gpu_blocks", blocks))
    cfg = await ctx.driver.observed_config()
    ctx.require(cfg.num_gpu_blocks == sum(blocks),
                expected=f"num_gpu_blocks {sum(blocks)} (sum of {blocks})",
                observed=cfg.num_gpu_blocks)


# ------------------------------------------------------------------ arrival order

# Ready frames arrive in this order: engine 2, 1, 0 (reversed); 1, 3, 0, 2 (INTERLEAVED).
REVERSED = [0.4, 0.2, 0.0]


@case("handshake.ready.reversed_order_max_model_len", Level.MUST,
      "Ready frames arriving in reversed rank order (2, 1, 0) with max_model_len "
      "[1000, 400, 900]: the frontend uses the minimum 400, neither the first nor the last "
      "frame's value.", grounds=MAX_LEN_MIN, needs=[Capability.MAX_MODEL_LEN])
async def reversed_max_len(ctx: CaseContext) -> None:
    await ctx.start(_scripts("max_model_len", [1000, 400, 900], REVERSED))
    cfg = await ctx.driver.observed_config()
    ctx.require(cfg.max_model_len == 400, expected="max_model_len 400",
                observed=cfg.max_model_len)


@case("handshake.ready.interleaved_order_max_model_len", Level.MUST,
      "Ready frames arriving interleaved (1, 3, 0, 2) with max_model_len [800, 1000, 900, "
      "500]: the frontend uses the minimum 500.", grounds=MAX_LEN_MIN,
      needs=[Capability.MAX_MODEL_LEN])
async def interleaved_max_len(ctx: CaseContext) -> None:
    await ctx.start(_scripts("max_model_len", [800, 1000, 900, 500], INTERLEAVED))
    cfg = await ctx.driver.observed_config()
    ctx.require(cfg.max_model_len == 500, expected="max_model_len 500",
                observed=cfg.max_model_len)


@case("handshake.ready.reversed_order_num_gpu_blocks", Level.MUST,
      "Ready frames arriving in reversed rank order with num_gpu_blocks [5, 100, 100]: the "
      "frontend uses the sum 205.", grounds=GPU_BLOCKS_SUM,
      needs=[Capability.NUM_GPU_BLOCKS])
async def reversed_gpu_blocks(ctx: CaseContext) -> None:
    await ctx.start(_scripts("num_gpu_blocks", [5, 100, 100], REVERSED))
    cfg = await ctx.driver.observed_config()
    ctx.require(cfg.num_gpu_blocks == 205, expected="num_gpu_blocks 205",
                observed=cfg.num_gpu_blocks)


# ------------------------------------------------------------------ block_size

@case("handshake.ready.block_size_single", Level.MUST,
      "block_size is taken from the engine's ready response, not the frontend's default.",
      grounds=BLOCK_SIZE, needs=[Capability.BLOCK_SIZE])
async def block_size_single(ctx: CaseContext) -> None:
    await ctx.start([_ready(0, block_size=1056)])
    cfg = await ctx.driver.observed_config()
    ctx.require(cfg.block_size == 1056, expected="block_size 1056 from the ready response",
                observed=cfg.block_size)


@case("handshake.ready.block_size_dp_equal", Level.MUST,
      "With DP engines reporting the same block_size, the frontend uses that value.",
      grounds=BLOCK_SIZE, needs=[Capability.BLOCK_SIZE])
async def block_size_dp_equal(ctx: CaseContext) -> None:
    await ctx.start([_ready(0, 2, block_size=32), _ready(1, 2, block_size=32)])
    cfg = await ctx.driver.observed_config()
    ctx.require(cfg.block_size == 32, expected="block_size 32", observed=cfg.block_size)


@case("handshake.ready.block_size_agree_{n}_engines", Level.MUST,
      "With {n} engines all reporting block_size 64, the frontend uses 64.",
      grounds=BLOCK_SIZE_AGREE, needs=[Capability.BLOCK_SIZE],
      params=[{"n": n} for n in (3, 4)])
async def block_size_agree(ctx: CaseContext, n: int) -> None:
    await ctx.start(_scripts("block_size", [64] * n))
    cfg = await ctx.driver.observed_config()
    ctx.require(cfg.block_size == 64, expected="block_size 64", observed=cfg.block_size)


@case("handshake.ready.block_size_dp_disagree", Level.SHOULD,
      "DP engines that report different block_size values should be detected (refusing "
      "to start), not silently resolved.", grounds=BLOCK_SIZE_DISAGREE,
      needs=[Capability.BLOCK_SIZE])
async def block_size_dp_disagree(ctx: CaseContext) -> None:
    try:
        await ctx.start([_ready(0, 2, block_size=16), _ready(1, 2, block_size=32)])
    except StartupError as exc:
        ctx.note(f"frontend refused to start: {exc}")
        return
    cfg = await ctx.driver.observed_config()
    ctx.fail(expected="startup refused because engines disagree on block_size",
             observed=f"frontend started with block_size={cfg.block_size}")


def _disagreement(sizes: tuple[int, ...]) -> dict[str, object]:
    """A params entry: the sizes, the one value only one engine reports and another."""
    odd = next(v for v in sizes if sizes.count(v) == 1)
    return {"sizes": sizes, "listed": list(sizes), "n": len(sizes), "odd": odd,
            "other": next(v for v in sizes if v != odd),
            "name": "_".join(str(s) for s in sizes)}


@case("handshake.more_edges.block_size_disagreement_shows_values_{name}", Level.SHOULD,
      "When {n} engines report block_size {listed}, the refusal to start should show the "
      "disagreeing values ({odd} and {other}), so the operator can see which engine is "
      "misconfigured.", grounds=BLOCK_SIZE_VALUES, timeout=20,
      params=[_disagreement(sizes) for sizes in ((16, 32), (32, 32, 64), (64, 16, 16))])
async def block_size_disagreement(ctx: CaseContext, sizes: tuple[int, ...]) -> None:
    n = len(sizes)
    text = await startup_refused(ctx, [EngineScript(ready=default_ready(r, n, block_size=s))
                                       for r, s in enumerate(sizes)])
    missing = [v for v in set(sizes) if not re.search(rf"\b{v}\b", text)]
    ctx.require(not missing, expected=f"a refusal showing block sizes {sorted(set(sizes))}",
                observed=text)
