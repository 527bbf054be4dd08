"""Mock engines: the sans-IO core (scripts, timing, utilities, aborts) and the socket layer.

The core is driven with explicit `now` values, so timing behaviour is tested without sleeping.
The socket tests run real `EngineGroup`s over ipc against a test-owned ROUTER + PULL (the
frontend's side) or a launcher ROUTER (handshake mode); every wait is a bounded poll.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import zmq

from harness.protocol.lifecycle import Event, Phase
from harness.protocol.transport.endpoints import PrivateIpcDir
from harness.protocol.transport.sockets import engine_identity, make_socket
from harness.protocol.wire import DEFAULT_CODEC, EngineDead, EngineOutput, ProtocolError
from harness.protocol.wire import messages as m
from mock_engines import (
    Die,
    Emit,
    EngineGroup,
    EngineScript,
    Finish,
    Garbage,
    MockEngineCore,
    UtilityReply,
    any_request,
    by_id,
    by_index,
    by_prompt,
    default_ready,
    stream,
)
from mock_engines.engine import ALL_CLIENTS, Outgoing

C = DEFAULT_CODEC
T0 = 1000.0

# --------------------------------------------------------------------------- helpers


def request(rid: str, prompt: list[int] | None = None, *, max_tokens: int = 3,
            client_index: int = 0, **kw: object) -> m.EngineCoreRequest:
    params = m.SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return m.EngineCoreRequest(rid, prompt if prompt is not None else [1, 2], None, params,
                               None, 1.0, None, None, None, client_index=client_index,
                               **kw)  # type: ignore[arg-type]


def add(core: MockEngineCore, req: m.EngineCoreRequest, now: float = T0) -> None:
    core.receive(C.encode_add(req), now)


def decoded(items: list[Outgoing]) -> list[tuple[int, EngineOutput]]:
    return [(o.client_index, C.decode_outputs(o.frames)) for o in items]


def outputs_of(items: list[Outgoing]) -> list[m.EngineCoreOutputs]:
    return [msg for _, msg in decoded(items) if isinstance(msg, m.EngineCoreOutputs)]


def deltas(items: list[Outgoing]) -> list[tuple[str, list[int], m.FinishReason | None]]:
    return [(o.request_id, o.new_token_ids, o.finish_reason)
            for msg in outputs_of(items) for o in msg.outputs]


def run_until_idle(core: MockEngineCore, now: float, limit: int = 100) -> list[Outgoing]:
    out: list[Outgoing] = []
    for _ in range(limit):
        items = core.poll(now)
        if not items:
            return out
        out.extend(items)
    raise AssertionError("engine did not go idle")


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Bounded poll of a condition another thread makes true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)
    return True


# --------------------------------------------------------------------------- sans-IO core


def test_default_script_streams_max_tokens_then_length() -> None:
    core = MockEngineCore(3, codec=DEFAULT_CODEC)
    add(core, request("r", max_tokens=3))
    assert core.counts() == (0, 1)
    steps = [core.poll(T0) for _ in range(3)]
    assert [deltas(s) for s in steps] == [
        [("r", [100], None)], [("r", [101], None)], [("r", [102], m.FinishReason.LENGTH)]]
    first = outputs_of(steps[0])[0]
    assert (first.engine_index, first.timestamp, first.weight_version) == (3, T0, "default")
    assert core.poll(T0) == [] and core.counts() == (0, 0)
    assert core.phase_of("r") is Phase.FINISHED and core.next_deadline() is None


@pytest.mark.parametrize("max_model_len", [None, 40])
def test_unscripted_max_tokens_is_capped_at_the_model_length(max_model_len: int | None) -> None:
    """One ADD asking for 10**9 tokens cannot exhaust the harness: the engine builds at most
    max_model_len - len(prompt) steps and finishes LENGTH, as vLLM's scheduler caps it."""
    ready = None if max_model_len is None else default_ready(0, max_model_len=max_model_len)
    limit = max_model_len or 1024
    script = EngineScript(ready=ready)
    steps = script.steps_for(request("r", max_tokens=10**9), 0)
    prompt = len(request("r").prompt_token_ids or ())
    assert len(steps) == limit - prompt
    assert isinstance(steps[-1], Finish) and steps[-1].reason is m.FinishReason.LENGTH
    assert len(script.steps_for(request("s", max_tokens=5), 1)) == 5


def test_rules_by_prompt_index_and_id_first_match_wins() -> None:
    script = EngineScript(rules=[
        by_id("special", [Finish(m.FinishReason.STOP, [9], stop_reason=9)]),
        by_prompt([7, 7], [Emit([70]), Finish(m.FinishReason.STOP, [2])]),
        by_index(2, [Finish(m.FinishReason.LENGTH, [42])]),
        any_request([Finish(m.FinishReason.LENGTH, [1])]),
    ])
    core = MockEngineCore(0, script, codec=DEFAULT_CODEC)
    add(core, request("a", [7, 7]))  # index 0: prompt rule
    add(core, request("special", [7, 7]))  # index 1: id rule listed first wins
    add(core, request("c", [5]))  # index 2: index rule
    add(core, request("d", [5]))  # index 3: catch-all
    got = deltas(run_until_idle(core, T0))
    assert ("a", [70], None) in got and ("a", [2], m.FinishReason.STOP) in got
    assert ("special", [9], m.FinishReason.STOP) in got
    assert ("c", [42], m.FinishReason.LENGTH) in got
    assert ("d", [1], m.FinishReason.LENGTH) in got
    stop = [o for msg in outputs_of(run_until_idle(core, T0)) for o in msg.outputs]
    assert stop == []


def test_step_factory_and_stream_helper() -> None:
    script = EngineScript(rules=[any_request(lambda r: stream(r.prompt_token_ids or []))])
    core = MockEngineCore(0, script, codec=DEFAULT_CODEC)
    add(core, request("r", [4, 5, 6]))
    got = deltas(run_until_idle(core, T0))
    assert got == [("r", [4], None), ("r", [5], None), ("r", [6], m.FinishReason.LENGTH)]


def test_one_step_per_request_per_poll_batched_per_client() -> None:
    core = MockEngineCore(0, EngineScript(rules=[any_request(stream([1, 2]))]), codec=DEFAULT_CODEC)
    add(core, request("a"))
    add(core, request("b"))
    add(core, request("c", client_index=1))
    first = decoded(core.poll(T0))
    assert [(client, [o.request_id for o in msg.outputs]) for client, msg in first
            if isinstance(msg, m.EngineCoreOutputs)] == [(0, ["a", "b"]), (1, ["c"])]


def test_delays_follow_explicit_now() -> None:
    script = EngineScript(rules=[any_request([Emit([1], delay=0.5), Emit([2], delay=0.25),
                                              Finish(m.FinishReason.STOP, [3], delay=1.0)])])
    core = MockEngineCore(0, script, codec=DEFAULT_CODEC)
    add(core, request("r"), now=T0)
    assert core.next_deadline() == T0 + 0.5
    assert core.poll(T0) == [] and core.poll(T0 + 0.49) == []
    assert deltas(core.poll(T0 + 0.5)) == [("r", [1], None)]
    assert core.next_deadline() == T0 + 0.75
    assert deltas(core.poll(T0 + 0.75)) == [("r", [2], None)]
    assert core.poll(T0 + 1.7) == []
    assert deltas(core.poll(T0 + 1.75)) == [("r", [3], m.FinishReason.STOP)]
    assert core.next_deadline() is None


def test_late_poll_emits_one_step_only() -> None:
    core = MockEngineCore(0, EngineScript(rules=[any_request(stream([1, 2, 3], 0.1))]),
            codec=DEFAULT_CODEC)
    add(core, request("r"))
    # Far past every deadline: still one step per poll, as a real engine schedules.
    assert deltas(core.poll(T0 + 10)) == [("r", [1], None)]
    assert core.next_deadline() is not None and core.next_deadline() <= T0 + 10  # type: ignore[operator]


def test_finish_carries_error_kv_params_and_stop_reason() -> None:
    err = m.RequestError("engine_paused", "paused", True)
    script = EngineScript(rules=[
        by_id("e", [Finish(m.FinishReason.ERROR, error=err)]),
        by_id("k", [Finish(m.FinishReason.STOP, [2], stop_reason=2,
                           kv_transfer_params={"do_remote_decode": True})]),
    ])
    core = MockEngineCore(0, script, codec=DEFAULT_CODEC)
    add(core, request("e"))
    add(core, request("k"))
    outs = {o.request_id: o for msg in outputs_of(core.poll(T0)) for o in msg.outputs}
    assert outs["e"].finish_reason is m.FinishReason.ERROR and outs["e"].error == err
    assert outs["e"].new_token_ids == []
    assert outs["k"].stop_reason == 2
    assert outs["k"].kv_transfer_params == {"do_remote_decode": True}


def test_die_sends_dead_to_all_clients_and_goes_silent() -> None:
    script = EngineScript(rules=[any_request([Emit([1]), Die(delay=0.1)])])
    core = MockEngineCore(0, script, codec=DEFAULT_CODEC)
    add(core, request("r"))
    assert deltas(core.poll(T0)) == [("r", [1], None)]
    items = core.poll(T0 + 0.1)
    assert [(o.client_index, C.decode_outputs(o.frames)) for o in items] == [
        (ALL_CLIENTS, EngineDead())]
    assert core.dead and core.next_deadline() is None
    add(core, request("later"), now=T0 + 1)
    core.receive(C.encode_utility(0, 1, "is_sleeping", []), T0 + 1)
    assert core.poll(T0 + 2) == []
    assert len(core.transcript.adds()) == 2  # still recorded


def test_garbage_step_is_sent_and_recorded_then_stream_continues() -> None:
    script = EngineScript(rules=[any_request([Garbage((b"\xc1junk", b"x")),
                                              Finish(m.FinishReason.LENGTH, [5])])])
    core = MockEngineCore(0, script, codec=DEFAULT_CODEC)
    add(core, request("r", client_index=1))
    items = core.poll(T0)
    assert [(o.client_index, o.frames) for o in items] == [(1, [b"\xc1junk", b"x"])]
    with pytest.raises(ProtocolError):
        C.decode_outputs(items[0].frames)
    faults = core.transcript.select(channel="fault")
    assert len(faults) == 1 and faults[0].frames == (b"\xc1junk", b"x")
    assert deltas(core.poll(T0)) == [("r", [5], m.FinishReason.LENGTH)]


def test_inject_dead_and_garbage() -> None:
    core = MockEngineCore(0, codec=DEFAULT_CODEC)
    core.inject_garbage(T0, [b"\x00"], client_index=2)
    assert core.next_deadline() == 0.0
    assert [(o.client_index, o.frames) for o in core.poll(T0)] == [(2, [b"\x00"])]
    core.inject_dead(T0)
    core.inject_dead(T0)  # idempotent
    items = core.poll(T0)
    assert len(items) == 1 and items[0].frames == [b"ENGINE_CORE_DEAD"]
    assert core.dead


def test_utility_replies_value_failure_delay_never_and_unscripted() -> None:
    script = EngineScript(utilities={
        "get_weight_version": UtilityReply("v7"),
        "sleep": UtilityReply(failure="Call to sleep method failed: no"),
        "wake_up": UtilityReply(True, delay=2.0),
        "pause_generation": UtilityReply(never=True),
    })
    core = MockEngineCore(1, script, codec=DEFAULT_CODEC)
    for call_id, method in enumerate(["is_sleeping", "get_weight_version", "sleep", "wake_up",
                                      "pause_generation", "frobnicate"]):
        core.receive(C.encode_utility(1, call_id, method, []), T0)
    now_items = decoded(core.poll(T0))
    assert all(client == 1 for client, _ in now_items)
    replies = {msg.utility_output.call_id: msg.utility_output for _, msg in now_items
               if isinstance(msg, m.EngineCoreOutputs) and msg.utility_output is not None}
    assert replies[0] == m.UtilityOutput(0, None, m.UtilityResult(None, False))
    assert replies[1].result == m.UtilityResult(None, "v7")
    assert replies[2] == m.UtilityOutput(2, "Call to sleep method failed: no", None)
    assert replies[5].failure_message is not None and "frobnicate" in replies[5].failure_message
    assert set(replies) == {0, 1, 2, 5}
    assert core.next_deadline() == T0 + 2.0
    assert core.poll(T0 + 1.9) == []
    late = outputs_of(core.poll(T0 + 2.0))
    assert [o.utility_output for o in late] == [m.UtilityOutput(3, None,
                                                                m.UtilityResult(None, True))]
    assert core.poll(T0 + 100) == []  # pause_generation never answers
    assert [r.message.method for r in core.transcript.utility_calls()] == [
        "is_sleeping", "get_weight_version", "sleep", "wake_up", "pause_generation",
        "frobnicate"]


def test_utility_result_none_keeps_wrapper() -> None:
    core = MockEngineCore(0, codec=DEFAULT_CODEC)
    core.receive(C.encode_utility(0, 9, "reset_mm_cache", []), T0)
    (msg,) = outputs_of(core.poll(T0))
    assert msg.utility_output == m.UtilityOutput(9, None, m.UtilityResult(None, None))
    assert C.encode_outputs(msg)[0].endswith(bytes.fromhex("9309c092c0c0c0c0c0c0"))


def test_abort_live_finished_unknown() -> None:
    script = EngineScript(rules=[by_id("done", [Finish(m.FinishReason.LENGTH, [1])])],
                          default=lambda _r: stream(list(range(50))))
    core = MockEngineCore(0, script, codec=DEFAULT_CODEC)
    add(core, request("live"))
    add(core, request("done"))
    core.poll(T0)
    assert core.counts() == (0, 1)
    core.receive(C.encode_abort(["live", "done", "nobody"]), T0)
    assert core.ids_in(Phase.ABORTED) == {"live"}  # only the live one was removed
    assert core.ids_in(Phase.FINISHED) == {"done"}
    assert [(e.phase, e.event, e.request_id) for e in core.refused] == [
        (Phase.FINISHED, Event.ABORT, "done"), (Phase.NEW, Event.ABORT, "nobody")]
    assert core.counts() == (0, 0)
    assert run_until_idle(core, T0 + 1) == []  # an abort produces no output
    assert core.transcript.aborted_ids() == ["live", "done", "nobody"]


def test_report_finished_lists_finished_and_aborted_ids() -> None:
    script = EngineScript(report_finished=True, rules=[
        by_id("quick", [Finish(m.FinishReason.STOP, [2])])],
        default=lambda _r: stream(list(range(50))))
    core = MockEngineCore(0, script, codec=DEFAULT_CODEC)
    add(core, request("quick"))
    add(core, request("slow"))
    add(core, request("other", client_index=1))
    first = decoded(core.poll(T0))
    msgs = {client: msg for client, msg in first if isinstance(msg, m.EngineCoreOutputs)}
    assert msgs[0].finished_requests == ["quick"]
    assert msgs[1].finished_requests is None
    core.receive(C.encode_abort(["other"]), T0)
    # Client 1 has no outputs next step, but still gets a bare finished_requests message.
    second = decoded(core.poll(T0))
    bare = [msg for client, msg in second if client == 1]
    assert len(bare) == 1 and isinstance(bare[0], m.EngineCoreOutputs)
    assert (bare[0].outputs, bare[0].finished_requests) == ([], ["other"])


def test_duplicate_add_and_abort_immediately() -> None:
    core = MockEngineCore(0, EngineScript(default=lambda _r: stream(list(range(10)))),
            codec=DEFAULT_CODEC)
    add(core, request("r"))
    add(core, request("r"))
    add(core, request("gone", abort_immediately=True))
    assert core.counts() == (0, 1)
    assert [r.request_id for r in core.transcript.adds()] == ["r", "r", "gone"]


def test_malformed_input_recorded_engine_keeps_serving() -> None:
    core = MockEngineCore(0, codec=DEFAULT_CODEC)
    core.receive([b"\x09", b"\x90"], T0)
    core.receive([b"\x00", b"\xc1"], T0)
    errors = core.transcript.protocol_errors()
    assert [r.error.kind for r in errors if r.error] == ["request_type", "add_payload"]
    add(core, request("ok", max_tokens=1))
    assert deltas(core.poll(T0)) == [("ok", [100], m.FinishReason.LENGTH)]


def test_ready_payload_default_override_and_raw() -> None:
    default = C.decode_ready(MockEngineCore(2, dp_size=4, codec=DEFAULT_CODEC).ready_payload())
    assert default is not None
    assert (default.data_parallel_rank, default.data_parallel_size) == (2, 4)
    custom = EngineScript(ready=default_ready(0, max_model_len=77, supports_lora=True))
    ready = C.decode_ready(MockEngineCore(0, custom, codec=DEFAULT_CODEC).ready_payload())
    assert ready is not None and (ready.max_model_len, ready.supports_lora) == (77, True)
    assert MockEngineCore(0, EngineScript(ready_payload=b""),
            codec=DEFAULT_CODEC).ready_payload() == b""


def test_transcript_json_view() -> None:
    core = MockEngineCore(0, codec=DEFAULT_CODEC)
    add(core, request("r", max_tokens=1))
    core.receive([b"\x07"], T0)
    core.poll(T0)
    view = core.transcript.to_json()
    assert view[0]["direction"] == "in" and "ADD" in view[0]["decoded"]
    assert view[1]["error"]["kind"] == "frame_count"
    assert view[2]["channel"] == "output" and view[2]["frames_hex"][0].startswith("99")


# --------------------------------------------------------------------------- socket layer


@dataclass
class FrontendSide:
    """What a frontend binds: per client a ROUTER (engine inputs) and a PULL (outputs)."""

    ctx: zmq.Context[zmq.Socket[bytes]]
    ipc: PrivateIpcDir
    routers: list[zmq.Socket[bytes]]
    pulls: list[zmq.Socket[bytes]]
    inputs: list[str]
    outputs: list[str]

    def recv(self, sock: zmq.Socket[bytes], timeout: float = 5.0) -> list[bytes] | None:
        if not sock.poll(int(timeout * 1000)):
            return None
        return sock.recv_multipart()

    def ready(self, client: int = 0, timeout: float = 5.0) -> tuple[bytes, bytes]:
        frames = self.recv(self.routers[client], timeout)
        assert frames is not None and len(frames) == 2, f"no ready frame: {frames}"
        return frames[0], frames[1]

    def send(self, identity: bytes, frames: list[bytes], client: int = 0) -> None:
        self.routers[client].send_multipart([identity, *frames])

    def output(self, client: int = 0, timeout: float = 5.0) -> EngineOutput | None:
        frames = self.recv(self.pulls[client], timeout)
        return None if frames is None else C.decode_outputs(frames)

    def collect(self, rid: str, client: int = 0, timeout: float = 5.0) -> list[int]:
        """Tokens of `rid` until its final output (bounded)."""
        tokens: list[int] = []
        deadline = time.monotonic() + timeout
        while True:
            msg = self.output(client, max(0.0, deadline - time.monotonic()))
            assert isinstance(msg, m.EngineCoreOutputs), f"{rid}: got {msg!r}, tokens {tokens}"
            for out in msg.outputs:
                if out.request_id == rid:
                    tokens.extend(out.new_token_ids)
                    if out.finished:
                        return tokens

    def reply(self, call_id: int, client: int = 0, timeout: float = 5.0) -> m.UtilityOutput:
        deadline = time.monotonic() + timeout
        while True:
            msg = self.output(client, max(0.0, deadline - time.monotonic()))
            assert isinstance(msg, m.EngineCoreOutputs), f"call {call_id}: got {msg!r}"
            if msg.utility_output is not None and msg.utility_output.call_id == call_id:
                return msg.utility_output


def _frontend(clients: int = 1) -> Iterator[FrontendSide]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ipc = PrivateIpcDir()
    side = FrontendSide(ctx, ipc, [], [], [], [])
    try:
        for i in range(clients):
            router, pull = make_socket(ctx, zmq.ROUTER), make_socket(ctx, zmq.PULL)
            side.routers.append(router)
            side.pulls.append(pull)
            side.inputs.append(ipc.address(f"in{i}"))
            side.outputs.append(ipc.address(f"out{i}"))
            router.bind(side.inputs[-1])
            pull.bind(side.outputs[-1])
        yield side
    finally:
        for sock in [*side.routers, *side.pulls]:
            sock.close(0)
        ctx.term()
        ipc.cleanup()


@pytest.fixture
def frontend() -> Iterator[FrontendSide]:
    yield from _frontend(1)


@pytest.fixture
def two_clients() -> Iterator[FrontendSide]:
    yield from _frontend(2)


def _engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate()
            if t.name.startswith(("mock-engine-", "mock-dp-coordinator"))]


def test_bootstrapped_add_and_utility(frontend: FrontendSide) -> None:
    with EngineGroup([EngineScript(rules=[any_request(stream([4, 5, 6]))])],
            codec=DEFAULT_CODEC) as group:
        group.start_bootstrapped(frontend.inputs, frontend.outputs)
        identity, payload = frontend.ready()
        assert identity == engine_identity(0)
        ready = C.decode_ready(payload)
        assert ready is not None and ready.data_parallel_rank == 0
        assert group.wait_registered(5.0)
        frontend.send(identity, C.encode_add(request("r")))
        assert frontend.collect("r") == [4, 5, 6]
        frontend.send(identity, C.encode_utility(0, 77, "is_sleeping", []))
        assert frontend.reply(77) == m.UtilityOutput(77, None, m.UtilityResult(None, False))
        assert [r.request_id for r in group.transcript.adds()] == ["r"]
        assert group.failures() == []


def test_bootstrapped_two_clients_and_two_ranks(two_clients: FrontendSide) -> None:
    fe = two_clients
    with EngineGroup(2, codec=DEFAULT_CODEC) as group:
        group.start_bootstrapped(fe.inputs, fe.outputs)
        for client in (0, 1):
            idents = {fe.ready(client)[0], fe.ready(client)[0]}
            assert idents == {engine_identity(0), engine_identity(1)}
        fe.send(engine_identity(1), C.encode_add(request("x", client_index=1, max_tokens=2)),
                client=1)
        assert fe.collect("x", client=1) == [100, 101]
        assert group.transcript.owner_of("x") == 1
        assert fe.output(client=0, timeout=0.05) is None  # nothing for client 0


def test_handshake_mode(frontend: FrontendSide) -> None:
    ctx = frontend.ctx
    launcher = make_socket(ctx, zmq.ROUTER)
    hs_addr = frontend.ipc.address("hs")
    launcher.bind(hs_addr)
    try:
        with EngineGroup(1, codec=DEFAULT_CODEC) as group:
            group.start_handshake(hs_addr, local=True, headless=False, timeout=5.0)
            hello = frontend.recv(launcher)
            assert hello is not None and hello[0] == engine_identity(0)
            status = C.decode_handshake_status(hello[1])
            assert (status.status, status.local, status.headless) == ("HELLO", True, False)
            init = m.EngineHandshakeMetadata(
                m.EngineZmqAddresses(frontend.inputs, frontend.outputs), {})
            launcher.send_multipart([hello[0], C.encode_init(init)])
            identity, payload = frontend.ready()
            assert identity == engine_identity(0) and C.decode_ready(payload) is not None
            ready = frontend.recv(launcher)
            assert ready is not None
            assert C.decode_handshake_status(ready[1]).status == "READY"
            frontend.send(identity, C.encode_add(request("h", max_tokens=1)))
            assert frontend.collect("h") == [100]
            notes = [r.note for r in group.transcript.select(channel="handshake")]
            assert notes == ["HELLO", "INIT", "READY"]
    finally:
        launcher.close(0)


def test_handshake_timeout_is_a_recorded_failure(frontend: FrontendSide) -> None:
    launcher = make_socket(frontend.ctx, zmq.ROUTER)
    hs_addr = frontend.ipc.address("hs")
    launcher.bind(hs_addr)
    try:
        with EngineGroup(1, codec=DEFAULT_CODEC) as group:
            group.start_handshake(hs_addr, timeout=0.2)
            assert frontend.recv(launcher) is not None  # HELLO, never answered
            assert wait_until(lambda: bool(group.failures()))
            (rank, exc), = group.failures()
            assert rank == 0 and isinstance(exc, TimeoutError)
    finally:
        launcher.close(0)


def test_unregistered_engine(frontend: FrontendSide) -> None:
    with EngineGroup([EngineScript(register=False)], codec=DEFAULT_CODEC) as group:
        group.start_bootstrapped(frontend.inputs, frontend.outputs)
        assert group.wait_registered(1.0)  # nothing scripted to register
        assert frontend.recv(frontend.routers[0], timeout=0.1) is None


def test_coordinator_publishes_stats(frontend: FrontendSide) -> None:
    addr = frontend.ipc.address("stats")
    sub = make_socket(frontend.ctx, zmq.SUB)
    try:
        with EngineGroup(2, coordinator_address=addr, codec=DEFAULT_CODEC) as group:
            group.start_bootstrapped(frontend.inputs, frontend.outputs)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(addr)
            frame = frontend.recv(sub)
            assert frame is not None
            stats = C.decode_dp_stats(frame[0])
            assert stats.counts == [(0, 0, 0.0), (0, 0, 0.0)] and stats.current_wave == 0
            assert group.stats_address == addr
    finally:
        sub.close(0)


def test_fault_send_dead_and_garbage(frontend: FrontendSide) -> None:
    with EngineGroup(1, codec=DEFAULT_CODEC) as group:
        group.start_bootstrapped(frontend.inputs, frontend.outputs)
        frontend.ready()
        group[0].send_garbage([b"\xc1", b"two"])
        frames = frontend.recv(frontend.pulls[0])
        assert frames == [b"\xc1", b"two"]
        group[0].send_dead()
        assert frontend.output() == EngineDead()
        notes = [r.note for r in group.transcript.select(direction="out")]
        assert "injected garbage frame" in notes and "ENGINE_CORE_DEAD" in notes


def test_fault_stop_and_resume_reading(frontend: FrontendSide) -> None:
    with EngineGroup(1, codec=DEFAULT_CODEC) as group:
        group.start_bootstrapped(frontend.inputs, frontend.outputs)
        identity, _ = frontend.ready()
        group[0].stop_reading()
        assert wait_until(lambda: any(r.note == "stop reading input"
                                      for r in group.transcript.select(channel="fault")))
        frontend.send(identity, C.encode_add(request("queued", max_tokens=1)))
        assert frontend.output(timeout=0.2) is None  # not read while stopped
        assert group.transcript.adds() == []
        group[0].resume_reading()
        # The poller wakes on the already-queued input once reading resumes.
        assert frontend.collect("queued") == [100]


def test_fault_close_sockets(frontend: FrontendSide) -> None:
    with EngineGroup(1, codec=DEFAULT_CODEC) as group:
        group.start_bootstrapped(frontend.inputs, frontend.outputs)
        identity, _ = frontend.ready()
        group[0].close_sockets()
        assert wait_until(lambda: any(r.note == "close sockets"
                                      for r in group.transcript.select(channel="fault")))
        frontend.send(identity, C.encode_add(request("lost", max_tokens=1)))
        assert frontend.output(timeout=0.2) is None
        runner = group[0].runner
        assert runner is not None and runner.alive  # thread keeps running, silently


def test_fault_exit(frontend: FrontendSide) -> None:
    with EngineGroup(1, codec=DEFAULT_CODEC) as group:
        group.start_bootstrapped(frontend.inputs, frontend.outputs)
        frontend.ready()
        group[0].exit()
        runner = group[0].runner
        assert runner is not None
        assert wait_until(lambda: not runner.alive)
        assert any(r.note == "exit" for r in group.transcript.select(channel="fault"))
        assert group.failures() == []


def test_scripted_die_over_sockets_reaches_every_client(two_clients: FrontendSide) -> None:
    fe = two_clients
    script = EngineScript(rules=[any_request([Emit([1]), Die()])])
    with EngineGroup([script], codec=DEFAULT_CODEC) as group:
        group.start_bootstrapped(fe.inputs, fe.outputs)
        identity, _ = fe.ready(0)
        fe.ready(1)
        fe.send(identity, C.encode_add(request("d")))
        first = fe.output(0)
        assert isinstance(first, m.EngineCoreOutputs) and first.outputs[0].new_token_ids == [1]
        assert fe.output(0) == EngineDead()
        assert fe.output(1) == EngineDead()


def test_stop_leaves_no_threads_and_tmp_dir_removable() -> None:
    before = set(_engine_threads())
    ipc = PrivateIpcDir()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router, pull = make_socket(ctx, zmq.ROUTER), make_socket(ctx, zmq.PULL)
    try:
        inputs, outputs = [ipc.address("in")], [ipc.address("out")]
        router.bind(inputs[0])
        pull.bind(outputs[0])
        group = EngineGroup(4, coordinator_address=ipc.address("stats"), codec=DEFAULT_CODEC)
        group.start_bootstrapped(inputs, outputs)
        assert group.wait_registered(5.0)
        assert len(set(_engine_threads()) - before) == 5  # 4 engines + coordinator
        group.stop(timeout=5.0)  # raises TimeoutError if a thread outlives the bound
        assert set(_engine_threads()) - before == set()
        assert group.ctx.closed
        group.stop()  # idempotent
    finally:
        router.close(0)
        pull.close(0)
        ctx.term()
    try:
        shutil.rmtree(ipc.path)  # strict: raises if anything is left that cannot be removed
    finally:
        ipc.cleanup()
    assert not os.path.exists(ipc.path)


def test_coordinator_binds_without_waiting_on_its_thread(frontend: FrontendSide) -> None:
    """Hazard: start() blocked its caller (a driver on the event loop) until the publishing
    thread had bound. Now the caller binds; here the thread is held back and start() still
    returns with the address bound (a second bind of it fails)."""
    addr = frontend.ipc.address("stats")
    with EngineGroup(2, coordinator_address=addr, codec=DEFAULT_CODEC) as group:
        coordinator = group.coordinator
        assert coordinator is not None
        release = threading.Event()
        held = threading.Thread(target=release.wait, args=(10.0,), daemon=True)
        real_thread, coordinator._thread = coordinator._thread, held
        try:
            coordinator.start()
            assert coordinator._sock is not None
            probe = make_socket(frontend.ctx, zmq.SUB)
            try:  # the subscription reaches the bound XPUB although no thread serves it
                probe.setsockopt(zmq.SUBSCRIBE, b"")
                probe.connect(addr)
                assert coordinator._sock.poll(5000) == zmq.POLLIN
            finally:
                probe.close(0)
        finally:
            release.set()
            held.join(5.0)
            coordinator._thread = real_thread
            if coordinator._sock is not None:
                coordinator._sock.close(0)


def test_coordinator_never_reads_an_engine_core_from_its_own_thread(
        frontend: FrontendSide, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hazard: the coordinator thread called MockEngineCore.counts(), which reads the live
    requests only the engine's own thread may touch. Now it reads the runner's snapshot."""
    callers: set[str] = set()
    real_live_count = MockEngineCore.live_count

    def counting(core: MockEngineCore) -> int:
        callers.add(threading.current_thread().name)
        return real_live_count(core)

    monkeypatch.setattr(MockEngineCore, "live_count", counting)
    addr = frontend.ipc.address("stats")
    sub = make_socket(frontend.ctx, zmq.SUB)
    try:
        with EngineGroup(2, coordinator_address=addr, codec=DEFAULT_CODEC) as group:
            group.start_bootstrapped(frontend.inputs, frontend.outputs)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(addr)
            for _ in range(3):  # several publications
                assert frontend.recv(sub) is not None
    finally:
        sub.close(0)
    assert callers, "live_count() was never called"
    assert not any(name.startswith("mock-dp-coordinator") for name in callers), callers
