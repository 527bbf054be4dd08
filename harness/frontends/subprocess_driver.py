"""`FrontendDriver` for any port: a program speaking the JSON-lines driver protocol.

The harness owns the engines; the driver program owns its frontend. Everything that can go
wrong with a foreign process is bounded and reported, never hung on: a crash, an exit at
start, a hang (per-command timeout), garbage or stray text on stdout. Each becomes a
`DriverFault` (graded ERROR) or TimeoutError (graded TIMEOUT) carrying the stderr tail,
and the process is always reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import tempfile
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from harness.frontends.driver import (
    PASS_THROUGH_FIELDS,
    TENSOR_FIELDS,
    Capability,
    FrontendDriver,
    FrontendError,
    ObservedConfig,
    StartupError,
    StreamHandle,
    UnsupportedOperation,
    check_generate_options,
)
from harness.frontends.driver_protocol import (
    MAX_LINE,
    PROTOCOL,
    DriverProtocolError,
    decode_line,
    encode_line,
)
from harness.timing import scaled

if TYPE_CHECKING:
    from mock_engines.group import EngineGroup

STDERR_TAIL_BYTES = 64 * 1024
STDERR_TAIL_LINES = 40
# Commands added after the first protocol release: an older driver program that answers
# them with a plain "unknown command" error lacks them (UNSUPPORTED), it is not broken.
ADDED_COMMANDS = ("utility", "cancel")


class DriverFault(Exception):
    """The driver program crashed, exited, or broke the protocol (graded ERROR)."""


class SubprocessDriver(FrontendDriver):
    """Runs `argv` as a driver program and talks to it over stdin/stdout."""

    def __init__(self, argv: Sequence[str], name: str = "subprocess",
                 command_timeout: float | None = None, env: dict[str, str] | None = None
                 ) -> None:
        self.argv = list(argv)
        self.name = name
        self.capabilities = frozenset()
        self.command_timeout = scaled(10.0) if command_timeout is None else command_timeout
        self.env = env
        self._proc: asyncio.subprocess.Process | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._stderr_path = ""
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._streams: dict[str, StreamHandle] = {}
        self._stream_ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None
        self._fault: DriverFault | None = None
        self._stray: deque[str] = deque(maxlen=5)
        self._abandoned: set[int] = set()  # command ids whose late replies are ignored
        self.leftovers: list[str] = []  # what teardown had to clean up after the program

    # ------------------------------------------------------------------ process

    async def _spawn(self) -> None:
        self._workdir = tempfile.TemporaryDirectory(prefix="cw-drv-")
        os.chmod(self._workdir.name, 0o700)
        self._stderr_path = os.path.join(self._workdir.name, "stderr.log")
        with open(self._stderr_path, "wb") as err:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=err, env={**os.environ, **(self.env or {})}, limit=MAX_LINE + 2,
                start_new_session=True)
        self._reader = asyncio.create_task(self._read_stdout())

    async def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        try:
            while True:
                try:
                    line = await self._proc.stdout.readline()
                except ValueError:  # asyncio: "Separator is not found, and chunk exceed..."
                    raise DriverProtocolError(f"a stdout line over {MAX_LINE // 2**20} MiB, "
                                              f"the protocol's limit") from None
                if not line:
                    code = await self._wait_exit(scaled(2.0))
                    raise DriverFault(f"driver exited (code {code}) "
                                      f"{self._pending_text()}")
                if not line.strip():
                    continue
                self._dispatch(decode_line(line))
        except DriverProtocolError as exc:
            self._set_fault(DriverFault(f"driver broke the protocol: {exc}"))
        except DriverFault as exc:
            self._set_fault(exc)

    def _pending_text(self) -> str:
        return f"with {len(self._pending)} command(s) pending" if self._pending else ""

    async def _wait_exit(self, timeout: float) -> int | None:
        assert self._proc is not None
        with contextlib.suppress(asyncio.TimeoutError):
            return await asyncio.wait_for(self._proc.wait(), timeout)
        return None

    def _set_fault(self, fault: DriverFault) -> None:
        if self._fault is None:
            self._fault = DriverFault(f"{fault}\n--- driver stderr tail ---\n"
                                      f"{self.diagnostics()}")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(self._fault)
        for handle in self._streams.values():
            handle.finish("error", f"driver fault: {fault}")

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message:
            future = self._pending.get(message["id"])
            if future is None and message["id"] in self._abandoned:
                self._abandoned.discard(message["id"])
                return
            if future is None:
                raise DriverProtocolError(f"reply to unknown command id {message['id']!r}")
            if not future.done():
                future.set_result(message)
            return
        handle = self._streams.get(str(message.get("stream")))
        if handle is None:
            raise DriverProtocolError(f"event for unknown stream {message.get('stream')!r}")
        if message["event"] == "output":
            handle.add_tokens([int(t) for t in message.get("tokens", [])],
                              str(message.get("text", "")))
        else:
            handle.finish(message.get("finish_reason"), message.get("error"))

    # ------------------------------------------------------------------ commands

    async def _command(self, cmd: str, timeout: float | None = None, **args: Any
                       ) -> dict[str, Any]:
        """Send one command and wait (bounded) for its reply.

        Cancelled while waiting on a `utility` command, it tells the program (`cancel`,
        fire and forget) when the program declared cancel_utility, and ignores the late
        reply of the cancelled command either way.
        """
        if self._fault is not None:
            raise self._fault
        assert self._proc is not None and self._proc.stdin is not None
        cid = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[cid] = future
        try:
            self._proc.stdin.write(encode_line({"id": cid, "cmd": cmd, **args}))
            try:
                await self._proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                await asyncio.sleep(0.05)  # let the reader report the exit with its code
                if self._fault is not None:
                    raise self._fault from None
                raise DriverFault(f"driver stdin closed during {cmd!r}") from None
            bound = self.command_timeout if timeout is None else timeout
            try:
                reply = await asyncio.wait_for(asyncio.shield(future), bound)
            except asyncio.CancelledError:
                self._abandoned.add(cid)
                if cmd == "utility" and Capability.CANCEL_UTILITY in self.capabilities:
                    self._send_and_forget("cancel", target=cid)
                raise
            except asyncio.TimeoutError:
                raise TimeoutError(f"driver gave no reply to {cmd!r} within {bound:.1f}s\n"
                                   f"--- driver stderr tail ---\n{self.diagnostics()}"
                                   ) from None
        finally:
            self._pending.pop(cid, None)
        if reply.get("ok"):
            return reply
        error = str(reply.get("error", "unspecified error"))
        if reply.get("unsupported") or (cmd in ADDED_COMMANDS
                                         and "unknown command" in error.lower()):
            raise UnsupportedOperation(f"{cmd}: {error}")
        if cmd in ("init", "wait_ready"):
            raise StartupError(error)
        raise FrontendError(error)

    def _send_and_forget(self, cmd: str, **args: Any) -> None:
        """Write one command whose reply is ignored (the stream is not drained here)."""
        if self._fault is not None or self._proc is None or self._proc.stdin is None:
            return
        cid = next(self._ids)
        self._abandoned.add(cid)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, RuntimeError):
            self._proc.stdin.write(encode_line({"id": cid, "cmd": cmd, **args}))

    async def start(self, group: EngineGroup, timeout: float) -> None:
        await self._spawn()
        assert self._workdir is not None
        reply = await self._command(
            "init", timeout=timeout, protocol=PROTOCOL, workdir=self._workdir.name,
            engines=[{"rank": e.rank} for e in group.engines], dp_size=len(group),
            stats_address=group.stats_address, timescale=scaled(1.0),
            **({"handshake": True} if group.handshake else {}),
            **({"coordinator": True} if group.coordinated else {}))
        self.capabilities = frozenset(Capability(c) for c in reply.get("capabilities", [])
                                      if c in Capability._value2member_map_)
        if group.handshake and "handshake" not in reply:
            raise UnsupportedOperation("init: handshake mode was requested but the driver "
                                       "program answered without a 'handshake' address")
        if group.coordinated and not reply.get("coordinator"):
            raise UnsupportedOperation("init: a frontend-owned DP coordinator was requested "
                                       "but the driver program does not run one")
        if "handshake" in reply:
            group.start_handshake(str(reply["handshake"]), timeout=timeout)
        else:
            group.start_bootstrapped(list(reply["inputs"]), list(reply["outputs"]))
        await self._command("wait_ready", timeout=timeout + scaled(1.0), timeout_s=timeout)

    async def generate(self, prompt_token_ids: Sequence[int], max_tokens: int, *,
                       stream: bool = True, data_parallel_rank: int | None = None,
                       stop: Sequence[str] | None = None, request_id: str | None = None,
                       params: Mapping[str, Any] | None = None) -> StreamHandle:
        # Only sent to programs that declared them: an older program would ignore them.
        check_generate_options(
            self.name, request_id, params,
            request_ids=Capability.CLIENT_REQUEST_ID in self.capabilities,
            pass_through=(PASS_THROUGH_FIELDS if Capability.PASS_THROUGH in self.capabilities
                          else ()) + (TENSOR_FIELDS if Capability.INPUT_TENSORS
                                      in self.capabilities else ()))
        options: dict[str, Any] = {}
        if request_id is not None:
            options["request_id"] = request_id
        if params:
            options["params"] = dict(params)
        sid = f"s{next(self._stream_ids)}"
        handle = StreamHandle(list(prompt_token_ids))
        self._streams[sid] = handle
        reply = await self._command("generate", stream=sid, prompt=list(prompt_token_ids),
                                    max_tokens=max_tokens, data_parallel_rank=data_parallel_rank,
                                    stop=list(stop) if stop else None, **options)
        handle.request_id = reply.get("request_id")
        return handle

    async def open_session(self, prompt_token_ids: Sequence[int], max_tokens: int, *,
                           data_parallel_rank: int | None = None) -> StreamHandle:
        self._require_sessions()
        sid = f"s{next(self._stream_ids)}"
        handle = StreamHandle(list(prompt_token_ids))
        self._streams[sid] = handle
        reply = await self._command("open_session", stream=sid, prompt=list(prompt_token_ids),
                                    max_tokens=max_tokens,
                                    data_parallel_rank=data_parallel_rank)
        handle.request_id = reply.get("request_id")
        return handle

    async def continue_session(self, handle: StreamHandle, prompt_token_ids: Sequence[int],
                               max_tokens: int) -> None:
        self._require_sessions()
        await self._command("continue_session", stream=self._stream_of(handle),
                            prompt=list(prompt_token_ids), max_tokens=max_tokens)

    async def close_session(self, handle: StreamHandle) -> None:
        self._require_sessions()
        await self._command("close_session", stream=self._stream_of(handle))

    def _require_sessions(self) -> None:
        if Capability.STREAMING_INPUT not in self.capabilities:
            raise UnsupportedOperation(f"{self.name}: the driver program does not declare "
                                       f"streaming_input")

    def _stream_of(self, handle: StreamHandle) -> str:
        for sid, known in self._streams.items():
            if known is handle:
                return sid
        raise FrontendError(f"{self.name}: the handle is not one of this driver's streams")

    async def drop(self, handles: Sequence[StreamHandle]) -> None:
        by_handle = {id(h): sid for sid, h in self._streams.items()}
        await self._command("drop", streams=[by_handle[id(h)] for h in handles
                                             if id(h) in by_handle])

    async def abort(self, request_ids: Sequence[str]) -> None:
        await self._command("abort", request_ids=list(request_ids))

    async def is_sleeping(self) -> bool:
        return bool((await self._command("is_sleeping"))["value"])

    async def reset_prefix_cache(self, reset_running_requests: bool = False,
                                 reset_connector: bool = False) -> bool:
        reply = await self._command("reset_prefix_cache",
                                    reset_running_requests=reset_running_requests,
                                    reset_connector=reset_connector)
        return bool(reply["value"])

    async def call_utility(self, method: str, args: Sequence[Any]) -> Any:
        if Capability.CALL_UTILITY not in self.capabilities:
            raise UnsupportedOperation(f"{self.name}: the driver program does not declare "
                                       f"call_utility")
        return (await self._command("utility", method=method, args=list(args))).get("value")

    async def observed_config(self) -> ObservedConfig:
        value = (await self._command("observed_config"))["value"]
        return ObservedConfig(value.get("max_model_len"), value.get("block_size"),
                              value.get("num_gpu_blocks"))

    async def shutdown(self) -> None:
        """Ask politely, then terminate, then kill; always reap; idempotent."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            if self._fault is None:
                with contextlib.suppress(Exception):
                    await self._command("shutdown", timeout=scaled(3.0))
            if await self._wait_exit(scaled(2.0)) is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                if await self._wait_exit(scaled(2.0)) is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()
        if proc is not None:
            await self._reap_group(proc.pid)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()
        if self._workdir is not None:
            self._tail_cache = self.diagnostics()
            self._workdir.cleanup()
            self._workdir = None

    _tail_cache = ""

    def teardown_notes(self) -> list[str]:
        return list(self.leftovers)

    async def _reap_group(self, pgid: int) -> None:
        """The program runs in its own session, so its process group id is its pid: anything
        it left in that group (children it never reaped) is terminated, then killed."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                return  # the group is empty
            if sig == signal.SIGTERM:
                self.leftovers.append(f"driver left processes in its group {pgid}; "
                                      f"terminated them")
            deadline = time.monotonic() + scaled(2.0)
            while time.monotonic() < deadline:
                try:
                    os.killpg(pgid, 0)
                except (ProcessLookupError, PermissionError):
                    return
                await asyncio.sleep(0.02)

    def diagnostics(self) -> str:
        if not self._stderr_path or not os.path.exists(self._stderr_path):
            return self._tail_cache
        with open(self._stderr_path, "rb") as fh:  # only the tail: a driver may flood it
            fh.seek(max(0, os.path.getsize(self._stderr_path) - STDERR_TAIL_BYTES))
            lines = fh.read().decode(errors="replace").splitlines()
        return "\n".join(lines[-STDERR_TAIL_LINES:])
