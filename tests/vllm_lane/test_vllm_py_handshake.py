"""vllm-py in handshake mode: AsyncLLM owns HELLO / INIT / READY of remote headless engines.

Needs vLLM 0.33.0 importable (the vllm lane). What the conformance cases cannot see: the
addresses AsyncLLM hands out, and that an aborted (hung) startup leaves no thread, fd or
child process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.cases.helpers import prompt, request_for
from harness.frontends.api import StartupError, StartupHang
from harness.frontends.vllm_py.driver import VllmPyDriver
from harness.frontends.vllm_py.handshake import STARTUP_GRACE
from harness.hygiene.leaks import _children
from harness.protocol.transport.endpoints import PrivateIpcDir
from harness.protocol.wire import DEFAULT_CODEC
from harness.protocol.wire import messages as m
from mock_engines.group import EngineGroup
from mock_engines.script import EngineScript
from tests.timescale import TIMESCALE, scaled

pytestmark = pytest.mark.vllm

START_TIMEOUT = 15.0


def _group(scripts: Sequence[EngineScript], ipc: PrivateIpcDir) -> EngineGroup:
    group = EngineGroup(list(scripts), coordinator_address=ipc.address("dp-stats")
                        if len(scripts) > 1 else None, codec=DEFAULT_CODEC)
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


def test_coordinator_start_survives_a_lock_held_at_fork() -> None:
    """The flake of handshake.init.coordinator_addresses_2_engines[vllm-py], reproduced: a
    thread of the harness process holds the lock of vLLM's log stream (it is inside a write)
    at the moment AsyncLLM starts its DP coordinator. Forked from this process (vLLM's
    default), the coordinator copies that lock held by a thread it does not have, blocks in
    `configure_logging`'s flush, never reports its addresses, and no INIT follows (TIMEOUT).
    Started from the driver's fork server it is a clean process: startup serves, and the
    coordinator is not a child of this process."""
    import io
    import logging

    driver = VllmPyDriver().with_timescale(TIMESCALE)  # imports vLLM, starts the fork server
    handler = next(h for h in logging.getLogger("vllm").handlers
                   if isinstance(h, logging.StreamHandler))
    read_fd, write_fd = os.pipe()
    stream = io.TextIOWrapper(io.BufferedWriter(io.FileIO(write_fd, "w"), 1 << 16),
                              write_through=True)
    draining, armed, stop = threading.Event(), threading.Event(), threading.Event()
    draining.set()
    forks: list[int] = []

    def drain() -> None:
        while not stop.is_set():
            if draining.wait(0.05):
                with contextlib.suppress(BlockingIOError):
                    os.read(read_fd, 1 << 16)

    def hold_lock_across_fork() -> None:  # runs in whichever thread forks
        if not armed.is_set():
            return
        forks.append(os.getpid())
        draining.clear()
        threading.Thread(target=stream.write, args=("x" * (1 << 20),), daemon=True).start()
        time.sleep(0.3)  # the writer now blocks inside the write, holding the buffer lock

    async def main() -> None:
        ipc = PrivateIpcDir()
        group = _group([EngineScript(), EngineScript()], ipc)
        try:
            armed.set()
            await driver.start(group, START_TIMEOUT)
            armed.clear()
            coordinator = driver._llm.engine_core.resources.coordinator
            assert coordinator is not None
            with open(f"/proc/{coordinator.proc.pid}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            assert parent != os.getpid(), "the DP coordinator is a fork of the harness process"
        finally:
            armed.clear()
            draining.set()
            await driver.shutdown()
            await asyncio.to_thread(group.stop)
            ipc.cleanup()

    os.set_blocking(read_fd, False)
    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    os.register_at_fork(before=hold_lock_across_fork, after_in_parent=draining.set)
    saved = handler.setStream(stream)
    try:
        asyncio.run(main())
    finally:
        handler.setStream(saved)
        stop.set()
        drainer.join(5)
        stream.close()
        os.close(read_fd)
    assert forks == [], "AsyncLLM forked its DP coordinator from the harness process"
