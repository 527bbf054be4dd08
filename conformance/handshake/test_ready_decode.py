"""Decoding the ready frame: an unusable one is refused promptly, and says who sent it.

The ready frame is decoded strictly into EngineCoreReadyResponse (python
`core_client.py:856`, rust `transport.rs:543`): a required key missing, a value of the wrong
type or a payload that is not msgpack is rejected at startup, promptly instead of hanging;
unknown extra keys are ignored, since newer engines add fields. Refusing is not enough when
a deployment has many engines: the operator needs the engine. Both 0.33.0 frontends know
the sender of a ready frame, but their refusal is a bare msgspec / decode error (python
`_apply_ready_response`, core_client.py:856). Dimensions of the naming cases: the engine
count (2, 3), which engine misbehaves (first, middle, last), and the kind of bad ready
response (not msgpack, a wrong field type, a missing required key).
"""

from __future__ import annotations

from collections.abc import Callable

from conformance.handshake.helpers import (
    CC,
    CORE,
    HS,
    RDY,
    TR,
    raw_ready,
    refused_promptly,
    startup_refused,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineScript,
    Grounds,
    Level,
    StartupError,
    both,
    case,
    differ,
    engine,
    names_engine,
    prompt,
    py,
    recommendation,
    rs,
)

# The ready frame is decoded strictly into EngineCoreReadyResponse (a decode error fails
# startup); the engine always sends the full struct.
READY_DECODE = both(
    py(f"{CC}:856", "msgspec.msgpack.decode(payload, type=EngineCoreReadyResponse)"),
    rs(f"{TR}:543",
       "let ready_response: EngineCoreReadyResponse = decode_msgpack(&frames[1])?;"),
    engine(f"{CORE}:1974", "ready_payload = msgspec.msgpack.encode(ready_response)"),
)


def _required(py_line: int, py_text: str, rs_line: int, rs_text: str) -> Grounds:
    """A key both 0.33.0 decoders require: the ready struct's field in each."""
    return both(
        py(f"{CC}:856", "msgspec.msgpack.decode(payload, type=EngineCoreReadyResponse)"),
        py(f"{RDY}:{py_line}", py_text),
        rs(f"{TR}:543",
           "let ready_response: EngineCoreReadyResponse = decode_msgpack(&frames[1])?;"),
        rs(f"{HS}:{rs_line}", rs_text))


READY_BLOCK_SIZE_FIELD = _required(83, "block_size: int", 57, "pub block_size: u64,")
READY_MAX_LEN_FIELD = _required(81, "max_model_len: int", 53, "pub max_model_len: u64,")
UNKNOWN_KEYS = both(
    py(f"{CC}:856", "msgspec.msgpack.decode(payload, type=EngineCoreReadyResponse)"),
    rs(f"{HS}:50", "pub struct EngineCoreReadyResponse {"),
    engine(f"{CORE}:1890", "mamba_block_size=self.vllm_config.cache_config.mamba_block_size,"),
    engine(f"{CORE}:1929", "coordinator_input_address=self.addresses.coordinator_input,"),
    note="load-bearing: the 0.33.0 engine sends mamba_block_size, coord_store_port and the "
         "coordinator addresses, which rust's struct does not declare (handshake.rs:50-110)",
)
EMPTY_PAYLOAD = differ(
    py(f"{CC}:857", "if payload"),
    py(f"{CC}:867", "if response is None:"),
    rs(f"{TR}:537", "if frames[1].is_empty() {"),
    engine(f"{CORE}:1974", "ready_payload = msgspec.msgpack.encode(ready_response)"),
    note="python treats an empty ready payload as 'no config to sync' (core_client.py:857, "
         ":867); rust refuses it (transport.rs:537-540); a 0.33.0 engine never sends one",
)
INVALID_READY_NOT_MSGPACK_NAMED = recommendation(
    py(f"{CC}:856", "msgspec.msgpack.decode(payload, type=EngineCoreReadyResponse)"),
    rs(f"{TR}:543",
       "let ready_response: EngineCoreReadyResponse = decode_msgpack(&frames[1])?;"),
    note="corewire's advice: both 0.33.0 frontends know the sender (python core_client.py:773, "
         "rust transport.rs:530) but fail with the bare decode error (msgspec DecodeError; "
         "rust Error::Decode), which names no engine",
)
INVALID_READY_FIELD_NAMED = differ(
    py(f"{CC}:856", "msgspec.msgpack.decode(payload, type=EngineCoreReadyResponse)"),
    rs(f"{TR}:543",
       "let ready_response: EngineCoreReadyResponse = decode_msgpack(&frames[1])?;"),
    rs("rust/src/engine-core-client/src/protocol/mod.rs:71",
       'format!("{error}; value fallback: {}", decode_value_preview(bytes))'),
    note="python fails with msgspec's ValidationError, naming the field but no engine "
         "(core_client.py:856); rust's decode error quotes the whole payload (protocol/"
         "mod.rs:71), whose data_parallel_rank names the engine (incidentally)",
)


def _raw_ready(rank: int, drop: str | None = None, **extra: object) -> EngineScript:
    return EngineScript(ready_payload=raw_ready(rank, 1, drop, **extra))


# ------------------------------------------------------------------ required keys

@case("handshake.ready.missing_block_size", Level.MUST,
      "A ready response without the required block_size key is rejected at startup with "
      "a clear error, promptly (no hang).", grounds=READY_BLOCK_SIZE_FIELD)
async def missing_block_size(ctx: CaseContext) -> None:
    await refused_promptly(ctx, [_raw_ready(0, drop="block_size")], within=4)


@case("handshake.ready.missing_max_model_len", Level.MUST,
      "A ready response without the required max_model_len key is rejected at startup, "
      "promptly.", grounds=READY_MAX_LEN_FIELD)
async def missing_max_model_len(ctx: CaseContext) -> None:
    await refused_promptly(ctx, [_raw_ready(0, drop="max_model_len")], within=4)


# More keys both 0.33.0 decoders require (a msgspec field without default; a serde field
# that is no Option): a port that fills in a default for a missing one starts on a ready
# response no vLLM frontend accepts. num_gpu_blocks is capacity, the others identity.
@case("handshake.ready.missing_{key}", Level.MUST,
      "A ready response without the required {key} key is rejected at startup, promptly "
      "(both 0.33.0 decoders require it; no default is filled in).",
      params=[{"key": "num_gpu_blocks",
               "grounds": _required(82, "num_gpu_blocks: int", 55, "pub num_gpu_blocks: u64,")},
              {"key": "dtype", "grounds": _required(85, "dtype: str", 61,
                                                    "pub dtype: ModelDtype,")},
              {"key": "max_num_seqs",
               "grounds": _required(93, "max_num_seqs: int", 82, "pub max_num_seqs: u64,")},
              {"key": "instance_id",
               "grounds": _required(95, "instance_id: str", 86, "pub instance_id: String,")}])
async def missing_required_key(ctx: CaseContext, key: str) -> None:
    await refused_promptly(ctx, [_raw_ready(0, drop=key)], within=4)


# ------------------------------------------------------------------ undecodable or extended

@case("handshake.ready.garbage_payload", Level.MUST,
      "A ready frame that is not msgpack is rejected at startup, promptly.",
      grounds=READY_DECODE)
async def garbage_ready(ctx: CaseContext) -> None:
    await refused_promptly(ctx, [EngineScript(ready_payload=b"\xc1\xc1garbage")], within=4)


@case("handshake.ready.wrong_field_type", Level.MUST,
      "A ready response whose block_size is a string is rejected at startup, promptly.",
      grounds=READY_BLOCK_SIZE_FIELD)
async def wrong_type_ready(ctx: CaseContext) -> None:
    await refused_promptly(ctx, [_raw_ready(0, block_size="16")], within=4)


@case("handshake.ready.unknown_keys_ignored", Level.MUST,
      "Unknown extra keys in a ready response are ignored (newer engines add fields).",
      grounds=UNKNOWN_KEYS, needs=[Capability.GENERATE])
async def unknown_keys(ctx: CaseContext) -> None:
    await ctx.start([_raw_ready(0, some_future_field={"x": 1}, another=[1, 2])])
    handle = await ctx.driver.generate(prompt(0), 2)
    await handle.wait(ctx.t(3))
    ctx.require(handle.finish_reason == "length", expected="the frontend serves normally",
                observed=f"{handle.finish_reason} error={handle.error}")


@case("handshake.ready.empty_payload", Level.INFO,
      "Records whether the frontend accepts an empty ready payload (vLLM's Python client "
      "treats it as 'no config to sync').", grounds=EMPTY_PAYLOAD)
async def empty_payload(ctx: CaseContext) -> None:
    try:
        await ctx.start([EngineScript(ready_payload=b"")], startup_timeout=4)
        ctx.note("frontend started with an empty ready payload")
    except StartupError as exc:
        ctx.note(f"frontend refused an empty ready payload: {exc}")


# ------------------------------------------------------------------ which engine sent it

BAD_READY: dict[str, tuple[str, Callable[[int, int], bytes]]] = {
    "not_msgpack": ("a ready frame that is not msgpack", lambda r, n: b"\xc1\xc1garbage"),
    "wrong_type": ("a ready response whose block_size is a string",
                   lambda r, n: raw_ready(r, n, block_size="16")),
    "missing_key": ("a ready response without max_model_len",
                    lambda r, n: raw_ready(r, n, drop="max_model_len")),
}


@case("handshake.more_edges.invalid_ready_named_{kind}_{bad}_of_{n}", Level.SHOULD,
      "With {n} engines, when engine {bad} sends {what}, the refusal to start should name "
      "engine {bad}, and no other engine.", timeout=20,
      params=[{"kind": kind, "what": what, "n": n, "bad": bad,
               "grounds": (INVALID_READY_NOT_MSGPACK_NAMED if kind == "not_msgpack"
                           else INVALID_READY_FIELD_NAMED)}
              for kind, (what, _payload) in BAD_READY.items()
              for n, bad in ((2, 1), (3, 1), (3, 0))])
async def invalid_ready(ctx: CaseContext, kind: str, n: int, bad: int) -> None:
    scripts = [EngineScript() for _ in range(n)]
    scripts[bad] = EngineScript(ready_payload=BAD_READY[kind][1](bad, n))
    text = await startup_refused(ctx, scripts)
    others = [r for r in range(n) if r != bad and names_engine(text, r)]
    ctx.require(names_engine(text, bad) and not others,
                expected=f"a refusal naming engine {bad} only", observed=text)
