"""Startup refusals that must say WHAT was wrong and WHO sent it: engines disagreeing on
block_size, an engine identity registering twice, an unusable ready response from one
engine among several.

Refusing is not enough when a deployment has many engines: the operator needs the
engine and the value. Python's `wait_for_engine_startup` names the engine index in its
handshake refusals (vllm/v1/engine/utils.py:1585-1589), but its ready-frame wait does not
(`identities.remove`, a bare KeyError; `_apply_ready_response`, a bare msgspec error:
core_client.py:774, :856); the Rust client names the engine id of an unexpected
registration (transport.rs:533). Dimensions:
the engine count (2, 3), which engine misbehaves (first, middle, last), and the kind of
bad ready response (not msgpack, a wrong field type, a missing required key).
"""

from __future__ import annotations

import asyncio
import re

import msgspec

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, differ, py, recommendation, rs
from harness.cases.helpers import hold, names_engine, prompt
from harness.frontends.api import Capability, FrontendError, StartupError, StartupHang
from harness.protocol.wire import messages as m
from harness.results.records import Level
from mock_engines.script import EngineScript, any_request, default_ready

CC = "vllm/v1/engine/core_client.py"
TR = "rust/src/engine-core-client/src/transport.rs"

BLOCK = recommendation(
    py(f"{CC}:882", "cache_config.block_size = response.block_size"),
    rs("rust/src/engine-core-client/src/client.rs:495",
       "Return the first engine's ready response."),
    rs("rust/src/server/src/grpc/control.rs:214",
       "kv_block_size: ready.block_size.min(u64::from(u32::MAX)) as u32,"),
    note="corewire's advice: neither 0.33.0 frontend detects a block_size disagreement "
         "(python keeps the last registered engine's, core_client.py:882; rust the first "
         "engine's, client.rs:495), so neither refuses, let alone shows the values",
)
DUPLICATE_REGISTRATION_NAMED = both(
    py(f"{CC}:774", "identities.remove(identity)"),
    rs(f"{TR}:531", "if !pending.remove(&actual_id) {"),
    rs(f"{TR}:533", "received input registration for unexpected engine id {actual_id:?}"),
    note="both name the identity, each in its own form: python's refusal is a KeyError of "
         "the identity bytes (core_client.py:774, e.g. b'\\x01\\x00'), rust's 'unexpected "
         "engine id EngineId(0100)' (transport.rs:531-533)",
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



async def _startup_error(ctx: CaseContext, scripts: list[EngineScript]) -> str:
    """Startup must be refused; the refusal's text."""
    try:
        await ctx.start(scripts, startup_timeout=4)
    except StartupError as exc:
        ctx.note(f"startup error: {exc}")
        return str(exc)
    except StartupHang as exc:
        ctx.require(False, expected="startup is refused within its bound", observed=str(exc))
    ctx.require(False, expected="startup is refused", observed="the frontend started")
    return ""


# ---------------------------------------------------------------- block_size disagreement

for _sizes in ((16, 32), (32, 32, 64), (64, 16, 16)):
    def _make_block(sizes: tuple[int, ...] = _sizes) -> None:
        n = len(sizes)
        odd = next(v for v in sizes if sizes.count(v) == 1)
        other = next(v for v in sizes if v != odd)
        name = "_".join(str(s) for s in sizes)

        @case(f"handshake.more_edges.block_size_disagreement_shows_values_{name}",
              Level.SHOULD,
              f"When {n} engines report block_size {list(sizes)}, the refusal to start "
              f"should show the disagreeing values ({odd} and {other}), "
              "so the operator can see which engine is misconfigured.",
              grounds=BLOCK, timeout=20)
        async def run(ctx: CaseContext) -> None:
            text = await _startup_error(ctx, [EngineScript(ready=default_ready(r, n,
                                                                                block_size=s))
                                              for r, s in enumerate(sizes)])
            missing = [v for v in set(sizes) if not re.search(rf"\b{v}\b", text)]
            ctx.require(not missing,
                        expected=f"a refusal showing block sizes {sorted(set(sizes))}",
                        observed=text)

        run.__name__ = run.__qualname__ = f"block_size_disagreement_{name}"
        globals()[run.__name__] = run
    _make_block()


# ---------------------------------------------------------------- one identity twice

for _n, _dup in ((2, 0), (3, 1), (3, 2)):
    def _make_duplicate(n: int = _n, dup: int = _dup) -> None:
        @case(f"handshake.more_edges.duplicate_registration_named_{dup}_of_{n}", Level.MUST,
              f"With {n} engines, when engine {dup} sends its ready frame twice (before "
              "every engine registered), the refusal to start names engine "
              f"{dup}, the identity that registered twice (Rust: 'received input "
              "registration for unexpected engine id').",
              grounds=DUPLICATE_REGISTRATION_NAMED, timeout=20)
        async def run(ctx: CaseContext) -> None:
            # The others register a second later, so the repeat is read while they are
            # still missing (a ROUTER fair-queues peers: read late, the repeat would come last).
            scripts = [EngineScript(ready_delay=ctx.t(1.0)) for _ in range(n)]
            scripts[dup] = EngineScript(ready_repeats=2)
            text = await _startup_error(ctx, scripts)
            ctx.require(names_engine(text, dup), expected=f"a refusal naming engine {dup}",
                        observed=text)

        run.__name__ = run.__qualname__ = f"duplicate_registration_{dup}_of_{n}"
        globals()[run.__name__] = run
    _make_duplicate()


# ---------------------------------------------------------------- one unusable ready response

def _raw_ready(rank: int, n: int, drop: str | None = None, **extra: object) -> bytes:
    fields = msgspec.structs.asdict(default_ready(rank, n))
    if drop is not None:
        del fields[drop]
    fields.update(extra)
    return msgspec.msgpack.encode(fields)


BAD_READY = {
    "not_msgpack": ("a ready frame that is not msgpack", lambda r, n: b"\xc1\xc1garbage"),
    "wrong_type": ("a ready response whose block_size is a string",
                   lambda r, n: _raw_ready(r, n, block_size="16")),
    "missing_key": ("a ready response without max_model_len",
                    lambda r, n: _raw_ready(r, n, drop="max_model_len")),
}

for _kind in BAD_READY:
    for _n, _bad in ((2, 1), (3, 1), (3, 0)):
        def _make_bad(kind: str = _kind, n: int = _n, bad: int = _bad) -> None:
            what, payload = BAD_READY[kind]

            @case(f"handshake.more_edges.invalid_ready_named_{kind}_{bad}_of_{n}",
                  Level.SHOULD,
                  f"With {n} engines, when engine {bad} sends {what}, the refusal to start "
                  f"should name engine {bad}, and no other engine.",
                  grounds=(INVALID_READY_NOT_MSGPACK_NAMED if kind == "not_msgpack"
                           else INVALID_READY_FIELD_NAMED), timeout=20)
            async def run(ctx: CaseContext) -> None:
                scripts = [EngineScript() for _ in range(n)]
                scripts[bad] = EngineScript(ready_payload=payload(bad, n))
                text = await _startup_error(ctx, scripts)
                others = [r for r in range(n) if r != bad and names_engine(text, r)]
                ctx.require(names_engine(text, bad) and not others,
                            expected=f"a refusal naming engine {bad} only", observed=text)

            run.__name__ = run.__qualname__ = f"invalid_ready_{kind}_{bad}_of_{n}"
            globals()[run.__name__] = run
        _make_bad()


# ---------------------------------------------------------------- a late engine is waited for

LATE = both(
    py(f"{CC}:761", "if not sync_input_socket.poll("),
    py(f"{CC}:762", "timeout=VLLM_ENGINE_READY_TIMEOUT_S * 1000"),
    py("vllm/v1/engine/utils.py:1440", "events = poller.poll(STARTUP_POLL_PERIOD_MS)"),
    rs(f"{TR}:516", "let registration = timeout(ready_timeout, input_socket.recv())"),
    rs(f"{TR}:196", "let message = timeout(ready_timeout, handshake_socket.recv())"),
    rs(f"{TR}:266", "let message = timeout(ready_timeout, handshake_socket.recv())"),
    note="both bound each receive, not the whole startup (python's handshake wait has no bound "
         "at all), so an engine arriving within the bound is always waited for",
)

for _mode in ("bootstrapped", "handshake"):
    def _make_late(mode: str = _mode) -> None:
        bound = 5.6
        delays = (4.7, 4.9)  # both inside the bound, the first less than a second before it

        @case(f"handshake.more_edges.late_registrations_served_{mode}", Level.MUST,
              f"With 2 engines ({mode} startup) and a {bound} s startup bound, engines "
              f"registering after {delays[0]} s and {delays[1]} s are both waited for: the "
              "frontend starts and serves a request pinned to each (it does not give up "
              "before its bound, whatever arrived in its last second).",
              grounds=LATE, needs=[Capability.GENERATE, Capability.DP_RANK], timeout=40)
        async def run(ctx: CaseContext) -> None:
            scripts = [EngineScript(ready_delay=ctx.t(d)) for d in delays]
            try:
                await ctx.start(scripts, startup_timeout=bound, handshake=mode == "handshake")
            except (StartupError, StartupHang) as exc:
                ctx.require(False, expected=f"startup waits up to {bound} s (scaled) for "
                                            f"engines registering at {list(delays)} s",
                            observed=f"{type(exc).__name__}: {exc}")
            for rank in (0, 1):
                handle = await ctx.driver.generate(prompt(920 + rank), 2,
                                                   data_parallel_rank=rank)
                await handle.wait(ctx.t(3))
                ctx.require(handle.finish_reason == "length",
                            expected=f"the request at engine {rank} is served",
                            observed=f"{handle.finish_reason} error={handle.error}")

        run.__name__ = run.__qualname__ = f"late_registrations_{mode}"
        globals()[run.__name__] = run
    _make_late()


# ---------------------------------------------------------------- misuse of the coordinator path

COORD = differ(
    py("vllm/v1/engine/coordinator.py:362", "assert not outputs.outputs"),
    py("vllm/v1/engine/coordinator.py:363", "assert outputs.utility_output is None"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:136",
       "received non-control output on coordinator path: {other:?}"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:199",
       "inner.close_registries(Arc::new(error));"),
    note="python's DP coordinator (its own process) dies on the assert while the AsyncLLM "
         "client serves on; rust's in-process coordinator fails and closes the client's "
         "registries (inproc.rs:134-137, :199), failing open streams and later calls",
)

MISUSE = {
    "request_outputs": lambda rank: m.EngineCoreOutputs(
        rank, [m.EngineCoreOutput("cw-misrouted", [100])]),
    "utility_reply": lambda rank: m.EngineCoreOutputs(
        rank, utility_output=m.UtilityOutput(4242, None, None)),
}

for _kind in MISUSE:
    def _make_misuse(kind: str = _kind) -> None:
        @case(f"handshake.more_edges.coordinator_path_{kind}_fails_closed", Level.SHOULD,
              f"With 2 engines and the frontend's own DP coordinator, engine 1 sending "
              f"{kind.replace('_', ' ')} on the coordinator path (a miswired engine) should "
              "fail the client closed: the open stream ends with an error and a later "
              "is_sleeping fails, each within 3 s, instead of serving on.",
              grounds=COORD, needs=[Capability.GENERATE, Capability.IS_SLEEPING], timeout=30)
        async def run(ctx: CaseContext) -> None:
            group = await ctx.start([EngineScript(rules=[any_request(hold())])
                                     for _ in range(2)], coordinated=True)
            handle = await ctx.driver.generate(prompt(930), 100)
            await handle.wait_first(ctx.t(3))
            group[1].send_coordinator(MISUSE[kind](1))
            ended = await ctx.wait_until(lambda: handle.ended, 3)
            ctx.require(ended and handle.finish_reason not in ("length", "stop", "abort"),
                        expected="the open stream ends with an error within 3 s",
                        observed=(f"ended {handle.finish_reason!r} ({handle.error})" if ended
                                  else f"still open with {handle.tokens}"))
            try:
                value = await asyncio.wait_for(ctx.driver.is_sleeping(), ctx.t(3))
            except FrontendError:
                return
            except asyncio.TimeoutError:
                ctx.require(False, expected="is_sleeping fails within 3 s",
                            observed="still pending after 3 s")
            ctx.require(False, expected="is_sleeping fails", observed=f"answered {value!r}")

        run.__name__ = run.__qualname__ = f"coordinator_path_{kind}"
        globals()[run.__name__] = run
    _make_misuse()
