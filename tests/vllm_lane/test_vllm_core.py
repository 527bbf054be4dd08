"""The vLLM-core engine: vLLM 0.33.0's real engine core (cpu-stub) behind our reference frontend.

These tests check the adapter, not vLLM: the engine registers through the recording proxy,
streams, answers utilities, honours a client abort, shows up in the transcript exactly like
a mock engine would, does vLLM's real handshake through the proxy, and is reaped. The GPU
mode is exercised only on a CUDA machine; elsewhere it is skipped with the exact reason
`EngineUnavailable` gives, never faked.

vLLM is imported once, in the engine server (a child process), not in the test process.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
import zmq

from harness.frontends.reference import ReferenceDriver
from harness.protocol.transport.endpoints import PrivateIpcDir
from harness.protocol.transport.sockets import engine_identity, make_socket
from harness.protocol.wire import DEFAULT_CODEC, AbortRequests, AddRequest
from harness.protocol.wire import messages as m
from harness.vllm_engine import (
    EngineUnavailable,
    VllmCoreError,
    VllmCoreGroup,
    check_available,
    shutdown_servers,
)
from harness.vllm_engine.engine_server import SERVER_START_TIMEOUT, engine_server
from tests.timescale import TIMESCALE, scaled

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(SERVER_START_TIMEOUT + 60)]

C = DEFAULT_CODEC
START_TIMEOUT = scaled(30.0)
STEP_DELAY = 0.01  # fake forward pass: streams take visible time, aborts land mid-stream
Body = Callable[[ReferenceDriver, VllmCoreGroup], Awaitable[None]]


@pytest.fixture(scope="module", autouse=True)
def cpu_server(request: pytest.FixtureRequest) -> Iterator[None]:
    """Import vLLM once, in the engine server, before any test's own clock starts.

    The server lives for the session (other modules reuse it); it is shut down by a session
    finalizer, which runs before the session's leak check.
    """
    request.session.addfinalizer(shutdown_servers)
    try:
        engine_server("cpu-stub").wait_ready(SERVER_START_TIMEOUT)
    except VllmCoreError as exc:
        if "ImportError" in str(exc) or "ModuleNotFoundError" in str(exc):
            pytest.skip(f"vllm is installed but not importable in the engine server: {exc}")
        raise
    yield


def run(body: Body, *, step_delay_s: float = STEP_DELAY, log_stats: bool = True) -> None:
    """Reference frontend + vLLM-core engine; `body` runs bounded; both always torn down."""

    async def main() -> None:
        group = VllmCoreGroup(step_delay_s=step_delay_s, log_stats=log_stats, codec=DEFAULT_CODEC)
        driver = ReferenceDriver().with_timescale(TIMESCALE)
        try:
            await driver.start(group, START_TIMEOUT)
            await asyncio.wait_for(body(driver, group), 30)
        finally:
            await driver.shutdown()
            await asyncio.to_thread(group.stop)
        assert group.failures() == []

    asyncio.run(main())


async def until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def test_registers_and_streams_to_completion() -> None:
    async def body(driver: ReferenceDriver, group: VllmCoreGroup) -> None:
        assert group.wait_registered(1)
        (ready,) = group.transcript.select(channel="ready")
        assert ready.error is None and isinstance(ready.message, m.EngineCoreReadyResponse)
        assert ready.message.vllm_version == "0.33.0" and ready.rank == 0
        handle = await driver.generate([5, 6, 7], 5)
        await handle.wait(10)
        assert handle.tokens == [100, 101, 102, 103, 104]  # StubExecutor's token rule
        assert handle.finish_reason == "length" and handle.error is None
        assert handle.chunks == 5  # one output per engine step: really streamed
        (add,) = group.transcript.adds(0)
        assert add.request_id == handle.request_id and add.prompt_token_ids == [5, 6, 7]
        cfg = await driver.observed_config()
        assert (cfg.max_model_len, cfg.block_size) == (1024, 16)
        assert cfg.num_gpu_blocks == ready.message.num_gpu_blocks > 0
        assert group.transcript.protocol_errors() == []
        assert group.start_seconds is not None

    run(body)


def test_utilities_answered() -> None:
    async def body(driver: ReferenceDriver, group: VllmCoreGroup) -> None:
        assert await driver.is_sleeping() is False
        assert await driver.reset_prefix_cache() is True
        assert driver.frontend is not None
        assert await driver.frontend.call_all("get_supported_tasks", []) == [["generate"]]
        (sleeping,) = group.transcript.utility_calls("is_sleeping")
        (reset,) = group.transcript.utility_calls("reset_prefix_cache")
        assert sleeping.message.args == [] and reset.message.args == [False, False]
        replies = [r.message.utility_output for r in group.transcript.select(
            direction="out", channel="output") if r.message.utility_output is not None]
        assert [(u.call_id, u.failure_message, u.result.type_info, u.result.value)
                for u in replies] == [(sleeping.message.call_id, None, None, False),
                                      (reset.message.call_id, None, None, True),
                                      (replies[2].call_id, None, None, ["generate"])]

    run(body)


def test_sleep_and_wake_up_reach_the_stub_executor() -> None:
    """vLLM's real sleep path (pause, then executor.sleep) works over the stub worker."""

    async def body(driver: ReferenceDriver, _group: VllmCoreGroup) -> None:
        assert driver.frontend is not None
        await driver.frontend.call_all("sleep", [1])
        assert await driver.is_sleeping() is True
        await driver.frontend.call_all("wake_up", [None])
        assert await driver.is_sleeping() is False
        handle = await driver.generate([5, 6], 2)  # serving again after wake-up
        await handle.wait(10)
        assert handle.tokens == [100, 101]

    run(body)


def test_abort_of_a_live_request() -> None:
    async def body(driver: ReferenceDriver, group: VllmCoreGroup) -> None:
        live = await driver.generate([5, 6, 7, 8], 10_000)
        await live.wait_first(5)
        assert await until(lambda: len(live.tokens) >= 3, 5)  # mid-stream
        rid = live.request_id
        assert rid is not None
        await driver.abort([rid])
        assert live.finish_reason == "abort"
        tokens_at_abort = list(live.tokens)
        await asyncio.sleep(0.3)  # 30 engine steps
        assert live.tokens == tokens_at_abort
        (abort,) = group.transcript.abort_frames(0)
        assert abort.message.request_ids == [rid]

        def outputs_for(since: float) -> list[m.EngineCoreOutput]:
            return [o for r in group.transcript.select(direction="out", channel="output",
                                                       since=since)
                    for o in r.message.outputs if o.request_id == rid]

        # At most one step can cross the ABORT on the wire; nothing after a few steps, and
        # (as vLLM does for client aborts) never a final output.
        assert len(outputs_for(abort.t)) <= 1
        assert outputs_for(abort.t + 0.1) == []
        assert all(o.finish_reason is None for o in outputs_for(0.0))
        # The engine keeps serving.
        after = await driver.generate([9, 10, 11], 2)
        await after.wait(10)
        assert after.tokens == [100, 101]

    run(body)


def test_transcript_shows_add_abort_utility() -> None:
    async def body(driver: ReferenceDriver, group: VllmCoreGroup) -> None:
        live = await driver.generate([5, 6, 7, 8], 10_000)
        await live.wait_first(5)
        assert await driver.is_sleeping() is False
        assert live.request_id is not None
        await driver.abort([live.request_id])
        await asyncio.sleep(0.05)
        kinds = [type(r.message).__name__ for r in group.transcript.select(direction="in")]
        assert kinds == ["AddRequest", "UtilityRequest", "AbortRequests"]
        assert [r.rank for r in group.transcript.select(direction="in")] == [0, 0, 0]
        assert group.transcript.owner_of(live.request_id) == 0
        assert group.transcript.aborted_ids() == [live.request_id]
        ins = group.transcript.select(direction="in")
        assert isinstance(ins[0].message, AddRequest)
        assert isinstance(ins[2].message, AbortRequests)
        assert group.transcript.to_json()[0]["channel"] == "ready"

    run(body)


def test_engine_death_reaches_the_frontend() -> None:
    """Killing the real engine closes its sockets; the proxy mirrors that to the frontend."""

    async def body(driver: ReferenceDriver, group: VllmCoreGroup) -> None:
        live = await driver.generate([5, 6, 7], 10_000)
        await live.wait_first(5)
        group[0].exit()
        await live.wait(5)
        assert live.finish_reason == "error" and "engine" in (live.error or "")

    run(body)


def test_engine_process_is_reaped() -> None:
    async def main() -> None:
        group = VllmCoreGroup(codec=DEFAULT_CODEC)
        driver = ReferenceDriver().with_timescale(TIMESCALE)
        try:
            await driver.start(group, START_TIMEOUT)
            pid = group[0].pid
            assert pid is not None and _alive(pid)
        finally:
            await driver.shutdown()
            await asyncio.to_thread(group.stop)
        assert not _alive(pid)
        # Bounded, not fast: vLLM's SIGTERM grace, then SIGKILL (a behaviour, not a timing).
        assert group.stop_seconds is not None and group.stop_seconds < scaled(15.0)

    asyncio.run(main())


def _alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_handshake_mode_through_the_proxy() -> None:
    """vLLM's real HELLO / INIT / READY, relayed; INIT's addresses point at the proxy."""
    ipc = PrivateIpcDir()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    launcher = make_socket(ctx, zmq.ROUTER)
    router = make_socket(ctx, zmq.ROUTER)
    pull = make_socket(ctx, zmq.PULL)
    hs, inputs, outputs = ipc.address("hs"), ipc.address("in"), ipc.address("out")
    launcher.bind(hs)
    router.bind(inputs)
    pull.bind(outputs)
    group = VllmCoreGroup(codec=DEFAULT_CODEC)
    try:
        group.start_handshake(hs)
        assert launcher.poll(START_TIMEOUT * 1000)
        identity, hello = launcher.recv_multipart()
        assert identity == engine_identity(0)
        status = C.decode_handshake_status(hello)
        assert (status.status, status.local, status.headless) == ("HELLO", True, False)
        init = m.EngineHandshakeMetadata(m.EngineZmqAddresses([inputs], [outputs]), {})
        launcher.send_multipart([identity, C.encode_init(init)])
        assert router.poll(START_TIMEOUT * 1000)
        identity, payload = router.recv_multipart()
        assert identity == engine_identity(0) and C.decode_ready(payload) is not None
        assert launcher.poll(10_000)
        assert C.decode_handshake_status(launcher.recv_multipart()[1]).status == "READY"
        params = m.SamplingParams(temperature=0.0, max_tokens=2)
        request = m.EngineCoreRequest("h", [5, 6], None, params, None, time.time(), None,
                                      None, None)
        router.send_multipart([identity, *C.encode_add(request)])
        tokens: list[int] = []
        while len(tokens) < 2 and pull.poll(10_000):
            out = C.decode_outputs(pull.recv_multipart())
            assert isinstance(out, m.EngineCoreOutputs)
            tokens += [t for o in out.outputs for t in o.new_token_ids]
        assert tokens == [100, 101]
        notes = [r.note for r in group.transcript.select(channel="handshake")]
        assert notes == ["HELLO", "INIT", "READY"]
        assert group.failures() == []
    finally:
        group.stop()
        for sock in (launcher, router, pull):
            sock.close(0)
        ctx.term()
        ipc.cleanup()


def test_dp_above_one_is_refused_with_a_reason() -> None:
    with pytest.raises(NotImplementedError, match="DP=1"):
        VllmCoreGroup(2, codec=DEFAULT_CODEC)


def test_gpu_mode_runs_only_on_a_cuda_machine() -> None:
    """Never faked: without CUDA (or without a model) the exact reason is the skip reason."""
    try:
        check_available("gpu")
    except EngineUnavailable as exc:
        # The two reasons there are: no CUDA device, or no model named on a CUDA machine.
        assert str(exc).startswith(("no CUDA device: ", "COREWIRE_GPU_MODEL is not set"))
        pytest.skip(str(exc))
    try:
        engine_server("gpu").wait_ready(SERVER_START_TIMEOUT)
    except VllmCoreError as exc:
        pytest.fail(f"GPU engine server failed on a CUDA machine: {exc}")

    async def main() -> None:
        group = VllmCoreGroup(mode="gpu", codec=DEFAULT_CODEC)
        driver = ReferenceDriver().with_timescale(TIMESCALE)
        try:
            await driver.start(group, float(os.environ.get("COREWIRE_GPU_START_TIMEOUT", 600)))
            handle = await driver.generate([1, 2, 3], 4)
            await handle.wait(60)
            assert handle.finish_reason in ("length", "stop") and handle.tokens
            assert await driver.is_sleeping() is False
        finally:
            await driver.shutdown()
            await asyncio.to_thread(group.stop, 30.0)
        assert group.failures() == []

    asyncio.run(main())
