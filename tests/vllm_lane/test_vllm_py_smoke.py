"""Smoke tests of the vllm-py driver: vLLM's real AsyncLLM behind 1 and 2 mock engines.

They check the driver's plumbing, not conformance (that is the conformance suite's job): the
engines register (1 engine: AsyncMPClient; 2: DPLBAsyncMPClient), a request streams to
completion, utilities aggregate, a dropped stream is aborted at its owner with AsyncLLM's
engine-side id, and teardown leaves no thread, socket or ZMQ context behind.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest

from harness.cases.helpers import hold, prompt, request_for, requests_for
from harness.frontends.api import FrontendError, StartupError
from harness.frontends.vllm_py.driver import VllmPyDriver
from harness.protocol.transport.endpoints import PrivateIpcDir
from harness.protocol.wire import DEFAULT_CODEC
from mock_engines.group import EngineGroup
from mock_engines.script import EngineScript, any_request
from tests.timescale import TIMESCALE, scaled
from tests.vllm_lane.driving import answering, run_driver, scripts

pytestmark = pytest.mark.vllm

START_TIMEOUT = 15.0
Body = Callable[[VllmPyDriver, EngineGroup], Awaitable[None]]


def run(scripts: Sequence[EngineScript], body: Body) -> None:
    run_driver(VllmPyDriver, scripts, body, START_TIMEOUT)


@pytest.mark.parametrize("n", [1, 2])
def test_registers_and_streams(n: int) -> None:
    async def body(driver: VllmPyDriver, group: EngineGroup) -> None:
        assert group.wait_registered(1)
        for rank in range(n):
            p = prompt(rank)
            handle = await driver.generate(p, 3, data_parallel_rank=rank if n > 1 else None)
            await handle.wait(10)
            assert handle.tokens == [100, 101, 102]
            assert handle.finish_reason == "length" and handle.error is None
            assert handle.text.split() == ["t100", "t101", "t102"]
            found = request_for(group, p)
            assert found is not None and found[0] == rank
            # AsyncLLM appends its own suffix to the id we passed.
            assert handle.request_id is not None
            assert found[1].startswith(handle.request_id + "-")
        cfg = await driver.observed_config()
        assert (cfg.max_model_len, cfg.block_size, cfg.num_gpu_blocks) == (1024, 16, 1000 * n)
        # What `vllm serve` does before serving: reset_mm_cache and get_supported_tasks, on
        # every engine in DP.
        for method in ("reset_mm_cache", "get_supported_tasks"):
            ranks = sorted(r.rank for r in group.transcript.utility_calls(method))
            assert ranks == list(range(n)), method

    run(scripts(n), body)


@pytest.mark.parametrize("values", [(True,), (False,), (True, True), (False, False)])
def test_is_sleeping_agreement(values: tuple[bool, ...]) -> None:
    async def body(driver: VllmPyDriver, group: EngineGroup) -> None:
        assert await driver.is_sleeping() is values[0]
        ranks = sorted(r.rank for r in group.transcript.utility_calls("is_sleeping"))
        assert ranks == list(range(len(values)))

    run(answering("is_sleeping", *values), body)


def test_is_sleeping_disagreement_fails() -> None:
    async def body(driver: VllmPyDriver, _group: EngineGroup) -> None:
        with pytest.raises(FrontendError, match="different is_sleeping results"):
            await driver.is_sleeping()

    run(answering("is_sleeping", True, False), body)


@pytest.mark.parametrize(("values", "want"), [((True,), True), ((False,), False),
                                              ((True, True), True), ((True, False), False),
                                              ((False, True), False)])
def test_reset_prefix_cache_is_and(values: tuple[bool, ...], want: bool) -> None:
    async def body(driver: VllmPyDriver, group: EngineGroup) -> None:
        assert await driver.reset_prefix_cache() is want
        calls = group.transcript.utility_calls("reset_prefix_cache")
        assert [c.message.args for c in calls] == [[False, False]] * len(values)

    run(answering("reset_prefix_cache", *values), body)


@pytest.mark.parametrize("n", [1, 2])
def test_dropped_stream_aborted_at_owner(n: int) -> None:
    async def body(driver: VllmPyDriver, group: EngineGroup) -> None:
        prompts = [prompt(i) for i in range(2 * n)]
        handles = [await driver.generate(p, 100) for p in prompts]
        for h in handles:
            await h.wait_first(5)
        owners = requests_for(group, prompts)
        assert owners is not None and sorted(set(owners.values())) == list(range(n))
        await driver.drop(handles)
        assert all(h.dropped and h.finish_reason == "abort" for h in handles)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while set(group.transcript.aborted_ids()) != set(owners) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        frames = group.transcript.abort_frames()
        seen = [(r.rank, rid) for r in frames for rid in r.message.request_ids]
        assert sorted(seen) == sorted((rank, rid) for rid, rank in owners.items())
        assert all(r.message.request_ids for r in frames)

    run([EngineScript(rules=[any_request(hold())]) for _ in range(n)], body)


def test_explicit_abort_by_engine_side_id() -> None:
    async def body(driver: VllmPyDriver, group: EngineGroup) -> None:
        live = await driver.generate(prompt(0), 100)
        await live.wait_first(5)
        found = request_for(group, prompt(0))
        assert found is not None
        await driver.abort([found[1], "no-such-request"])
        await live.wait(5)
        assert live.finish_reason == "abort"
        await asyncio.sleep(0.1)
        assert group.transcript.aborted_ids() == [found[1]]
        await driver.abort(["unknown-only"])  # nothing to send: no (empty) frame
        await asyncio.sleep(0.1)
        assert len(group.transcript.abort_frames()) == 1

    run([EngineScript(rules=[any_request(hold())])], body)


def test_never_registering_engine_is_a_bounded_startup_error() -> None:
    async def main() -> None:
        ipc = PrivateIpcDir()
        group = EngineGroup([EngineScript(), EngineScript(register=False)],
                            coordinator_address=ipc.address("dp-stats"), codec=DEFAULT_CODEC)
        driver = VllmPyDriver().with_timescale(TIMESCALE)
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            with pytest.raises(StartupError, match="Timed out waiting"):
                await driver.start(group, 1.0)
            assert loop.time() - began < scaled(6.0)  # bounded by the 1 s startup bound
        finally:
            await driver.shutdown()
            await asyncio.to_thread(group.stop)
            ipc.cleanup()

    asyncio.run(main())


def _process_resources() -> tuple[int, int]:
    """(OS threads, open fds) of this process: ZMQ io threads and sockets count here."""
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_teardown_leaks_nothing() -> None:
    """Right after shutdown (no GC pass, same loop) the process is back to where it was."""

    async def cycle(n: int, ready_payload: bytes | None = None) -> None:
        ipc = PrivateIpcDir()
        group = EngineGroup([EngineScript(rules=[any_request(hold())],
                                          ready_payload=ready_payload) for _ in range(n)],
                            coordinator_address=ipc.address("dp-stats") if n > 1 else None,
                                    codec=DEFAULT_CODEC)
        driver = VllmPyDriver().with_timescale(TIMESCALE)
        try:
            await driver.start(group, START_TIMEOUT)
            handle = await driver.generate(prompt(0), 100)
            await handle.wait_first(5)  # left open: shutdown must unwind it too
        except StartupError:
            assert ready_payload is not None
        finally:
            await driver.shutdown()
            group.stop()  # not via to_thread: an executor thread would count as a leak
            ipc.cleanup()

    async def main() -> tuple[tuple[int, int], list[tuple[int, int]]]:
        before = _process_resources()  # inside the loop: its epoll fd and self-pipe count
        seen = []
        for n, payload in ((1, None), (2, None), (1, b"\xc1garbage"), (2, None)):
            await cycle(n, payload)
            seen.append(_process_resources())
        return before, seen

    VllmPyDriver()  # imports vLLM (its import-time threads are not the driver's)
    gc.collect()
    # vLLM leaves its ZMQ context (io threads, fds) to the GC; the driver must not rely on it.
    gc.disable()
    try:
        before, seen = asyncio.run(main())
    finally:
        gc.enable()
    assert seen == [before] * len(seen)
