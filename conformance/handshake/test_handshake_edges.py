"""HELLO / INIT / READY missteps a port lets through or reports vaguely: a duplicate HELLO,
a READY before HELLO, an undecodable handshake message, and which engine and stage a
startup timeout names.

vLLM 0.33.0 `wait_for_engine_startup` (v1/engine/utils.py:1484-1589): a message is decoded
per engine identity, HELLO is accepted only from an engine in state NEW and READY only from
one in state CONNECTED, anything else raises "Unexpected {status} message for ... engine
{eng_index} in {state} state" (:1585-1589). Rust HandshakeOwner (rust-client.md §2.2):
"Duplicate HELLO id -> error", per-stage `HandshakeTimeout{stage}`.
"""

from __future__ import annotations

import re
import time

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import both, differ, engine, py, recommendation, rs
from harness.cases.helpers import names_engine
from harness.frontends.api import StartupError, StartupHang
from harness.results.records import Level
from mock_engines.script import EngineScript

UT = "vllm/v1/engine/utils.py"
TR = "rust/src/engine-core-client/src/transport.rs"
CORE = "vllm/v1/engine/core.py"

# HELLO only from an engine in state NEW, READY only from one that got INIT; anything else
# fails startup with an error naming the engine (python 'engine {eng_index}', rust
# 'EngineId(<hex identity>)').
DUPLICATE_HELLO = both(
    py(f"{UT}:1517", 'if status == "HELLO" and engine.state == CoreEngineState.NEW:'),
    py(f"{UT}:1586", 'f"Unexpected {status} message for "'),
    py(f"{UT}:1588", 'f"{eng_index} in {engine.state} state."'),
    rs(f"{TR}:207", "duplicate engine id {engine_id:?} observed during startup handshake"),
    rs(f"{TR}:293", "received duplicate HELLO for engine id {engine_id:?} after INIT phase"),
    engine(f"{CORE}:1411", '"status": "HELLO",'),
)
READY_BEFORE_HELLO = both(
    py(f"{UT}:1552", 'elif status == "READY" and engine.state == CoreEngineState.CONNECTED:'),
    py(f"{UT}:1586", 'f"Unexpected {status} message for "'),
    rs(f"{TR}:230", "let state = match engines.get_mut(&engine_id) {"),
    rs(f"{TR}:234", "received READY for unexpected or duplicate engine id {engine_id:?}"),
    engine(f"{CORE}:1378", '"status": "READY",'),
)
# A second READY from one engine: Python takes READY only in state CONNECTED (the engine is
# in READY by then), Rust only for an engine whose INIT is still unanswered.
DUPLICATE_READY = both(
    py(f"{UT}:1552", 'elif status == "READY" and engine.state == CoreEngineState.CONNECTED:'),
    py(f"{UT}:1586", 'f"Unexpected {status} message for "'),
    py(f"{UT}:1588", 'f"{eng_index} in {engine.state} state."'),
    rs(f"{TR}:230", "let state = match engines.get_mut(&engine_id) {"),
    rs(f"{TR}:234", "received READY for unexpected or duplicate engine id {engine_id:?}"),
    engine(f"{CORE}:1378", '"status": "READY",'),
)
UNDECODABLE_HELLO = both(
    py(f"{UT}:1492", "msg = msgspec.msgpack.decode(ready_msg_bytes)"),
    rs(f"{TR}:467", "let handshake_message: ReadyMessage = decode_msgpack(&frames[1])?;"),
    rs(f"{TR}:202", "decode_handshake_message(message, None)?;"),
)
UNDECODABLE_HELLO_NAMED = recommendation(
    py(f"{UT}:1492", "msg = msgspec.msgpack.decode(ready_msg_bytes)"),
    rs(f"{TR}:467", "let handshake_message: ReadyMessage = decode_msgpack(&frames[1])?;"),
    note="corewire's advice: both 0.33.0 frontends know the sender's identity (python "
         "utils.py:1486, rust transport.rs:457) but fail with the bare msgpack decode error "
         "(msgspec DecodeError; rust Error::Decode), which names no engine",
)
UNEXPECTED_IDENTITY_NAMED = differ(
    py(f"{UT}:1487", "next((e for e in core_engines if e.identity == eng_identity), None)"),
    py(f"{UT}:1490", 'f"Message from engine with unexpected data parallel rank: {eng_index}"'),
    rs(f"{TR}:204", 'Some("HELLO") => {'),
    rs(f"{TR}:222", "engines.insert(engine_id.clone(), EngineStartupState::HelloReceived);"),
    note="python refuses an identity outside its engine list, naming its rank (utils.py:1490); "
         "rust's HandshakeOwner accepts any identity at HELLO (transport.rs:204-222), so there "
         "is no error to name it",
)
TIMEOUT_STAGE = recommendation(
    py(f"{UT}:1440", "events = poller.poll(STARTUP_POLL_PERIOD_MS)"),
    py(f"{UT}:1444", "Waiting for %d local, %d remote core engine proc(s) to connect."),
    rs(f"{TR}:198", 'stage: "HELLO",'),
    rs(f"{TR}:268", 'stage: "READY",'),
    rs("rust/src/engine-core-client/src/error.rs:41",
       "startup handshake timed out while waiting for {stage} after {timeout:?}"),
    note="corewire's advice: python's handshake wait has no bound (utils.py:1439-1452 polls "
         "for ever), so there is no error; rust's HandshakeTimeout names the stage (HELLO or "
         "READY, the ready frame folded into READY) but not the missing engine",
)



async def _refused(ctx: CaseContext, scripts: list[EngineScript], timeout: float,
                   within: float | None = None) -> str:
    """Startup must fail (within `within` scaled seconds when given); the error text."""
    began = time.monotonic()
    try:
        await ctx.start(scripts, handshake=True, startup_timeout=timeout)
    except StartupError as exc:
        failed = time.monotonic()
        # "Promptly" counts from the engines' last handshake message (the misstep or what
        # followed it), not from the call: building the frontend (AsyncLLM's config, a
        # binary's start) takes seconds of its own on a loaded machine.
        sent = [r.t for r in (ctx.group.transcript.snapshot() if ctx.group else [])
                if r.channel == "handshake" and r.direction == "out"]
        since = failed - max(sent) if sent else failed - began
        ctx.note(f"startup error after {failed - began:.2f}s, {since:.2f}s after the "
                 f"engines' last handshake message: {exc}")
        if within is not None:
            ctx.require(since <= ctx.t(within),
                        expected=f"startup fails within {within}s (scaled) of the engines' "
                                 "last handshake message",
                        observed=f"failed {since:.2f}s after it: {exc}")
        return str(exc)
    except StartupHang as exc:
        ctx.require(False, expected=f"startup fails within the {ctx.t(timeout):.1f}s bound",
                    observed=str(exc))
    ctx.require(False, expected="startup fails", observed="the frontend started and serves")
    return ""


# ---------------------------------------------------------------- out-of-order messages

def _misstep_scripts(n: int, bad: int, misstep: EngineScript) -> list[EngineScript]:
    return [misstep if rank == bad else EngineScript() for rank in range(n)]


for _n, _bad in ((1, 0), (2, 1), (3, 0)):
    def _make_order(n: int = _n, bad: int = _bad) -> None:
        @case(f"handshake.edges.duplicate_hello_refused_{n}_engines", Level.MUST,
              f"With {n} engine(s), engine {bad} sending HELLO twice makes startup fail "
              f"promptly with an error naming engine {bad} (a second HELLO is not answered "
              "with a second INIT).", grounds=DUPLICATE_HELLO, timeout=25)
        async def duplicate_hello(ctx: CaseContext) -> None:
            text = await _refused(ctx, _misstep_scripts(n, bad, EngineScript(hello_repeats=2)),
                                  6, within=3)
            ctx.require(names_engine(text, bad), expected=f"an error naming engine {bad}",
                        observed=text)

        @case(f"handshake.edges.ready_before_hello_refused_{n}_engines", Level.MUST,
              f"With {n} engine(s), engine {bad} sending READY before its HELLO makes "
              f"startup fail promptly with an error naming engine {bad}.",
              grounds=READY_BEFORE_HELLO,
              timeout=25)
        async def ready_first(ctx: CaseContext) -> None:
            text = await _refused(ctx, _misstep_scripts(
                n, bad, EngineScript(ready_before_hello=True)), 6, within=3)
            ctx.require(names_engine(text, bad), expected=f"an error naming engine {bad}",
                        observed=text)

        globals()[f"duplicate_hello_{n}"] = duplicate_hello
        globals()[f"ready_first_{n}"] = ready_first
    _make_order()


def _make_duplicate_ready(n: int, bad: int) -> None:
    @case(f"handshake.edges.duplicate_ready_refused_{n}_engines", Level.MUST,
          f"With {n} engine(s), engine {bad} sending its READY twice while the others' "
          f"are still to come makes startup fail promptly with an error naming engine "
          f"{bad} (a READY is taken once, from an engine that sent HELLO and got INIT).",
          grounds=DUPLICATE_READY, timeout=25)
    async def duplicate_ready(ctx: CaseContext) -> None:
        scripts = [EngineScript(handshake_ready_repeats=2) if rank == bad
                   else EngineScript(ready_delay=1.0) for rank in range(n)]
        text = await _refused(ctx, scripts, 6, within=3)
        ctx.require(names_engine(text, bad), expected=f"an error naming engine {bad}",
                    observed=text)

    globals()[f"duplicate_ready_{n}"] = duplicate_ready


for _n, _bad in ((2, 1), (3, 0)):  # one engine alone: its first READY ends the handshake
    _make_duplicate_ready(_n, _bad)


# ---------------------------------------------------------------- undecodable handshake

@case("handshake.edges.undecodable_hello_fails_fast", Level.MUST,
      "An engine (1 of 2) whose first handshake message is not msgpack makes startup fail "
      "promptly (well before the 6 s bound), not wait for a valid message.",
      grounds=UNDECODABLE_HELLO,
      timeout=25)
async def undecodable_hello(ctx: CaseContext) -> None:
    await _refused(ctx, _misstep_scripts(2, 1, EngineScript(hello_payload=b"\xc1\xc1")), 6,
                   within=3)


@case("handshake.edges.undecodable_hello_named", Level.SHOULD,
      "The startup error for an undecodable handshake message should name the engine (1) "
      "that sent it (Python re-raises msgspec's DecodeError, which names no engine).",
      grounds=UNDECODABLE_HELLO_NAMED, timeout=25)
async def undecodable_hello_named(ctx: CaseContext) -> None:
    text = await _refused(ctx, _misstep_scripts(2, 1, EngineScript(hello_payload=b"\xc1")),
                          6, within=3)
    ctx.require(names_engine(text, 1), expected="an error naming engine 1", observed=text)


@case("handshake.edges.unexpected_identity_named", Level.SHOULD,
      "The startup error for a HELLO from an unexpected identity (5, engines 0 and 1) "
      "should name that identity (Python: 'unexpected data parallel rank: 5').",
      grounds=UNEXPECTED_IDENTITY_NAMED, timeout=25)
async def unexpected_identity_named(ctx: CaseContext) -> None:
    text = await _refused(ctx, [EngineScript(), EngineScript(register_as=5)], 4)
    ctx.require(names_engine(text, 5), expected="an error naming identity/rank 5",
                observed=text)


# ---------------------------------------------------------------- which stage timed out

STAGES = {
    # stage -> (the misstep of engine 1, a pattern for the stage's name in the error)
    "hello": (EngineScript(hello_repeats=0, register=False, handshake_ready=False),
              r"\bhello\b"),
    "registration": (EngineScript(register=False, handshake_ready=False),
                     r"\bready[ _]?(response|frame|message)\b|\bregist"),
    "ready": (EngineScript(handshake_ready=False), r"\bready\b(?!\s*(response|frame))"),
}

for _stage, (_script, _pattern) in STAGES.items():
    def _make_stage(stage: str = _stage, script: EngineScript = _script,
                    pattern: str = _pattern) -> None:
        @case(f"handshake.edges.timeout_names_{stage}_stage", Level.SHOULD,
              f"When engine 1 of 3 never completes the {stage.upper()} stage, the startup "
              f"error should name engine 1 (not 0 or 2) and the {stage.upper()} stage "
              "(Rust HandshakeTimeout{stage}; Python waits without a bound).",
              grounds=TIMEOUT_STAGE, timeout=25)
        async def timeout_stage(ctx: CaseContext) -> None:
            text = await _refused(ctx, [EngineScript(), script, EngineScript()], 1.5)
            others = [r for r in (0, 2) if names_engine(text, r)]
            ctx.require(names_engine(text, 1) and not others and
                        bool(re.search(pattern, text, re.I)),
                        expected=f"an error naming engine 1 only and the {stage.upper()} "
                                 "stage", observed=text)

        globals()[f"timeout_stage_{stage}"] = timeout_stage
    _make_stage()
