"""Registration: the frontend serves once every engine registered, in any order, and waits
for each up to its bound, not forever and not less.

Engines are matched by ZMQ identity (python `identities.remove(identity)`,
`core_client.py:757-775`; rust transport.rs `connect_bootstrapped`), in whatever order their
ready frames come, and a pinned request then reaches the engine of its rank. Both bound each
receive, not the whole startup: an engine registering late within the bound is waited for,
one that never registers makes startup fail with a bounded error, which should name it.
"""

from __future__ import annotations

import re

from conformance.handshake.helpers import (
    CC,
    CORE,
    INTERLEAVED,
    TESTS,
    TR,
    fails_within_bound,
    require_pinned_served,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineScript,
    Level,
    StartupError,
    StartupHang,
    both,
    case,
    engine,
    prompt,
    py,
    recommendation,
    rs,
)

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
# Registrations are matched by identity, in any order; a pinned rank reaches its engine.
ANY_ORDER = both(
    py(f"{CC}:774", "identities.remove(identity)"),
    py(f"{CC}:1808", "chosen_engine = self.core_engines[eng_index]"),
    rs(f"{TR}:512", "let mut pending = expected_engines.iter().cloned().collect::<BTreeSet<_>>();"),
    rs(f"{TR}:555", ".remove(&engine_id)"),
    rs("rust/src/engine-core-client/src/client/state.rs:203",
       "let engine_id = u16::try_from(rank).ok().map(EngineId::from_engine_index);"),
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


@case("handshake.register.interleaved_order_serves_every_rank", Level.MUST,
      "Engines that register interleaved (1, 3, 0, 2) are each reached by the requests "
      "pinned to their rank.", grounds=ANY_ORDER,
      needs=[Capability.GENERATE, Capability.DP_RANK])
async def interleaved_serves(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript(ready_delay=d) for d in INTERLEAVED])
    for rank in (3, 2, 1, 0):
        await require_pinned_served(ctx, group, rank, prompt(60 + rank),
                                    f"request pinned to {rank} served by engine {rank}")


# ------------------------------------------------------------------ late or never

@case("handshake.more_edges.late_registrations_served_{mode}", Level.MUST,
      "With 2 engines ({mode} startup) and a {bound} s startup bound, engines registering "
      "after {delays[0]} s and {delays[1]} s are both waited for: the frontend starts and "
      "serves a request pinned to each (it does not give up before its bound, whatever "
      "arrived in its last second).",
      grounds=LATE, needs=[Capability.GENERATE, Capability.DP_RANK], timeout=40,
      # both delays inside the bound, the first less than a second before it
      params=[{"mode": mode, "bound": 5.6, "delays": (4.7, 4.9)}
              for mode in ("bootstrapped", "handshake")])
async def late_registrations(ctx: CaseContext, mode: str, bound: float,
                             delays: tuple[float, float]) -> None:
    scripts = [EngineScript(ready_delay=ctx.t(d)) for d in delays]
    try:
        await ctx.start(scripts, startup_timeout=bound, handshake=mode == "handshake")
    except (StartupError, StartupHang) as exc:
        ctx.fail(expected=f"startup waits up to {bound} s (scaled) for engines registering "
                          f"at {list(delays)} s",
                 observed=f"{type(exc).__name__}: {exc}")
    for rank in (0, 1):
        handle = await ctx.driver.generate(prompt(920 + rank), 2, data_parallel_rank=rank)
        await handle.wait(ctx.t(3))
        ctx.require(handle.finish_reason == "length",
                    expected=f"the request at engine {rank} is served",
                    observed=f"{handle.finish_reason} error={handle.error}")


@case("handshake.register.never_registers", Level.MUST,
      "An engine that never registers makes startup fail with a bounded error.",
      grounds=NEVER_REGISTERS, timeout=20)
async def never_registers(ctx: CaseContext) -> None:
    await fails_within_bound(ctx, [EngineScript(), EngineScript(register=False)],
                             expected="startup error (engine 1 never registered)")


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
    ctx.fail(expected="startup error naming engine 1", observed="it started")
