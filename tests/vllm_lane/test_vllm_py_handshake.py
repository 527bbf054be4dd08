"""vllm-py in handshake mode: AsyncLLM owns HELLO / INIT / READY of remote headless engines.

Needs vLLM 0.33.0 importable (the vllm lane). What the conformance cases cannot see: the
addresses AsyncLLM hands out, and that an aborted (hung) startup leaves no thread, fd or
child process behind.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.casekit import prompt, request_for
from harness.frontends.driver import StartupError, StartupHang
from harness.frontends.vllm_py import VllmPyDriver
from harness.frontends.vllm_py_handshake import STARTUP_GRACE
from harness.leaks import _children
from harness.transport.endpoints import PrivateIpcDir
from harness.wire import messages as m
from mock_engines.group import EngineGroup
from mock_engines.script import EngineScript
from tests.timescale import TIMESCALE, scaled

pytestmark = pytest.mark.vllm

START_TIMEOUT = 15.0


def _group(scripts: Sequence[EngineScript], ipc: PrivateIpcDir) -> EngineGroup:
    group = EngineGroup(list(scripts), coordinator_address=ipc.address("dp-stats")
                        if len(scripts) > 1 else None)
    group.handshake = True
    return group


@pytest.mark.parametrize("n", [1, 2])
def test_owns_handshake_and_serves(n: int) -> None:
    async def main() -> None:
        ipc = PrivateIpcDir()
        group = _group([EngineScript() for _ in range(n)], ipc)
        driver = VllmPyDriver().with_timescale(TIMESCALE)
        try:
            await driver.start(group, START_TIMEOUT)
            for rank in range(n):
                inits = [r.message for r in group.transcript.select(
                    rank=rank, direction="in", channel="handshake")
                    if isinstance(r.message, m.EngineHandshakeMetadata)]
                assert len(inits) == 1
                # Remote engines: loopback TCP, the coordinator's addresses only for DP.
                assert all(a.startswith("tcp://127.0.0.1:")
                           for a in (*inits[0].addresses.inputs, *inits[0].addresses.outputs))
                assert (inits[0].addresses.coordinator_input is None) == (n == 1)
                handle = await driver.generate(prompt(rank), 2,
                                               data_parallel_rank=rank if n > 1 else None)
                await handle.wait(10)
                found = request_for(group, prompt(rank))
                assert found is not None and found[0] == rank
                assert handle.finish_reason == "length"
        finally:
            await driver.shutdown()
            await asyncio.to_thread(group.stop)
            ipc.cleanup()

    asyncio.run(main())


def test_unexpected_identity_is_a_startup_error() -> None:
    async def main() -> None:
        ipc = PrivateIpcDir()
        group = _group([EngineScript(), EngineScript(register_as=5)], ipc)
        driver = VllmPyDriver().with_timescale(TIMESCALE)
        try:
            with pytest.raises(StartupError, match="unexpected data parallel rank: 5"):
                await driver.start(group, START_TIMEOUT)
        finally:
            await driver.shutdown()
            await asyncio.to_thread(group.stop)
            ipc.cleanup()

    asyncio.run(main())


def _resources() -> tuple[int, int, frozenset[int]]:
    """(OS threads, open fds, child processes) of this process."""
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd")), _children()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("withheld", ["READY", "HELLO"])
def test_hung_startup_is_aborted_and_leaks_nothing(withheld: str) -> None:
    """Python's handshake wait has no bound: the driver gives up after bound + grace, raises
    StartupHang (not StartupError), and the aborted constructor (its sockets, ZMQ context,
    forked DP coordinator and thread) is gone when shutdown returns."""
    silent = (EngineScript(handshake_ready=False) if withheld == "READY"
              else EngineScript(register=False, handshake_ready=False))

    async def main() -> tuple[tuple[int, int, frozenset[int]], tuple[int, int, frozenset[int]]]:
        before = _resources()  # inside the loop: its epoll fd and self-pipe count
        ipc = PrivateIpcDir()
        group = _group([EngineScript(), silent], ipc)
        driver = VllmPyDriver().with_timescale(TIMESCALE)
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            with pytest.raises(StartupHang, match="no timeout"):
                await driver.start(group, 1.0)
            took = loop.time() - began
            assert scaled(STARTUP_GRACE) < took < 1.0 + scaled(STARTUP_GRACE) + scaled(5.0)
        finally:
            await driver.shutdown()
            group.stop()  # not via to_thread: an executor thread would count as a leak
            ipc.cleanup()
        return before, _resources()

    VllmPyDriver()  # imports vLLM (its import-time threads are not the driver's)
    gc.collect()
    before, after = asyncio.run(main())
    assert after == before
    assert not [t for t in threading.enumerate() if t.name == "vllm-py-handshake-startup"]
