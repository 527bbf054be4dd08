"""HELLO / INIT / READY: the frontend owns the startup handshake (engines started headless).

vLLM 0.33.0: `wait_for_engine_startup` (`v1/engine/utils.py:1403-1589`): each engine's HELLO
(`:1517`) is answered with INIT carrying the input/output addresses, READY (`:1552`) ends its
startup; the wait itself has no bound (`:1439-1452`, model loading sits between INIT and
READY); engines send HELLO/READY from `core.py:1376-1416`. Rust HandshakeOwner
(`transport.rs:144-322`): the same stages, any engine identity accepted at HELLO, a duplicate
HELLO an error, a per-stage `HandshakeTimeout{stage}`. vllm-rs runs it as `vllm-rs serve`
(vllm_rs_handshake.py); vllm-py builds AsyncLLM without client_addresses, owning the
handshake of remote headless engines (vllm_py_handshake.py); a frontend still waiting past
the bound is a StartupHang, graded by the case's level. Drivers that cannot run this mode
report UNSUPPORTED.
"""

from __future__ import annotations

import re

from conformance.handshake.helpers import (
    CORE,
    TESTS,
    TR,
    UT,
    handshake_refused,
    require_pinned_served,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineGroup,
    EngineScript,
    Level,
    StartupError,
    StartupHang,
    both,
    case,
    differ,
    engine,
    messages,
    prompt,
    py,
    recommendation,
    rs,
)

HELLO_INIT_READY = both(
    py(f"{UT}:1517", 'if status == "HELLO" and engine.state == CoreEngineState.NEW:'),
    py(f"{UT}:1544", "addresses=launch.addresses,"),
    py(f"{UT}:1548", "handshake_socket.send_multipart((eng_identity, init_message), copy=False)"),
    rs(f"{TR}:212", "send_init_message("),
    rs(f"{TR}:482", "inputs: vec![input_address.to_string()],"),
    rs(f"{TR}:483", "outputs: vec![output_address.to_string()],"),
    engine(f"{CORE}:1459", "return init_message.addresses"),
)
# With one engine there is no DP coordinator (Python runs one only for data_parallel_size
# > 1; Rust names one only when it owns one): the INIT's coordinator addresses stay nil, and
# an engine told of a coordinator would take itself for a DP rank that has one.
NO_COORDINATOR_NAMED = both(
    py("vllm/config/vllm.py:888", "return self.parallel_config.data_parallel_size > 1 and ("),
    py(f"{UT}:1236", "vllm_config.needs_dp_coordinator and not offline_mode and dp_rank == 0"),
    py(f"{UT}:1265", "if run_coordinator:"),
    rs(f"{TR}:484", "coordinator_input: coordinator.map(|c| c.input_address.clone()),"),
    rs(f"{TR}:485", "coordinator_output: coordinator.map(|c| c.output_address.clone()),"),
    engine(f"{CORE}:1210", "self.has_coordinator = addresses.coordinator_output is not None"),
)
# Python's handshake wait is unbounded on purpose: weight loading sits between an engine's
# INIT and its READY, and only local engine / coordinator process deaths end the wait.
_PY_UNBOUNDED = (
    py(f"{UT}:1439", "while any(conn_pending) or any(start_pending):"),
    py(f"{UT}:1440", "events = poller.poll(STARTUP_POLL_PERIOD_MS)"),
)
MISSING_READY_BOUNDED = differ(
    *_PY_UNBOUNDED,
    py(f"{UT}:1449", "Waiting for %d local, %d remote core engine proc(s) to start."),
    rs(f"{TR}:266", "let message = timeout(ready_timeout, handshake_socket.recv())"),
    rs(f"{TR}:268", 'stage: "READY",'),
    rs(f"{TESTS}:1694", "async fn connect_times_out_without_ready_message() {"),
    note="python waits for READY without a bound (utils.py:1439-1452 polls for ever, since "
         "model loading sits between INIT and READY; only a local process death ends it); "
         "rust bounds each stage by ready_timeout and fails with HandshakeTimeout{READY}",
)
NEVER_HELLO_BOUNDED = differ(
    *_PY_UNBOUNDED,
    py(f"{UT}:1444", "Waiting for %d local, %d remote core engine proc(s) to connect."),
    rs(f"{TR}:196", "let message = timeout(ready_timeout, handshake_socket.recv())"),
    rs(f"{TR}:198", 'stage: "HELLO",'),
    note="python waits for HELLO without a bound (utils.py:1439-1452 polls for ever; a remote "
         "engine may be started later); rust bounds each stage by ready_timeout and fails "
         "with HandshakeTimeout{HELLO}",
)
MISSING_READY_NAMED = recommendation(
    py(f"{UT}:1440", "events = poller.poll(STARTUP_POLL_PERIOD_MS)"),
    rs(f"{TR}:268", 'stage: "READY",'),
    rs("rust/src/engine-core-client/src/error.rs:41",
       "startup handshake timed out while waiting for {stage} after {timeout:?}"),
    note="corewire's advice: python has no error to name anything (an unbounded wait); "
         "rust's HandshakeTimeout names the READY stage but not the engine",
)
UNEXPECTED_IDENTITY = differ(
    py(f"{UT}:1487", "next((e for e in core_engines if e.identity == eng_identity), None)"),
    py(f"{UT}:1490", 'f"Message from engine with unexpected data parallel rank: {eng_index}"'),
    rs(f"{TR}:204", 'Some("HELLO") => {'),
    rs(f"{TR}:222", "engines.insert(engine_id.clone(), EngineStartupState::HelloReceived);"),
    rs(f"{TR}:304", "wait_for_input_registrations(&mut input_socket, engines.into_keys()"),
    rs(f"{TESTS}:1703", 'PeerIdentity::try_from(b"engine-timeout".to_vec())'),
    note="python refuses a HELLO from an identity outside its engine list (utils.py:1487-1490); "
         "rust's HandshakeOwner takes the first engine_count identities that say HELLO, any "
         "bytes (transport.rs:204-222, its own tests use b\"engine-timeout\"), and serves "
         "them; requests pinned to a missing rank then fail with InvalidDataParallelRank",
)


def _inits(group: EngineGroup, rank: int) -> list[messages.EngineHandshakeMetadata]:
    return [r.message for r in group.transcript.select(rank=rank, direction="in",
                                                       channel="handshake")
            if isinstance(r.message, messages.EngineHandshakeMetadata)]


@case("handshake.mode.hello_init_ready_{n}_engines", Level.MUST,
      "With {n} engine(s) doing HELLO / INIT / READY, each gets exactly one INIT whose input "
      "and output addresses are the same for all and reach the frontend: every engine then "
      "serves the requests pinned to it.",
      grounds=HELLO_INIT_READY, needs=[Capability.GENERATE, Capability.DP_RANK],
      params=[{"n": n} for n in (1, 2, 3, 4)])
async def hello_init_ready(ctx: CaseContext, n: int) -> None:
    group = await ctx.start(n, handshake=True)
    inits = {r: _inits(group, r) for r in range(n)}
    ctx.require(all(len(v) == 1 for v in inits.values()), expected="one INIT per engine",
                observed={r: len(v) for r, v in inits.items()})
    addresses = {(tuple(v[0].addresses.inputs), tuple(v[0].addresses.outputs))
                 for v in inits.values()}
    ctx.require(len(addresses) == 1 and all(a and b for a, b in addresses),
                expected="the same non-empty input/output addresses in every INIT",
                observed=sorted(addresses))
    for rank in reversed(range(n)):
        await require_pinned_served(ctx, group, rank, prompt(rank),
                                    f"engine {rank} serves its pinned request")


@case("handshake.mode.single_engine_init_names_no_coordinator", Level.MUST,
      "With 1 engine doing HELLO / INIT / READY (no data parallelism, so no DP "
      "coordinator), its INIT names no coordinator: coordinator_input and "
      "coordinator_output are nil.",
      grounds=NO_COORDINATOR_NAMED, needs=[Capability.GENERATE])
async def single_engine_init_names_no_coordinator(ctx: CaseContext) -> None:
    try:
        group = await ctx.start(1, handshake=True, startup_timeout=3)
    except (StartupError, StartupHang):
        # An engine told of a coordinator waits for it, so startup may never end: the INIT
        # it got is the evidence either way.
        group = ctx.engines
        if not any(i.addresses.coordinator_input or i.addresses.coordinator_output
                   for i in _inits(group, 0)):
            raise
    inits = _inits(group, 0)
    ctx.require(len(inits) == 1, expected="one INIT", observed=f"{len(inits)} INIT(s)")
    named = (inits[0].addresses.coordinator_input, inits[0].addresses.coordinator_output)
    ctx.require(named == (None, None),
                expected="coordinator_input and coordinator_output nil",
                observed=f"coordinator_input {named[0]!r}, coordinator_output {named[1]!r}")


# ------------------------------------------------------------------ a stage never completes

@case("handshake.mode.missing_ready_fails", Level.SHOULD,
      "An engine that sends HELLO and registers but never sends READY should make startup "
      "fail within the bound; the frontend does not serve without it.",
      grounds=MISSING_READY_BOUNDED, timeout=20)
async def missing_ready(ctx: CaseContext) -> None:
    await handshake_refused(ctx, [EngineScript(), EngineScript(handshake_ready=False)], 1.5)


@case("handshake.mode.missing_ready_named", Level.SHOULD,
      "The startup error for a missing READY should name the engine (1) and the stage.",
      grounds=MISSING_READY_NAMED, timeout=20)
async def missing_ready_named(ctx: CaseContext) -> None:
    text = await handshake_refused(ctx, [EngineScript(), EngineScript(handshake_ready=False)],
                                   1.5)
    named = re.search(r"(engine|rank|dp)\D{0,20}\b1\b", text, re.I) or "0100" in text
    ctx.require(bool(named) and "READY" in text.upper(),
                expected="an error naming engine 1 and the READY stage", observed=text)


@case("handshake.mode.never_hello_fails", Level.SHOULD,
      "An engine that never connects (no HELLO) should make startup fail within the bound.",
      grounds=NEVER_HELLO_BOUNDED, timeout=20)
async def never_hello(ctx: CaseContext) -> None:
    await handshake_refused(ctx, [EngineScript(), EngineScript(hello=False)], 1.5)


@case("handshake.mode.unexpected_identity_refused", Level.SHOULD,
      "A HELLO from an identity the frontend does not expect (5, with engines 0 and 1) "
      "should be refused: startup fails instead of serving.",
      grounds=UNEXPECTED_IDENTITY, timeout=20)
async def unexpected_identity(ctx: CaseContext) -> None:
    await handshake_refused(ctx, [EngineScript(), EngineScript(register_as=5)], 4)
