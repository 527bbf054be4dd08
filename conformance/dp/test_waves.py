"""DP waves as a frontend sees them: the coordinator's wave on every ADD, the frontend never
waking the coordinator itself, and DP control arriving where it must not.

The coordinator publishes `(counts, current_wave, engines_running)` on its XPUB; both 0.33.0
frontends subscribe and stamp the newest `current_wave` on each ADD (Python DPAsyncMPClient
`core_client.py:1577-1590, 1610`; Rust coordinator/external.rs:70 and client.rs:662,
bootstrapped_external_coordinator_updates_wave_ignores_counts_and_sends_no_wakeup). With a
coordinator, engines send `wave_complete` / `start_wave` only to it (`core.py:2086-2090,
2528`, client index -1); the Rust client fails closed when they reach its main output path
(client_fail_closes_when_main_output_path_receives_dp_control), the Python one drops them
(core_client.py:1259). When a client fails closed on them, its error should say why.
"""

from __future__ import annotations

import re

from conformance.dp.helpers import holding_engines
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineGroup,
    Level,
    both,
    case,
    differ,
    engine,
    messages,
    prompt,
    py,
    request_for,
    requests_for,
    require_refused_later,
    rs,
)

STAMP = both(
    py("vllm/v1/engine/core_client.py:1589", "self.current_wave = wave"),
    py("vllm/v1/engine/core_client.py:1610", "request.current_wave = self.current_wave"),
    rs("rust/src/engine-core-client/src/coordinator/external.rs:70",
       "state.current_wave = update.wave;"),
    rs("rust/src/engine-core-client/src/client.rs:662",
       "req.current_wave = coordinator.snapshot().current_wave;"),
    rs("rust/src/engine-core-client/src/tests/client.rs:3387",
       "assert_eq!(request.current_wave, 7);"),
    engine("vllm/v1/engine/core.py:1148", "return req, request.current_wave"),
    engine("vllm/v1/engine/core.py:2375", "if request_wave > self.current_wave:"),
)
NEWEST = both(
    py("vllm/v1/engine/core_client.py:1579",
       "# Drain all stats events (we only care about latest)."),
    py("vllm/v1/engine/core_client.py:1589", "self.current_wave = wave"),
    py("vllm/v1/engine/core_client.py:1610", "request.current_wave = self.current_wave"),
    rs("rust/src/engine-core-client/src/coordinator/external.rs:88",
       "let publish = self.socket.recv().await.map_err(Error::from)?;"),
    rs("rust/src/engine-core-client/src/coordinator/external.rs:70",
       "state.current_wave = update.wave;"),
    rs("rust/src/engine-core-client/src/client.rs:662",
       "req.current_wave = coordinator.snapshot().current_wave;"),
    engine("vllm/v1/engine/core.py:2375", "if request_wave > self.current_wave:"),
)
RUNNING = both(
    py("vllm/v1/engine/core_client.py:1590", "self.engines_running = running"),
    py("vllm/v1/engine/core_client.py:1610", "request.current_wave = self.current_wave"),
    rs("rust/src/engine-core-client/src/coordinator/external.rs:71",
       "state.engines_running = update.engines_running;"),
    rs("rust/src/engine-core-client/src/client.rs:662",
       "req.current_wave = coordinator.snapshot().current_wave;"),
    engine("vllm/v1/engine/core.py:2375", "if request_wave > self.current_wave:"),
)
GEN = [Capability.GENERATE]


async def _publish_wave(ctx: CaseContext, group: EngineGroup, wave: int,
                        running: bool = False) -> None:
    """Make the mock coordinator publish `wave` and give the frontend time to read it."""
    coordinator = group.coordinator
    assert coordinator is not None, "wave cases need a DP group (2+ engines)"
    coordinator.wave, coordinator.running = wave, running
    published = await ctx.wait_until(
        lambda: any(r.message is not None and r.message.current_wave == wave
                    for r in coordinator.transcript.select(direction="out")), 2)
    ctx.require(published, expected=f"the mock coordinator publishes wave {wave}",
                observed="no publication (harness fault)")
    await ctx.quiet(0.3)  # a few publications, every 0.1 s


async def _add_wave(ctx: CaseContext, group: EngineGroup, index: int) -> int | None:
    p = prompt(index)
    handle = await ctx.driver.generate(p, 2)
    await handle.wait(ctx.t(3))
    found = request_for(group, p)
    if found is None:
        return None
    add = next(r for r in group.transcript.adds(found[0]) if r.request_id == found[1])
    return add.current_wave


@case("dp.wave.add_carries_wave_{wave}_{n}_engines", Level.MUST,
      "With {n} engines, after the coordinator publishes current_wave={wave}, an "
      "ADD carries current_wave {wave}.", grounds=STAMP, needs=GEN,
      params=[{"n": n, "wave": wave} for n, wave in ((2, 1), (3, 7), (4, 12))])
async def add_carries_wave(ctx: CaseContext, n: int, wave: int) -> None:
    group = await ctx.start(n)
    await _publish_wave(ctx, group, wave)
    got = await _add_wave(ctx, group, 10)
    ctx.require(got == wave, expected=f"ADD current_wave {wave}",
                observed=f"current_wave {got}")


@case("dp.wave.add_follows_newest_wave", Level.MUST,
      "The wave on an ADD follows the coordinator's newest publication (2, then 5), not the "
      "first one the frontend saw.", grounds=NEWEST, needs=GEN)
async def add_follows_newest(ctx: CaseContext) -> None:
    group = await ctx.start(2)
    seen = []
    for i, wave in enumerate((2, 5)):
        await _publish_wave(ctx, group, wave)
        seen.append(await _add_wave(ctx, group, 20 + i))
    ctx.require(seen == [2, 5], expected="ADD waves [2, 5]", observed=f"{seen}")


# A coordinator publishes (None, wave, running) on every wave change (coordinator.py:444):
# counts nil is a wave-only update, not a malformed one.
NIL_COUNTS = both(
    py("vllm/v1/engine/core_client.py:1589", "self.current_wave = wave"),
    py("vllm/v1/engine/core_client.py:1591", "if counts is not None:"),
    rs("rust/src/engine-core-client/src/coordinator/external.rs:32", "counts: OpaqueValue,"),
    rs("rust/src/engine-core-client/src/coordinator/external.rs:70",
       "state.current_wave = update.wave;"),
    engine("vllm/v1/engine/coordinator.py:443",
           "message = (None, current_wave, engines_running)"),
    engine("vllm/v1/engine/core.py:2375", "if request_wave > self.current_wave:"))


@case("dp.wave.nil_counts_publication_{n}_engines", Level.MUST,
      "With {n} engines, a wave-only publication [nil, 6, true] (what a 0.33.0 "
      "coordinator sends on every wave change) is read, not taken for a malformed "
      "one: the next ADD carries current_wave 6, its stream completes, and a later "
      "request is served too.", grounds=NIL_COUNTS, needs=GEN, params=[{"n": 2}, {"n": 3}])
async def nil_counts(ctx: CaseContext, n: int) -> None:
    group = await ctx.start(n)
    coordinator = group.coordinator
    assert coordinator is not None
    await ctx.quiet(0.2)  # regular publications with counts first
    coordinator.publishing = False  # the wave-only update stays the newest
    coordinator.wave, coordinator.running = 6, True
    coordinator.inject.append(group.codec.encode_dp_stats(
        messages.DPStatsUpdate(None, 6, True)))
    sent = await ctx.wait_until(
        lambda: any(r.note == "injected"
                    for r in coordinator.transcript.select(direction="out")), 2)
    ctx.require(sent, expected="the mock coordinator sends the wave-only update",
                observed="not sent (harness fault)")
    await ctx.quiet(0.3)
    got = await _add_wave(ctx, group, 40)
    ctx.require(got == 6, expected="the next ADD with current_wave 6",
                observed=f"current_wave {got}")
    later = await ctx.driver.generate(prompt(41), 2)
    await later.wait(ctx.t(3))
    ctx.require(later.finish_reason == "length" and later.tokens == [100, 101],
                expected="a later request served normally",
                observed=f"{later.finish_reason} {later.tokens} error={later.error}")


@case("dp.wave.wave_while_running", Level.MUST,
      "A wave published while the engines are running (engines_running=true) is stamped "
      "on the ADD too.", grounds=RUNNING, needs=GEN)
async def wave_while_running(ctx: CaseContext) -> None:
    group = await ctx.start(2)
    await _publish_wave(ctx, group, 4, running=True)
    got = await _add_wave(ctx, group, 30)
    ctx.require(got == 4, expected="ADD current_wave 4", observed=f"current_wave {got}")


NO_WAKEUP = both(
    py("vllm/v1/engine/core_client.py:1542", 'await socket.send(b"\\x01")'),
    py("vllm/v1/engine/core_client.py:1613",
       "# The engine that receives it wakes the other ranks if they are idle."),
    py("vllm/v1/engine/coordinator.py:354",
       "DP Coordinator received unexpected message from front-end"),
    rs("rust/src/engine-core-client/src/coordinator/external.rs:88",
       "let publish = self.socket.recv().await.map_err(Error::from)?;"),
    rs("rust/src/engine-core-client/src/tests/client.rs:3373",
       "// The engine that receives the request starts the wave, not the frontend."),
    engine("vllm/v1/engine/core.py:2381",
           "# Engines alone start waves: have the coordinator wake the others."),
)
SUBSCRIPTIONS = (b"\x01", b"\x00")  # what a 0.33.0 coordinator ignores from a frontend


@case("dp.wave.no_frontend_wakeup_{n}_engines", Level.MUST,
      "With {n} engines idle (the coordinator publishes engines_running=false, wave "
      "7), requests to every engine send the coordinator nothing but a plain "
      "subscription: no wake-up, no request notice (a 0.33.0 coordinator logs any "
      "other frontend message as unexpected; the engines start the wave).",
      grounds=NO_WAKEUP, needs=GEN, params=[{"n": 2}, {"n": 3}])
async def no_wakeup(ctx: CaseContext, n: int) -> None:
    group = await ctx.start(holding_engines(n))
    coordinator = group.coordinator
    assert coordinator is not None, "a DP group has a mock coordinator"
    await _publish_wave(ctx, group, 7, running=False)
    prompts = [prompt(40 + i) for i in range(2 * n)]
    for p in prompts:  # held: in-flight counts spread them over every engine
        await (await ctx.driver.generate(p, 50)).wait_first(ctx.t(3))
    await ctx.quiet(0.3)  # anything sent with the last request lands
    owners = sorted(set((requests_for(group, prompts) or {}).values()))
    ctx.require(owners == list(range(n)), expected=f"requests at each of the {n} "
                "engines (harness precondition)", observed=f"at engines {owners}")
    sent = [r.frames[0] for r in coordinator.transcript.select(direction="in")]
    other = [f[:40].hex() for f in sent if f not in SUBSCRIPTIONS]
    ctx.note(f"{len(sent)} frame(s) from the frontend to the coordinator")
    ctx.require(not other, expected="only subscriptions (01 / 00) to the coordinator",
                observed=f"{len(other)} other frame(s): {other[:4]}")


# ---------------------------------------------------------------- DP control on the main path

# Python drops DP control on the main output path; Rust fails closed; engines send it to a
# coordinator only.
_PY_DROPS = py("vllm/v1/engine/core_client.py:1259",
               "if outputs.outputs or outputs.scheduler_stats:")
_RS_UNEXPECTED = rs("rust/src/engine-core-client/src/client/imp.rs:527",
                    "received unexpected output on main dispatcher path: {other:?}")
_TO_COORDINATOR = (
    engine("vllm/v1/engine/core.py:2086", "if client_index == -1:"),
    engine("vllm/v1/engine/core.py:2528", "client_index = -1 if self.has_coordinator else 0"),
)
CONTROL = differ(
    _PY_DROPS,
    _RS_UNEXPECTED,
    rs("rust/src/engine-core-client/src/client/imp.rs:537",
       "inner.close_registries(Arc::new(error));"),
    rs("rust/src/engine-core-client/src/tests/client.rs:977",
       "async fn client_fail_closes_when_main_output_path_receives_dp_control()"),
    *_TO_COORDINATOR,
    note="python's async client drops a start_wave / wave_complete-only message on its main "
         "output path (core_client.py:1259 queues only outputs or scheduler_stats) and keeps "
         "serving; rust treats it as UnexpectedDispatcherOutput (imp.rs:526-527) and closes "
         "its registries (imp.rs:537). With a coordinator, engines send DP control to it only "
         "(core.py:2086, 2528); without one an engine sends wave_complete to client 0 "
         "(core.py:2528), so dropping it is not wrong in itself")
CONTROL_TEXT = differ(
    _PY_DROPS,
    _RS_UNEXPECTED,
    rs("rust/src/engine-core-client/src/error.rs:56",
       "unexpected output on main dispatcher path: {message}"),
    rs("rust/src/engine-core-client/src/tests/client.rs:1069",
       "assert!(is_unexpected_dispatcher_output(&error_1));"),
    *_TO_COORDINATOR,
    note="python's async client drops a start_wave / wave_complete-only message on its main "
         "output path (core_client.py:1259 queues only outputs or scheduler_stats), so the "
         "stream stays open and there is no error to word; rust fails closed with "
         "UnexpectedDispatcherOutput 'unexpected output on main dispatcher path' "
         "(imp.rs:526-527, error.rs:56). With a coordinator, engines send DP control to it "
         "only (core.py:2086, 2528); without one an engine sends wave_complete to client 0")


def _control(engine: int, kind: str) -> messages.EngineCoreOutputs:
    if kind == "start_wave":
        return messages.EngineCoreOutputs(engine, [], None, 1.0, start_wave=3)
    return messages.EngineCoreOutputs(engine, [], None, 1.0, wave_complete=0)


DP_CONTROL = [{"kind": "start_wave"}, {"kind": "wave_complete"}]


@case("dp.wave.{kind}_on_main_path_fails_closed", Level.SHOULD,
      "A {kind} message on the main output path (with a coordinator, engines send "
      "it to the coordinator only) should make the client fail closed: open streams "
      "end with an error and later requests are refused.", grounds=CONTROL,
      needs=[Capability.GENERATE, Capability.REQUEST_ERRORS], params=DP_CONTROL)
async def control_fails_closed(ctx: CaseContext, kind: str) -> None:
    group = await ctx.start(holding_engines(2))
    handle = await ctx.driver.generate(prompt(40), 50)
    await handle.wait_first(ctx.t(3))
    group[1].send_garbage(group.codec.encode_outputs(_control(1, kind)))
    try:
        await handle.wait(ctx.t(3))
    except TimeoutError:
        ctx.fail(expected=f"the open stream ends with an error after {kind}",
                 observed="it stays open (the message was ignored)")
    ctx.require(handle.finish_reason == "error",
                expected="the open stream ends with an error",
                observed=f"{handle.finish_reason} error={handle.error}")
    await require_refused_later(ctx, 41)


@case("dp.wave.{kind}_on_main_path_error_says_why", Level.SHOULD,
      "When a {kind} message reaches the main output path and the client fails "
      "closed, the open stream's error should say why: that DP control arrived on "
      "the main output path (vllm-rs: 'unexpected output on main dispatcher path').",
      grounds=CONTROL_TEXT, needs=[Capability.GENERATE, Capability.REQUEST_ERRORS],
      params=DP_CONTROL)
async def control_text(ctx: CaseContext, kind: str) -> None:
    group = await ctx.start(holding_engines(2))
    handle = await ctx.driver.generate(prompt(670), 50)
    await handle.wait_first(ctx.t(3))
    control = (messages.EngineCoreOutputs(1, start_wave=3) if kind == "start_wave"
               else messages.EngineCoreOutputs(1, wave_complete=0))
    group[1].send_garbage(group.codec.encode_outputs(control))
    ended = await ctx.wait_until(lambda: handle.ended, 3)
    ctx.require(ended and handle.finish_reason == "error",
                expected=f"the open stream ends with an error after {kind}",
                observed=("still open (the message was ignored)" if not ended
                          else f"{handle.finish_reason} error={handle.error}"))
    said = re.search(r"main (output|dispatcher) path", handle.error or "",
                     re.IGNORECASE)
    ctx.require(said is not None,
                expected="the error says it came from the main output path",
                observed=f"error {handle.error!r}")
