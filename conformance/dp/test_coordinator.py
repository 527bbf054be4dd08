"""A frontend-owned DP coordinator's engine-facing sockets: load the engines report to it,
what it must refuse there, and its startup gate (its wave control is test_coordinator_waves).

vLLM 0.33.0's Python coordinator (`DPCoordinatorProc`, coordinator.py:148-462) keeps each
engine's `(waiting, running)` from the stats-only messages engines PUSH to it (:366-407) and
publishes them to the frontends, whose DPLB client routes by `max(inflight, waiting +
running)` (core_client.py:1751-1812). Rust's in-process coordinator accepts stats-only
messages but does not track them for routing (coordinator/inproc.rs:82-88), so load routing
is SHOULD. A message with request outputs, a utility reply or finished ids on the coordinator
path is a wiring error: Python asserts in the coordinator process (coordinator.py:363-364;
finished ids pass unchecked), Rust's runner bails ("received non-control output on
coordinator path", inproc.rs:134-137) and closes the client's registries (inproc.rs:199), so
open streams and calls fail with that cause. The startup gate waits for every engine's
subscription before READY (coordinator.py:245-254, bootstrap.rs:40-48); an engine that
subscribes again later should get READY again (Python) or at least leave the coordinator
working (Rust replays a running wave instead, inproc.rs:164-171). vLLM runs wave
coordination (and so this coordinator in handshake mode) for MoE models; a driver that cannot
run one refuses the start: UNSUPPORTED with its reason.
"""

from __future__ import annotations

import asyncio
import re

from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineGroup,
    EngineScript,
    Level,
    StreamHandle,
    UtilityReply,
    any_request,
    both,
    case,
    differ,
    engine,
    hold,
    messages,
    prompt,
    py,
    recommendation,
    request_for,
    require_refused_later,
    routed_engine,
    rs,
)

LOAD = differ(
    py("vllm/v1/engine/coordinator.py:404", "stats[0] = scheduler_stats.num_waiting_reqs"),
    py("vllm/v1/engine/coordinator.py:405", "stats[1] = scheduler_stats.num_running_reqs"),
    py("vllm/v1/engine/core_client.py:1598", "self.lb_engines = sliced_counts"),
    py("vllm/v1/engine/core_client.py:1786",
       "score: float = max(self.client_count * inflight, waiting + running)"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:86",
       "Ignore since the Rust coordinator doesn't track stats for"),
    rs("rust/src/engine-core-client/src/client/state.rs:92",
       "self.inflight.max(stats.running + stats.waiting + self.admitted_since_stats)"),
    engine("vllm/v1/engine/core.py:2453",
           "self.output_queue.put_nowait((-1, EngineCoreOutputs(scheduler_stats=stats)))"),
    note="python routes unpinned requests by the (waiting, running) counts its coordinator "
         "collects and publishes (coordinator.py:404-405, core_client.py:1598, score "
         "max(inflight, waiting + running) at :1786); rust's in-process coordinator accepts "
         "stats-only messages but ignores them (inproc.rs:86-87) and routes by in-flight "
         "counts plus main-path scheduler stats only (client/state.rs:92)")
MISWIRED = differ(
    py("vllm/v1/engine/coordinator.py:363", "assert not outputs.outputs"),
    py("vllm/v1/engine/coordinator.py:364", "assert outputs.utility_output is None"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:136",
       "received non-control output on coordinator path: {other:?}"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:199",
       "inner.close_registries(Arc::new(error));"),
    engine("vllm/v1/engine/core.py:2086", "if client_index == -1:"),
    note="python's coordinator process asserts (coordinator.py:363-364) and exits, but "
         "AsyncLLM does not watch it after startup, so open streams stay open and the client "
         "serves on without a coordinator; rust's in-process coordinator bails ('received "
         "non-control output on coordinator path', inproc.rs:134-137) and closes the client's "
         "registries (inproc.rs:199). A real engine sends only client_index -1 outputs (stats, "
         "wave control) there (core.py:2086-2090)")
MISWIRED_FINISHED = differ(
    py("vllm/v1/engine/coordinator.py:363", "assert not outputs.outputs"),
    py("vllm/v1/engine/coordinator.py:364", "assert outputs.utility_output is None"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:83",
       "if batch.outputs.is_empty() && batch.finished_requests.is_none() =>"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:136",
       "received non-control output on coordinator path: {other:?}"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:199",
       "inner.close_registries(Arc::new(error));"),
    engine("vllm/v1/engine/core.py:2086", "if client_index == -1:"),
    note="python's coordinator checks only outputs and utility_output (coordinator.py:363-364) "
         "and ignores finished_requests, so the client serves on with the stream open; rust "
         "treats a batch with finished ids as non-control (inproc.rs:83, 134-137) and fails the "
         "client closed (inproc.rs:199). A real engine sends no finished ids there "
         "(core.py:2086-2090)")
UNDECODABLE = recommendation(
    py("vllm/v1/engine/coordinator.py:361",
       "outputs: EngineCoreOutputs = decoder.decode(buffer)"),
    rs("rust/src/engine-core-client/src/transport.rs:627", "failed to decode output message"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:190",
       "self.handle_outputs(outputs?).await?;"),
    rs("rust/src/engine-core-client/src/client/imp.rs:226",
       "let _ = sender.send(Err(Error::Shared(persistent_error.clone())));"),
    rs("rust/src/engine-core-client/src/error.rs:22",
       "messagepack decode failed for {target_type}: {message}"),
    note="corewire's advice, held by neither in full: python's coordinator decodes in its own "
         "process (coordinator.py:361), the decode error ends that process unwatched, so open "
         "streams stay open and a pending utility call is not failed; rust fails closed (the "
         "coordinator output loop forwards the decode error, transport.rs:623-629, and the "
         "runner closes the registries, inproc.rs:190, 199, failing streams and waiting "
         "utility calls, imp.rs:225-226) but its error is the bare 'messagepack decode failed "
         "for ...' (error.rs:22), which does not name the coordinator path. Naming it tells an "
         "operator which socket carried the bad frame")
DEAD_ON_PATH = recommendation(
    py("vllm/v1/engine/coordinator.py:361",
       "outputs: EngineCoreOutputs = decoder.decode(buffer)"),
    rs("rust/src/engine-core-client/src/transport.rs:613",
       "if frame.as_ref() == ENGINE_CORE_DEAD_SENTINEL {"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:190",
       "self.handle_outputs(outputs?).await?;"),
    rs("rust/src/engine-core-client/src/error.rs:39",
       "#[error(\"engine core reported fatal failure\")]"),
    engine("vllm/v1/engine/core.py:2079", "for socket in sockets:"),
    note="corewire's advice, held by neither in full: python's coordinator cannot decode the "
         "sentinel as EngineCoreOutputs (coordinator.py:361), its process ends unwatched and "
         "the client serves on; rust maps the sentinel to EngineCoreDead (transport.rs:613-615) "
         "and fails closed (inproc.rs:190, 199) but words it 'engine core reported fatal "
         "failure' (error.rs:39), naming neither the coordinator path nor ENGINE_CORE_DEAD. A "
         "real engine sends the sentinel only on its main output sockets (core.py:2078-2080); "
         "failing closed on it anywhere keeps a dead engine from going unnoticed")
GATE = both(
    py("vllm/v1/engine/coordinator.py:246", "for _ in self.engines:"),
    py("vllm/v1/engine/coordinator.py:247", 'if publish_back.recv() != b"\\x01":'),
    py("vllm/v1/engine/coordinator.py:254", 'publish_back.send(b"READY")'),
    rs("rust/src/engine-core-client/src/coordinator/bootstrap.rs:45",
       "wait_for_engine_subscriptions(&mut self.input_socket, engine_count, ready_timeout)"),
    rs("rust/src/engine-core-client/src/coordinator/bootstrap.rs:46",
       "send_ready_to_engines(&mut self.input_socket).await?;"),
    rs("rust/src/engine-core-client/src/coordinator/bootstrap.rs:58",
       "while received < engine_count {"),
    engine("vllm/v1/engine/core.py:1984", 'assert coord_socket.recv() == b"READY"'),
)
RESUBSCRIBE = differ(
    py("vllm/v1/engine/coordinator.py:298", "newly started engine subscribed"),
    py("vllm/v1/engine/coordinator.py:305", 'publish_back.send(b"READY")'),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:164",
       "if is_engine_subscription(&message) {"),
    rs("rust/src/engine-core-client/src/coordinator/inproc.rs:171",
       "self.broadcast_start_wave(state.current_wave, None).await?;"),
    engine("vllm/v1/engine/core.py:1995", 'if type_frame.buffer == b"READY":'),
    note="python's coordinator answers every later subscription with READY again "
         "(coordinator.py:297-305, meant for elastic-EP engines started later); rust's "
         "in-process coordinator sends no second READY and instead replays a running wave as "
         "START_DP_WAVE (wave, None) (inproc.rs:164-171). Engines ignore a READY after "
         "startup (core.py:1995), so both keep working")
GEN = [Capability.GENERATE]


# ---------------------------------------------------------------- load over the coordinator

def _load_table(name: str, loads: list[tuple[int, int]], idle: int, count: int
                ) -> dict[str, object]:
    """One load_routes case: per-engine (waiting, running) reported to the coordinator, the
    least-loaded engine, and how many unpinned requests are sent one after the other."""
    return {"name": name, "loads": loads, "idle": idle, "count": count, "n": len(loads),
            "sent": ("two unpinned requests sent one after the other both go" if count == 2
                     else "an unpinned request goes")}


LOADS = [
    _load_table("waiting_2_engines", [(4, 0), (0, 0)], 1, 2),
    _load_table("running_2_engines", [(0, 4), (0, 0)], 1, 2),
    _load_table("mixed_3_engines", [(2, 3), (0, 1), (0, 4)], 1, 2),
    _load_table("running_4_engines", [(0, 6), (0, 5), (0, 7), (0, 2)], 3, 2),
    # Near ties: one unit apart, the lighter engine (the last) has nothing of the other
    # kind. One request only: Python counts its own routed request as +1 waiting until the
    # coordinator's next publication, which makes a second request a tie (core_client.py:
    # 1800-1806).
    _load_table("near_tie_waiting", [(2, 0), (0, 1)], 1, 1),
    _load_table("near_tie_running", [(0, 2), (1, 0)], 1, 1),
]


@case("dp.coordinator.load_routes_{name}", Level.SHOULD,
      "With {n} engines reporting (waiting, running) = {loads} to the frontend's "
      "own DP coordinator (stats-only messages), {sent} to engine {idle}, the "
      "least loaded (waiting and "
      "running both count; Python routes by the coordinator's counts, Rust's "
      "in-process coordinator ignores them).", grounds=LOAD, needs=GEN, params=LOADS)
async def load_routes(ctx: CaseContext, n: int, loads: list[tuple[int, int]], idle: int,
                      count: int) -> None:
    group = await ctx.start(n, coordinated=True)
    for each, (waiting, running) in zip(group.engines, loads, strict=True):
        each.coordinator_stats(waiting=waiting, running=running)
    await ctx.quiet(0.5)  # the coordinator applies (and publishes) the counts
    at = [await routed_engine(ctx, group, 600 + 10 * n + i) for i in range(count)]
    # Without the counts every engine ties and a rotating (or rank-0-first)
    # tie-break cannot put the requests at engine `idle` for every load table.
    ctx.require(at == [idle] * count,
                expected=f"every request at engine {idle} (reported load {loads})",
                observed=f"at engines {at}")


# ---------------------------------------------------------------- a miswired coordinator path

def _request_output(engine: int, rid: str) -> messages.EngineCoreOutputs:
    return messages.EngineCoreOutputs(engine, [messages.EngineCoreOutput(rid, [5])])


def _utility_reply(engine: int, rid: str) -> messages.EngineCoreOutputs:
    return messages.EngineCoreOutputs(
        engine, utility_output=messages.UtilityOutput(987654, "stray reply"))


def _finished_ids(engine: int, rid: str) -> messages.EngineCoreOutputs:
    return messages.EngineCoreOutputs(engine, finished_requests=[rid])


MISWIRED_KINDS = {"request_output": _request_output, "utility_reply": _utility_reply,
                  "finished_requests": _finished_ids}
FAIL_CLOSED = [Capability.GENERATE, Capability.DP_RANK, Capability.REQUEST_ERRORS]


async def _open_stream(ctx: CaseContext, group: EngineGroup, seed: int) -> StreamHandle:
    handle = await ctx.driver.generate(prompt(seed), 50, data_parallel_rank=0)
    await handle.wait_first(ctx.t(3))
    return handle


def _engine_pattern(rank: int) -> str:
    """A regular expression for 'engine 1', 'engine_index: 1', 'engine index=1' ... (each
    frontend words it its way)."""
    return rf"engine[ _]?(index)?\W{{0,3}}{rank}\b"


async def _require_failed_closed(ctx: CaseContext, handle: StreamHandle, what: str,
                                 cause: tuple[str, ...]) -> None:
    """The open stream ends with an error naming the coordinator path and every `cause`
    (regular expressions, case-insensitive)."""
    ended = await ctx.wait_until(lambda: handle.ended, 3)
    ctx.require(ended and handle.finish_reason == "error",
                expected=f"the open stream ends with an error after {what}",
                observed=("still open" if not ended
                          else f"{handle.finish_reason} error={handle.error}"))
    text = handle.error or ""
    missing = [word for word in ("coordinator", *cause)
               if not re.search(word, text, re.IGNORECASE)]
    ctx.require(not missing,
                expected=f"the stream's error says why: it matches 'coordinator' and "
                         f"{' and '.join(repr(c) for c in cause)} (vllm-rs: 'received "
                         "non-control output on coordinator path: <the message>')",
                observed=f"error {handle.error!r} lacks {missing}")


@case("dp.coordinator.{kind}_on_coordinator_path_from_engine_{sender}_fails_closed",
      Level.SHOULD,
      "With 2 engines, engine {sender} sending a {what} to "
      "the frontend's DP coordinator (which only takes stats and wave control) "
      "should make the client fail closed: the open stream ends with an error "
      "that names the coordinator path and engine {sender}, and a later "
      "request is refused.",
      grounds=MISWIRED, needs=FAIL_CLOSED,
      params=[{"kind": kind, "sender": sender, "what": kind.replace("_", " ")}
              | ({"grounds": MISWIRED_FINISHED} if kind == "finished_requests" else {})
              for kind in MISWIRED_KINDS for sender in (0, 1)])
async def miswired(ctx: CaseContext, kind: str, sender: int) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())])
                             for _ in range(2)], coordinated=True)
    handle = await _open_stream(ctx, group, 650)
    found = request_for(group, prompt(650))
    rid = found[1] if found else "unknown"
    group[sender].send_coordinator(MISWIRED_KINDS[kind](sender, rid))
    await _require_failed_closed(ctx, handle, f"a {kind} on the coordinator path",
                                 (_engine_pattern(sender),))
    await require_refused_later(ctx, 699, rank=1)


@case("dp.coordinator.{label}_on_coordinator_path_fails_closed", Level.SHOULD,
      "With 2 engines, {sent} "
      "PUSHed to the frontend's DP coordinator should make the client fail closed: "
      "the open stream ends with an error naming the coordinator path and "
      "{named}, a "
      "pending utility call fails at once, and a later request is refused.",
      needs=[*FAIL_CLOSED, Capability.IS_SLEEPING],
      params=[{"raw": b"\xc1 not msgpack", "cause": "decod", "label": "undecodable",
               "sent": "an undecodable message", "named": "the decode failure",
               "grounds": UNDECODABLE},
              {"raw": b"ENGINE_CORE_DEAD", "cause": "engine_core_dead",
               "label": "engine_core_dead", "sent": "the ENGINE_CORE_DEAD sentinel",
               "named": "ENGINE_CORE_DEAD", "grounds": DEAD_ON_PATH}])
async def raw_on_path(ctx: CaseContext, raw: bytes, cause: str, label: str) -> None:
    silent = {"is_sleeping": UtilityReply(never=True)}
    group = await ctx.start([EngineScript(rules=[any_request(hold())],
                                          utilities=silent) for _ in range(2)],
                            coordinated=True)
    handle = await _open_stream(ctx, group, 660)
    call = asyncio.ensure_future(ctx.driver.is_sleeping())
    await ctx.quiet(0.2)  # the call is out, both engines swallow it
    group[1].send_coordinator_raw([raw])
    await _require_failed_closed(ctx, handle, f"{label} on the coordinator path", (cause,))
    done, _ = await asyncio.wait([call], timeout=ctx.t(1.0))
    if not done:
        call.cancel()
    error = call.exception() if done else None
    ctx.require(done and error is not None
                and "coordinator" in str(error).lower(),
                expected="the pending is_sleeping call fails within 1 s with the "
                         "coordinator failure as its cause (not its own timeout)",
                observed=("still pending after 1 s" if not done
                          else f"{type(error).__name__}: {error}"
                          if error else f"answered {call.result()!r}"))
    await require_refused_later(ctx, 699, rank=1)


# ---------------------------------------------------------------- the startup gate

@case("dp.coordinator.ready_waits_for_every_subscription_{n}_engines_slow_{slow}",
      Level.MUST,
      "With {n} engines where engine {slow} subscribes to the coordinator late, "
      "the coordinator publishes READY only after every engine subscribed: no "
      "engine receives READY before engine {slow}'s subscription was sent.",
      grounds=GATE, needs=GEN,
      params=[{"n": n, "slow": slow} for n, slow in ((2, 1), (3, 0), (3, 2))])
async def ready_waits(ctx: CaseContext, n: int, slow: int) -> None:
    scripts = [EngineScript(coordinator_subscribe_delay=ctx.t(0.6) if i == slow
                            else 0.0) for i in range(n)]
    group = await ctx.start(scripts, coordinated=True)
    records = group.transcript.select(channel="coordinator")
    subscribed = [r.t for r in records
                  if r.rank == slow and r.direction == "out"
                  and r.note == "subscription"]
    ready: dict[int, float] = {}  # each engine's first READY
    for r in records:
        if r.direction == "in" and r.note == "READY":
            ready.setdefault(r.rank, r.t)
    early = sorted(rank for rank, t in ready.items()
                   if subscribed and t < subscribed[0])
    ctx.require(bool(subscribed) and len(ready) == n and not early,
                expected=f"READY at all {n} engines, none before engine {slow} "
                         "subscribed",
                observed=f"READY at {sorted(ready)}; before the late subscription: "
                         f"{early}")


@case("dp.coordinator.late_subscription_gets_ready_again", Level.SHOULD,
      "After startup, an engine subscribing to the coordinator again (its connection was "
      "re-established) should get READY again, and the coordinator keeps working: a later "
      "start_wave(3) from engine 1 is rebroadcast as START_DP_WAVE (3, 1).",
      grounds=RESUBSCRIBE, needs=GEN)
async def late_subscription(ctx: CaseContext) -> None:
    group = await ctx.start(2, coordinated=True)

    def readies(rank: int) -> int:
        return sum(1 for r in group.transcript.select(rank=rank, direction="in",
                                                      channel="coordinator")
                   if r.note == "READY")

    before = readies(0)
    group[0].coordinator_resubscribe()
    again = await ctx.wait_until(lambda: readies(0) > before, 2)
    ctx.require(again, expected="a second READY at engine 0 after its new subscription",
                observed=f"{readies(0)} READY in all")
    group[1].start_wave(3)
    waves = await ctx.wait_until(lambda: all(
        (w.wave, w.exclude_engine_index) == (3, 1)
        for e in group.engines for w in group.transcript.start_dp_waves(e.rank))
        and all(group.transcript.start_dp_waves(e.rank) for e in group.engines), 3)
    ctx.require(waves, expected="START_DP_WAVE (3, 1) at both engines afterwards",
                observed={e.rank: [(w.wave, w.exclude_engine_index)
                                   for w in group.transcript.start_dp_waves(e.rank)]
                          for e in group.engines})
