"""HELLO / INIT / READY missteps a port lets through or reports vaguely: a duplicate HELLO,
a READY before HELLO or twice, an undecodable handshake message, and which engine and stage a
startup timeout names.

vLLM 0.33.0 `wait_for_engine_startup` (v1/engine/utils.py:1484-1589): a message is decoded
per engine identity, HELLO is accepted only from an engine in state NEW and READY only from
one in state CONNECTED, anything else raises "Unexpected {status} message for ... engine
{eng_index} in {state} state" (:1585-1589). Rust HandshakeOwner (rust-client.md §2.2):
"Duplicate HELLO id -> error", per-stage `HandshakeTimeout{stage}`.
"""

from __future__ import annotations

import re

from conformance.handshake.helpers import CORE, TR, UT, handshake_refused
from harness.cases.authoring import (
    CaseContext,
    EngineScript,
    Level,
    both,
    case,
    differ,
    engine,
    names_engine,
    py,
    recommendation,
    rs,
)

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


def _misstep_scripts(n: int, bad: int, misstep: EngineScript) -> list[EngineScript]:
    return [misstep if rank == bad else EngineScript() for rank in range(n)]


# ---------------------------------------------------------------- out-of-order messages

ENGINES_AND_CULPRIT = [{"n": n, "bad": bad} for n, bad in ((1, 0), (2, 1), (3, 0))]


@case("handshake.edges.duplicate_hello_refused_{n}_engines", Level.MUST,
      "With {n} engine(s), engine {bad} sending HELLO twice makes startup fail promptly with "
      "an error naming engine {bad} (a second HELLO is not answered with a second INIT).",
      grounds=DUPLICATE_HELLO, timeout=25, params=ENGINES_AND_CULPRIT)
async def duplicate_hello(ctx: CaseContext, n: int, bad: int) -> None:
    text = await handshake_refused(ctx, _misstep_scripts(n, bad, EngineScript(hello_repeats=2)),
                                   6, within=3)
    ctx.require(names_engine(text, bad), expected=f"an error naming engine {bad}",
                observed=text)


@case("handshake.edges.ready_before_hello_refused_{n}_engines", Level.MUST,
      "With {n} engine(s), engine {bad} sending READY before its HELLO makes startup fail "
      "promptly with an error naming engine {bad}.",
      grounds=READY_BEFORE_HELLO, timeout=25, params=ENGINES_AND_CULPRIT)
async def ready_first(ctx: CaseContext, n: int, bad: int) -> None:
    text = await handshake_refused(ctx, _misstep_scripts(
        n, bad, EngineScript(ready_before_hello=True)), 6, within=3)
    ctx.require(names_engine(text, bad), expected=f"an error naming engine {bad}",
                observed=text)


@case("handshake.edges.duplicate_ready_refused_{n}_engines", Level.MUST,
      "With {n} engine(s), engine {bad} sending its READY twice while the others' are still "
      "to come makes startup fail promptly with an error naming engine {bad} (a READY is "
      "taken once, from an engine that sent HELLO and got INIT).",
      grounds=DUPLICATE_READY, timeout=25,
      # not one engine alone: its first READY ends the handshake
      params=[{"n": n, "bad": bad} for n, bad in ((2, 1), (3, 0))])
async def duplicate_ready(ctx: CaseContext, n: int, bad: int) -> None:
    scripts = [EngineScript(handshake_ready_repeats=2) if rank == bad
               else EngineScript(ready_delay=1.0) for rank in range(n)]
    text = await handshake_refused(ctx, scripts, 6, within=3)
    ctx.require(names_engine(text, bad), expected=f"an error naming engine {bad}",
                observed=text)


# ---------------------------------------------------------------- undecodable handshake

@case("handshake.edges.undecodable_hello_fails_fast", Level.MUST,
      "An engine (1 of 2) whose first handshake message is not msgpack makes startup fail "
      "promptly (well before the 6 s bound), not wait for a valid message.",
      grounds=UNDECODABLE_HELLO,
      timeout=25)
async def undecodable_hello(ctx: CaseContext) -> None:
    await handshake_refused(ctx, _misstep_scripts(2, 1, EngineScript(hello_payload=b"\xc1\xc1")),
                            6, within=3)


@case("handshake.edges.undecodable_hello_named", Level.SHOULD,
      "The startup error for an undecodable handshake message should name the engine (1) "
      "that sent it (Python re-raises msgspec's DecodeError, which names no engine).",
      grounds=UNDECODABLE_HELLO_NAMED, timeout=25)
async def undecodable_hello_named(ctx: CaseContext) -> None:
    text = await handshake_refused(
        ctx, _misstep_scripts(2, 1, EngineScript(hello_payload=b"\xc1")), 6, within=3)
    ctx.require(names_engine(text, 1), expected="an error naming engine 1", observed=text)


@case("handshake.edges.unexpected_identity_named", Level.SHOULD,
      "The startup error for a HELLO from an unexpected identity (5, engines 0 and 1) "
      "should name that identity (Python: 'unexpected data parallel rank: 5').",
      grounds=UNEXPECTED_IDENTITY_NAMED, timeout=25)
async def unexpected_identity_named(ctx: CaseContext) -> None:
    text = await handshake_refused(ctx, [EngineScript(), EngineScript(register_as=5)], 4)
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


@case("handshake.edges.timeout_names_{stage}_stage", Level.SHOULD,
      "When engine 1 of 3 never completes the {upper} stage, the startup error should name "
      "engine 1 (not 0 or 2) and the {upper} stage (Rust HandshakeTimeout{{stage}}; Python "
      "waits without a bound).", grounds=TIMEOUT_STAGE, timeout=25,
      params=[{"stage": stage, "upper": stage.upper()} for stage in STAGES])
async def timeout_stage(ctx: CaseContext, stage: str) -> None:
    script, pattern = STAGES[stage]
    text = await handshake_refused(ctx, [EngineScript(), script, EngineScript()], 1.5)
    others = [r for r in (0, 2) if names_engine(text, r)]
    ctx.require(names_engine(text, 1) and not others and bool(re.search(pattern, text, re.I)),
                expected=f"an error naming engine 1 only and the {stage.upper()} stage",
                observed=text)
