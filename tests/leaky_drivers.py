"""In-process drivers that leave behind what a broken frontend would: a unix socket file in
the temp dir (as vLLM's DP coordinator did with `ipc://{tempdir}/{uuid4}`), or a ZMQ context
whose sockets are still open. tests/test_temp_leaks.py runs them through run_case."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import zmq

from harness.cases.context import CaseContext
from harness.cases.declaration import CaseSpec
from harness.frontends.api import (
    FrontendDriver,
    ObservedConfig,
    StreamHandle,
    UnsupportedOperation,
)
from harness.results.records import Level

if TYPE_CHECKING:
    from harness.frontends.api import EngineSide

SPEC = CaseSpec("streaming.smoke.leaky", Level.MUST, "a driver that leaks", "tests")

# A stand-in for vLLM's DP coordinator process: binds a listening unix socket at argv[1],
# says so, and waits to be killed (SIGTERM/SIGKILL: nothing unlinks the file).
BINDER = ("import socket, sys, time\n"
          "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
          "s.bind(sys.argv[1]); s.listen()\n"
          "print('bound', flush=True)\n"
          "time.sleep(600)\n")


def spawn_binder(path: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A child process holding a unix socket bound at `path` (returns once it is bound)."""
    proc = subprocess.Popen([sys.executable, "-c", BINDER, path], stdout=subprocess.PIPE,
                            env=None if env is None else dict(env))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == b"bound", line
    return proc


class _Inert(FrontendDriver):
    """Starts nothing the case can drive: the cases below only start and tear down."""

    capabilities = frozenset()

    async def start(self, group: EngineSide, timeout: float) -> None:
        return None

    async def generate(self, prompt_token_ids: Sequence[int], max_tokens: int, *,
                       stream: bool = True, data_parallel_rank: int | None = None,
                       stop: Sequence[str] | None = None, request_id: str | None = None,
                       params: Mapping[str, Any] | None = None) -> StreamHandle:
        raise UnsupportedOperation("inert test driver")

    async def drop(self, handles: Sequence[StreamHandle]) -> None:
        raise UnsupportedOperation("inert test driver")

    async def abort(self, request_ids: Sequence[str]) -> None:
        raise UnsupportedOperation("inert test driver")

    async def is_sleeping(self) -> bool:
        raise UnsupportedOperation("inert test driver")

    async def reset_prefix_cache(self, reset_running_requests: bool = False,
                                 reset_connector: bool = False) -> bool:
        raise UnsupportedOperation("inert test driver")

    async def observed_config(self) -> ObservedConfig:
        return ObservedConfig()

    async def shutdown(self) -> None:
        return None


class TempSocketDriver(_Inert):
    """Its 'coordinator' child binds `ipc://{base}/{uuid4}` and is killed at shutdown, as
    AsyncLLM.shutdown() terminates vLLM's: the file stays. `base` None: the temp dir (the
    bug); else that dir (the fix: a private dir the harness removes)."""

    name = "temp-socket"

    def __init__(self, base: str | None = None) -> None:
        self.base = base
        self.path = ""
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self, group: EngineSide, timeout: float) -> None:
        base = self.base if self.base is not None else tempfile.gettempdir()
        self.path = os.path.join(base, str(uuid.uuid4()))
        self.proc = await asyncio.to_thread(spawn_binder, self.path)

    async def shutdown(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            await asyncio.to_thread(self.proc.wait)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None


class ZmqLeakDriver(_Inert):
    """Makes a ZMQ context and a socket with an unsent message and never closes either:
    they sit in a reference cycle, the way a leaked frontend's do, so a later GC pass finds
    them together and (finalizing the context first, its weak socket set already cleared)
    would block for ever in term()."""

    name = "zmq-leak"

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.cycle: dict[str, Any] = {}

    async def start(self, group: EngineSide, timeout: float) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, -1)  # wait for ever to deliver
        sock.connect(self.endpoint)  # nobody listens: the message stays queued
        sock.send(b"never delivered", zmq.NOBLOCK)
        self.cycle.update(ctx=ctx, sock=sock, cycle=self.cycle)


async def start_only(ctx: CaseContext) -> None:
    """The case: start the frontend, then tear down."""
    await ctx.start(1)
