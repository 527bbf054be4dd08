"""DP waves as a frontend sees them: the coordinator's wave on every ADD, and DP control
arriving where it must not.

The coordinator publishes `(counts, current_wave, engines_running)` on its XPUB; both 0.33.0
frontends subscribe and stamp the newest `current_wave` on each ADD (Python DPLB
`core_client.py:1588-1611`; Rust `client/stream.rs` "stamps current_wave from its snapshot",
bootstrapped_external_coordinator_updates_wave_ignores_counts_and_sends_no_wakeup). Engines
send `wave_complete` / `start_wave` only to the coordinator (`core.py:2078-2090`, client
index -1); the Rust client fails closed when they reach its main output path
(client_fail_closes_when_main_output_path_receives_dp_control).
"""

from __future__ import annotations

from harness.case_context import CaseContext
from harness.casekit import hold, prompt, request_for, requests_for, require_refused_later
from harness.frontends.driver import Capability
from harness.verdicts import Level, case
from harness.wire import messages as m
from mock_engines.group import EngineGroup
from mock_engines.script import EngineScript, any_request

STAMP = ("vllm/v1/engine/core_client.py:1588-1611 (0.33.0); rust client.rs "
         "bootstrapped_external_coordinator_updates_wave_ignores_counts_and_sends_no_wakeup")
CONTROL = ("rust client.rs client_fail_closes_when_main_output_path_receives_dp_control; "
           "vllm/v1/engine/core.py:2078-2090 (client_index -1 -> coordinator only)")
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


for _n, _wave in ((2, 1), (3, 7), (4, 12)):
    def _make_stamped(n: int = _n, wave: int = _wave) -> None:
        @case(f"dp.wave.add_carries_wave_{wave}_{n}_engines", Level.MUST,
              f"With {n} engines, after the coordinator publishes current_wave={wave}, an "
              f"ADD carries current_wave {wave}.", source=STAMP, needs=GEN)
        async def add_carries_wave(ctx: CaseContext) -> None:
            group = await ctx.start(n)
            await _publish_wave(ctx, group, wave)
            got = await _add_wave(ctx, group, 10)
            ctx.require(got == wave, expected=f"ADD current_wave {wave}",
                        observed=f"current_wave {got}")

        globals()[f"add_carries_wave_{wave}"] = add_carries_wave
    _make_stamped()


@case("dp.wave.add_follows_newest_wave", Level.MUST,
      "The wave on an ADD follows the coordinator's newest publication (2, then 5), not the "
      "first one the frontend saw.", source=STAMP, needs=GEN)
async def add_follows_newest(ctx: CaseContext) -> None:
    group = await ctx.start(2)
    seen = []
    for i, wave in enumerate((2, 5)):
        await _publish_wave(ctx, group, wave)
        seen.append(await _add_wave(ctx, group, 20 + i))
    ctx.require(seen == [2, 5], expected="ADD waves [2, 5]", observed=f"{seen}")


@case("dp.wave.wave_while_running", Level.MUST,
      "A wave published while the engines are running (engines_running=true) is stamped "
      "on the ADD too.", source=STAMP + "; rust client.rs bootstrapped_external_coordinator_"
                                        "running_state_suppresses_wakeup", needs=GEN)
async def wave_while_running(ctx: CaseContext) -> None:
    group = await ctx.start(2)
    await _publish_wave(ctx, group, 4, running=True)
    got = await _add_wave(ctx, group, 30)
    ctx.require(got == 4, expected="ADD current_wave 4", observed=f"current_wave {got}")


NO_WAKEUP = ("rust client.rs bootstrapped_external_coordinator_updates_wave_ignores_counts_"
             "and_sends_no_wakeup; vllm/v1/engine/coordinator.py:311-354, core_client.py:"
             "1606-1611 (0.33.0: the engine that gets the ADD wakes the others)")
SUBSCRIPTIONS = (b"\x01", b"\x00")  # what a 0.33.0 coordinator ignores from a frontend

for _n in (2, 3):
    def _make_no_wakeup(n: int = _n) -> None:
        @case(f"dp.wave.no_frontend_wakeup_{n}_engines", Level.MUST,
              f"With {n} engines idle (the coordinator publishes engines_running=false, wave "
              "7), requests to every engine send the coordinator nothing but a plain "
              "subscription: no wake-up, no request notice (a 0.33.0 coordinator logs any "
              "other frontend message as unexpected; the engines start the wave).",
              source=NO_WAKEUP, needs=GEN)
        async def no_wakeup(ctx: CaseContext) -> None:
            group = await ctx.start([EngineScript(rules=[any_request(hold())])
                                     for _ in range(n)])
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

        globals()[f"no_wakeup_{n}"] = no_wakeup
    _make_no_wakeup()


def _control(engine: int, kind: str) -> m.EngineCoreOutputs:
    if kind == "start_wave":
        return m.EngineCoreOutputs(engine, [], None, 1.0, start_wave=3)
    return m.EngineCoreOutputs(engine, [], None, 1.0, wave_complete=0)


for _kind in ("start_wave", "wave_complete"):
    def _make_control(kind: str = _kind) -> None:
        @case(f"dp.wave.{kind}_on_main_path_fails_closed", Level.SHOULD,
              f"A {kind} message on the main output path (engines send it to the "
              "coordinator only) should make the client fail closed: open streams end with "
              "an error and later requests are refused.", source=CONTROL,
              needs=[Capability.GENERATE, Capability.REQUEST_ERRORS])
        async def control_fails_closed(ctx: CaseContext) -> None:
            group = await ctx.start([EngineScript(rules=[any_request(hold())])
                                     for _ in range(2)])
            handle = await ctx.driver.generate(prompt(40), 50)
            await handle.wait_first(ctx.t(3))
            group[1].send_garbage(group.codec.encode_outputs(_control(1, kind)))
            try:
                await handle.wait(ctx.t(3))
            except TimeoutError:
                ctx.require(False, expected=f"the open stream ends with an error after {kind}",
                            observed="it stays open (the message was ignored)")
            ctx.require(handle.finish_reason == "error",
                        expected="the open stream ends with an error",
                        observed=f"{handle.finish_reason} error={handle.error}")
            await require_refused_later(ctx, 41)

        globals()[f"{kind}_fails_closed"] = control_fails_closed
    _make_control()
