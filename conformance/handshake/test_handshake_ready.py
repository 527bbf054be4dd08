"""Ready-response sync at its boundaries (1..4 engines, ready frames in reversed and
interleaved order) and engine identities (nonzero start index, unexpected or duplicate ids).

Python `_apply_ready_response` (`core_client.py:851-883`): max_model_len = min, num_gpu_blocks
= sum, block_size = the engines' value; engines are matched by ZMQ identity
(`identities.remove(identity)`, `:757-775`, a bare KeyError for an unknown one). Rust
(transport.rs `connect_bootstrapped`, tests/client.rs bootstrapped_*): identities
`engine_start_index .. +engine_count`, "received input registration for unexpected engine id"
otherwise.
"""

from __future__ import annotations

import re
import time

from conformance.handshake.test_handshake import GPU_BLOCKS_SUM, MAX_LEN_MIN
from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, engine, py, rs
from harness.cases.helpers import hold, prompt, request_for
from harness.frontends.api import Capability, StartupError
from harness.results.records import Level
from mock_engines.script import EngineScript, any_request, default_ready

CC = "vllm/v1/engine/core_client.py"
CL = "rust/src/engine-core-client/src/client.rs"
TR = "rust/src/engine-core-client/src/transport.rs"
CORE = "vllm/v1/engine/core.py"
TESTS = "rust/src/engine-core-client/src/tests/client.rs"

# Min / sum / agreed value over every engine's ready response, whatever the arrival order.
BLOCK_SIZE = both(
    py(f"{CC}:882", "cache_config.block_size = response.block_size"),
    rs("rust/src/server/src/grpc/control.rs:214",
       "kv_block_size: ready.block_size.min(u64::from(u32::MAX)) as u32,"),
    engine(f"{CORE}:1889", "block_size=self.vllm_config.cache_config.block_size,"),
)
# Registrations are matched by identity, in any order; a pinned rank reaches its engine.
ANY_ORDER = both(
    py(f"{CC}:774", "identities.remove(identity)"),
    py(f"{CC}:1808", "chosen_engine = self.core_engines[eng_index]"),
    rs(f"{TR}:512", "let mut pending = expected_engines.iter().cloned().collect::<BTreeSet<_>>();"),
    rs(f"{TR}:555", ".remove(&engine_id)"),
    rs("rust/src/engine-core-client/src/client/state.rs:203",
       "let engine_id = u16::try_from(rank).ok().map(EngineId::from_engine_index);"),
)
START_INDEX = both(
    py(f"{CC}:746", "[dp_rank] if offline_mode else list(range(dp_rank, dp_rank + num_ranks))"),
    py(f"{CC}:753", 'rank.to_bytes(2, "little") for rank in self.engine_ranks_managed'),
    rs(f"{TR}:374", "EngineId::from_engine_index(engine_start_index + offset)"),
    rs(f"{TESTS}:3182", "async fn bootstrapped_connects_with_nonzero_engine_start_index() {"),
    engine(f"{CORE}:1191", 'identity = self.engine_index.to_bytes(length=2, byteorder="little")'),
)
UNEXPECTED_ID = both(
    py(f"{CC}:774", "identities.remove(identity)"),
    rs(f"{TR}:531", "if !pending.remove(&actual_id) {"),
    rs(f"{TR}:533", "received input registration for unexpected engine id {actual_id:?}"),
    rs(f"{TESTS}:3219", "async fn bootstrapped_rejects_unexpected_engine_id_for_start_index() {"),
)
UNEXPECTED_ID_FOR_START = both(
    py(f"{CC}:746", "[dp_rank] if offline_mode else list(range(dp_rank, dp_rank + num_ranks))"),
    py(f"{CC}:774", "identities.remove(identity)"),
    rs(f"{TR}:374", "EngineId::from_engine_index(engine_start_index + offset)"),
    rs(f"{TR}:531", "if !pending.remove(&actual_id) {"),
    rs(f"{TESTS}:3219", "async fn bootstrapped_rejects_unexpected_engine_id_for_start_index() {"),
)
UNEXPECTED_ID_NAMED = both(
    py(f"{CC}:774", "identities.remove(identity)"),
    rs(f"{TR}:533", "received input registration for unexpected engine id {actual_id:?}"),
    note="python's refusal is the KeyError of the identity bytes (b'\\x05\\x00'); rust "
         "prints EngineId(0500)",
)
DUPLICATE_ID = both(
    py(f"{CC}:761", "if not sync_input_socket.poll("),
    py(f"{CC}:774", "identities.remove(identity)"),
    rs(f"{TR}:516", "let registration = timeout(ready_timeout, input_socket.recv())"),
    rs(f"{TR}:531", "if !pending.remove(&actual_id) {"),
    note="engine 1 never registers under its own identity: a second frame from identity 0 "
         "fails the set removal, and otherwise the per-receive bound expires",
)


def _scripts(field: str, values: list[int], delays: list[float] | None = None
             ) -> list[EngineScript]:
    n = len(values)
    return [EngineScript(ready=default_ready(r, n, **{field: v}),
                         ready_delay=(delays[r] if delays else 0.0))
            for r, v in enumerate(values)]


MAX_LEN = {1: [700], 2: [600, 1000], 3: [1000, 500, 900], 4: [1000, 900, 800, 300]}
BLOCKS = {1: [123], 2: [100, 7], 3: [10, 200, 3000], 4: [1, 2, 3, 4000]}

for _n in (1, 2, 3, 4):
    def _make_counts(n: int = _n) -> None:
        lens, blocks = MAX_LEN[n], BLOCKS[n]

        @case(f"handshake.ready.max_model_len_min_{n}_engines", Level.MUST,
              f"With {n} engine(s) reporting max_model_len {lens}, the frontend uses "
              f"{min(lens)}.", grounds=MAX_LEN_MIN, needs=[Capability.MAX_MODEL_LEN])
        async def max_len(ctx: CaseContext) -> None:
            # Registration in rank order (0.1 s apart, scaled), so which value arrives first
            # and last is fixed, not thread timing: a first-wins or last-wins frontend is
            # caught wherever the minimum is not first or last.
            await ctx.start(_scripts("max_model_len", lens,
                                     [r * ctx.t(0.1) for r in range(n)]))
            cfg = await ctx.driver.observed_config()
            ctx.require(cfg.max_model_len == min(lens),
                        expected=f"max_model_len {min(lens)} (min of {lens})",
                        observed=cfg.max_model_len)

        @case(f"handshake.ready.num_gpu_blocks_sum_{n}_engines", Level.MUST,
              f"With {n} engine(s) reporting num_gpu_blocks {blocks}, the frontend uses "
              f"{sum(blocks)}.", grounds=GPU_BLOCKS_SUM, needs=[Capability.NUM_GPU_BLOCKS])
        async def gpu_blocks(ctx: CaseContext) -> None:
            await ctx.start(_scripts("num_gpu_blocks", blocks))
            cfg = await ctx.driver.observed_config()
            ctx.require(cfg.num_gpu_blocks == sum(blocks),
                        expected=f"num_gpu_blocks {sum(blocks)} (sum of {blocks})",
                        observed=cfg.num_gpu_blocks)

        globals()[f"max_len_{n}"] = max_len
        globals()[f"gpu_blocks_{n}"] = gpu_blocks
    _make_counts()


for _n in (3, 4):
    def _make_block_size(n: int = _n) -> None:
        @case(f"handshake.ready.block_size_agree_{n}_engines", Level.MUST,
              f"With {n} engines all reporting block_size 64, the frontend uses 64.",
              grounds=BLOCK_SIZE, needs=[Capability.BLOCK_SIZE])
        async def block_size_agree(ctx: CaseContext) -> None:
            await ctx.start(_scripts("block_size", [64] * n))
            cfg = await ctx.driver.observed_config()
            ctx.require(cfg.block_size == 64, expected="block_size 64",
                        observed=cfg.block_size)

        globals()[f"block_size_agree_{n}"] = block_size_agree
    _make_block_size()


# Ready frames arrive in this order: engine 2, 1, 0 (reversed); 1, 3, 0, 2 (interleaved).
REVERSED = [0.4, 0.2, 0.0]
INTERLEAVED = [0.3, 0.0, 0.45, 0.15]


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


@case("handshake.register.interleaved_order_serves_every_rank", Level.MUST,
      "Engines that register interleaved (1, 3, 0, 2) are each reached by the requests "
      "pinned to their rank.", grounds=ANY_ORDER,
      needs=[Capability.GENERATE, Capability.DP_RANK])
async def interleaved_serves(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(ready_delay=d) for d in INTERLEAVED])
    for rank in (3, 2, 1, 0):
        p = prompt(60 + rank)
        handle = await ctx.driver.generate(p, 2, data_parallel_rank=rank)
        await handle.wait(ctx.t(3))
        found = request_for(group, p)
        ctx.require(found is not None and found[0] == rank and
                    handle.finish_reason == "length",
                    expected=f"request pinned to {rank} served by engine {rank}",
                    observed=f"engine {found[0] if found else None}, "
                             f"{handle.finish_reason} error={handle.error}")


# ------------------------------------------------------------------ engine identities


for _offset, _count in ((3, 1), (2, 2)):
    def _make_start_index(offset: int = _offset, count: int = _count) -> None:
        ranks = list(range(offset, offset + count))

        @case(f"handshake.engine_index.start_{offset}_count_{count}", Level.MUST,
              f"A frontend owning engines {ranks} (engine start index {offset}) accepts "
              "their registrations and serves on every one of them.", grounds=START_INDEX,
              needs=[Capability.GENERATE])
        async def nonzero_start(ctx: CaseContext) -> None:
            group = await ctx.start([EngineScript(rules=[any_request(hold())])
                                     for _ in ranks], rank_offset=offset)
            prompts = [prompt(80 + i) for i in range(count)]
            handles = [await ctx.driver.generate(p, 50) for p in prompts]
            for h in handles:
                await h.wait_first(ctx.t(3))
            owners = sorted(f[0] for f in (request_for(group, p) for p in prompts) if f)
            ctx.require(owners == ranks, expected=f"one request at each engine {ranks}",
                        observed=f"requests at engines {owners}")

        globals()[f"nonzero_start_{offset}_{count}"] = nonzero_start
    _make_start_index()


async def _refused(ctx: CaseContext, scripts: list[EngineScript], within: float,
                   offset: int = 0) -> str:
    began = time.monotonic()
    try:
        await ctx.start(scripts, startup_timeout=within * 3, rank_offset=offset)
    except StartupError as exc:
        elapsed = time.monotonic() - began
        ctx.require(elapsed <= ctx.t(within), expected=f"startup refused within {within}s",
                    observed=f"refused after {elapsed:.2f}s: {exc}")
        return str(exc)
    ctx.require(False, expected="the frontend refuses to start",
                observed="it started and serves")
    return ""


@case("handshake.engine_index.unexpected_id_refused", Level.MUST,
      "With engines 0 and 1 expected, a ready frame from identity 5 (engine 1 misconfigured) "
      "makes startup fail promptly instead of serving or hanging.",
      grounds=UNEXPECTED_ID)
async def unexpected_id(ctx: CaseContext) -> None:
    await _refused(ctx, [EngineScript(), EngineScript(register_as=5)], within=4)


@case("handshake.engine_index.unexpected_id_for_start_index", Level.MUST,
      "A frontend owning engine 3 (start index 3) refuses a registration from identity 0.",
      grounds=UNEXPECTED_ID_FOR_START, needs=[])
async def unexpected_id_for_start(ctx: CaseContext) -> None:
    await _refused(ctx, [EngineScript(register_as=0)], within=4, offset=3)


@case("handshake.engine_index.unexpected_id_named", Level.MUST,
      "The startup error for an unexpected engine identity names the identity (5 or its "
      "bytes 0500).", grounds=UNEXPECTED_ID_NAMED)
async def unexpected_id_named(ctx: CaseContext) -> None:
    text = await _refused(ctx, [EngineScript(), EngineScript(register_as=5)], within=4)
    ctx.require(bool(re.search(r"\b5\b|0500|\\x05\\x00", text)),
                expected="an error naming identity 5", observed=text)


@case("handshake.engine_index.duplicate_id_refused", Level.MUST,
      "Two engines registering with the same identity (0) never make a serving frontend: "
      "startup fails within its bound, since engine 1 never registered.", grounds=DUPLICATE_ID,
      timeout=20)
async def duplicate_id(ctx: CaseContext) -> None:
    began = time.monotonic()
    try:
        await ctx.start([EngineScript(), EngineScript(register_as=0, ready_delay=0.1)],
                        startup_timeout=1.5)
    except StartupError as exc:
        ctx.note(f"startup error after {time.monotonic() - began:.2f}s: {exc}")
        return
    ctx.require(False, expected="startup error (engine 1 registered as engine 0)",
                observed="the frontend started")
