"""Registration and ready-response sync (seed PR #42967, vllm/v1/engine/core_client.py).

Every engine registers with one ready frame; the frontend derives max_model_len (min),
num_gpu_blocks (sum) and block_size (synced) from them, and rejects unusable frames
promptly instead of hanging.
"""

from __future__ import annotations

import re
import time

import msgspec

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, differ, engine, py, recommendation, rs
from harness.cases.helpers import prompt
from harness.frontends.api import Capability, StartupError
from harness.results.records import Level
from mock_engines.script import EngineScript, default_ready

CC = "vllm/v1/engine/core_client.py"
RDY = "vllm/v1/engine/__init__.py"
CORE = "vllm/v1/engine/core.py"
TR = "rust/src/engine-core-client/src/transport.rs"
HS = "rust/src/engine-core-client/src/protocol/handshake.rs"
CL = "rust/src/engine-core-client/src/client.rs"
TESTS = "rust/src/engine-core-client/src/tests/client.rs"

# The ready wait ends only when every expected identity registered, and a pinned request
# reaches the engine of that rank.
REGISTER_ALL = both(
    py(f"{CC}:760", "while identities:"),
    py(f"{CC}:774", "identities.remove(identity)"),
    py(f"{CC}:1808", "chosen_engine = self.core_engines[eng_index]"),
    rs(f"{TR}:515", "while !pending.is_empty() {"),
    rs(f"{TR}:531", "if !pending.remove(&actual_id) {"),
    rs("rust/src/engine-core-client/src/client/state.rs:203",
       "let engine_id = u16::try_from(rank).ok().map(EngineId::from_engine_index);"),
    engine(f"{CORE}:1979", "input_socket.send(ready_payload)"),
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
BLOCK_SIZE_DISAGREE = recommendation(
    py(f"{CC}:882", "cache_config.block_size = response.block_size"),
    rs(f"{CL}:495", "Return the first engine's ready response."),
    rs("rust/src/server/src/grpc/control.rs:214",
       "kv_block_size: ready.block_size.min(u64::from(u32::MAX)) as u32,"),
    note="corewire's advice: neither 0.33.0 frontend compares block_size across engines "
         "(python keeps the last registered engine's, core_client.py:882; rust reports the "
         "first engine's, client.rs:495); a silent pick hides a misconfigured engine",
)
# The ready frame is decoded strictly into EngineCoreReadyResponse (a decode error fails
# startup); the engine always sends the full struct.
READY_DECODE = both(
    py(f"{CC}:856", "msgspec.msgpack.decode(payload, type=EngineCoreReadyResponse)"),
    rs(f"{TR}:543",
       "let ready_response: EngineCoreReadyResponse = decode_msgpack(&frames[1])?;"),
    engine(f"{CORE}:1974", "ready_payload = msgspec.msgpack.encode(ready_response)"),
)
READY_BLOCK_SIZE_FIELD = both(
    py(f"{CC}:856", "msgspec.msgpack.decode(payload, type=EngineCoreReadyResponse)"),
    py(f"{RDY}:83", "block_size: int"),
    rs(f"{TR}:543",
       "let ready_response: EngineCoreReadyResponse = decode_msgpack(&frames[1])?;"),
    rs(f"{HS}:57", "pub block_size: u64,"),
)
READY_MAX_LEN_FIELD = both(
    py(f"{CC}:856", "msgspec.msgpack.decode(payload, type=EngineCoreReadyResponse)"),
    py(f"{RDY}:81", "max_model_len: int"),
    rs(f"{TR}:543",
       "let ready_response: EngineCoreReadyResponse = decode_msgpack(&frames[1])?;"),
    rs(f"{HS}:53", "pub max_model_len: u64,"),
)
UNKNOWN_KEYS = both(
    py(f"{CC}:856", "msgspec.msgpack.decode(payload, type=EngineCoreReadyResponse)"),
    rs(f"{HS}:50", "pub struct EngineCoreReadyResponse {"),
    engine(f"{CORE}:1890", "mamba_block_size=self.vllm_config.cache_config.mamba_block_size,"),
    engine(f"{CORE}:1929", "coordinator_input_address=self.addresses.coordinator_input,"),
    note="load-bearing: the 0.33.0 engine sends mamba_block_size, coord_store_port and the "
         "coordinator addresses, which rust's struct does not declare (handshake.rs:50-110)",
)
NEVER_REGISTERS = both(
    py(f"{CC}:761", "if not sync_input_socket.poll("),
    py(f"{CC}:764", "raise TimeoutError("),
    rs(f"{TR}:516", "let registration = timeout(ready_timeout, input_socket.recv())"),
    rs(f"{TR}:517", "Error::InputRegistrationTimeout {"),
    rs(f"{TESTS}:3266", "async fn bootstrapped_connect_times_out_without_registration() {"),
)
NEVER_REGISTERS_NAMED = recommendation(
    py(f"{CC}:765", "Timed out waiting for engine core processes to"),
    rs("rust/src/engine-core-client/src/error.rs:46",
       "engine input registration timed out after {timeout:?}"),
    note="corewire's advice: neither 0.33.0 frontend names the engine that never registered "
         "(python: 'Timed out waiting for engine core processes to start', rust: 'engine "
         "input registration timed out'), though both know the pending identities",
)
EMPTY_PAYLOAD = differ(
    py(f"{CC}:857", "if payload"),
    py(f"{CC}:867", "if response is None:"),
    rs(f"{TR}:537", "if frames[1].is_empty() {"),
    engine(f"{CORE}:1974", "ready_payload = msgspec.msgpack.encode(ready_response)"),
    note="python treats an empty ready payload as 'no config to sync' (core_client.py:857, "
         ":867); rust refuses it (transport.rs:537-540); a 0.33.0 engine never sends one",
)


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
      "reaches each of them.", grounds=REGISTER_ALL,
      needs=[Capability.GENERATE, Capability.DP_RANK])
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
    ctx.require(False, expected="startup refused because engines disagree on block_size",
                observed=f"frontend started with block_size={cfg.block_size}")


@case("handshake.ready.missing_block_size", Level.MUST,
      "A ready response without the required block_size key is rejected at startup with "
      "a clear error, promptly (no hang).", grounds=READY_BLOCK_SIZE_FIELD)
async def missing_block_size(ctx: CaseContext) -> None:
    await _expect_startup_failure(ctx, [_raw_ready(0, drop="block_size")], within=4)


@case("handshake.ready.missing_max_model_len", Level.MUST,
      "A ready response without the required max_model_len key is rejected at startup, "
      "promptly.", grounds=READY_MAX_LEN_FIELD)
async def missing_max_model_len(ctx: CaseContext) -> None:
    await _expect_startup_failure(ctx, [_raw_ready(0, drop="max_model_len")], within=4)


# More keys both 0.33.0 decoders require (a msgspec field without default; a serde field
# that is no Option): a port that fills in a default for a missing one starts on a ready
# response no vLLM frontend accepts. num_gpu_blocks is capacity, the others identity.
_REQUIRED_KEYS = (("num_gpu_blocks", 82, "num_gpu_blocks: int", 55, "pub num_gpu_blocks: u64,"),
                  ("dtype", 85, "dtype: str", 61, "pub dtype: ModelDtype,"),
                  ("max_num_seqs", 93, "max_num_seqs: int", 82, "pub max_num_seqs: u64,"),
                  ("instance_id", 95, "instance_id: str", 86, "pub instance_id: String,"))
def _make_missing(key: str, py_line: int, py_text: str, rs_line: int, rs_text: str) -> None:
    grounds = both(
        py(f"{CC}:856", "msgspec.msgpack.decode(payload, type=EngineCoreReadyResponse)"),
        py(f"{RDY}:{py_line}", py_text),
        rs(f"{TR}:543",
           "let ready_response: EngineCoreReadyResponse = decode_msgpack(&frames[1])?;"),
        rs(f"{HS}:{rs_line}", rs_text))

    @case(f"handshake.ready.missing_{key}", Level.MUST,
          f"A ready response without the required {key} key is rejected at startup, "
          "promptly (both 0.33.0 decoders require it; no default is filled in).",
          grounds=grounds)
    async def missing(ctx: CaseContext) -> None:
        await _expect_startup_failure(ctx, [_raw_ready(0, drop=key)], within=4)

    missing.__name__ = missing.__qualname__ = f"missing_{key}"
    globals()[missing.__name__] = missing


for _required in _REQUIRED_KEYS:
    _make_missing(*_required)


@case("handshake.ready.garbage_payload", Level.MUST,
      "A ready frame that is not msgpack is rejected at startup, promptly.",
      grounds=READY_DECODE)
async def garbage_ready(ctx: CaseContext) -> None:
    await _expect_startup_failure(ctx, [EngineScript(ready_payload=b"\xc1\xc1garbage")],
                                  within=4)


@case("handshake.ready.wrong_field_type", Level.MUST,
      "A ready response whose block_size is a string is rejected at startup, promptly.",
      grounds=READY_BLOCK_SIZE_FIELD)
async def wrong_type_ready(ctx: CaseContext) -> None:
    await _expect_startup_failure(ctx, [_raw_ready(0, block_size="16")], within=4)


@case("handshake.ready.unknown_keys_ignored", Level.MUST,
      "Unknown extra keys in a ready response are ignored (newer engines add fields).",
      grounds=UNKNOWN_KEYS, needs=[Capability.GENERATE])
async def unknown_keys(ctx: CaseContext) -> None:
    await ctx.start([_raw_ready(0, some_future_field={"x": 1}, another=[1, 2])])
    handle = await ctx.driver.generate(prompt(0), 2)
    await handle.wait(ctx.t(3))
    ctx.require(handle.finish_reason == "length", expected="the frontend serves normally",
                observed=f"{handle.finish_reason} error={handle.error}")


@case("handshake.register.never_registers", Level.MUST,
      "An engine that never registers makes startup fail with a bounded error.",
      grounds=NEVER_REGISTERS, timeout=20)
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


# "engine 1", "engines [1]", "rank=1", "DP rank 1", "EngineCore_DP1": a name, not a number
# near a word ("DP>1", "engine(s) ... 1.5s" are not names).
NAMES_ENGINE_1 = re.compile(
    r"(\b(engines?|ranks?|dp)\b[\s#:=\[(,'\"]*(rank[\s#:=]*)?|_DP)1\b(?!\.\d)", re.I)


@case("handshake.register.never_registers_named", Level.SHOULD,
      "The startup error for an engine that never registers should name that engine.",
      grounds=NEVER_REGISTERS_NAMED, timeout=20)
async def never_registers_named(ctx: CaseContext) -> None:
    try:
        await ctx.start([EngineScript(), EngineScript(register=False)], startup_timeout=1.5)
    except StartupError as exc:
        text = str(exc)
        ctx.note(f"startup error: {text}")
        named = NAMES_ENGINE_1.search(text) or "0100" in text
        ctx.require(bool(named), expected="an error naming engine 1", observed=text)
        return
    ctx.require(False, expected="startup error naming engine 1", observed="it started")


@case("handshake.ready.empty_payload", Level.INFO,
      "Records whether the frontend accepts an empty ready payload (vLLM's Python client "
      "treats it as 'no config to sync').", grounds=EMPTY_PAYLOAD)
async def empty_payload(ctx: CaseContext) -> None:
    try:
        await ctx.start([EngineScript(ready_payload=b"")], startup_timeout=4)
        ctx.note("frontend started with an empty ready payload")
    except StartupError as exc:
        ctx.note(f"frontend refused an empty ready payload: {exc}")
