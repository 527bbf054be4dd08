"""`FrontendDriver` for any port: a program speaking the JSON-lines driver protocol.

The harness owns the engines; the driver program owns its frontend. Everything that can go
wrong with a foreign process is bounded and reported, never hung on: a crash, an exit at
start, a hang (per-command timeout naming the command), garbage or stray text on stdout, a
stderr flood (only head and tail kept), a program that ignores `shutdown` and SIGTERM, and
processes it leaves behind (its whole session and every process carrying its token are
ended and verified gone). Each fault becomes a `DriverFault` (graded ERROR) or a
CommandTimeout (graded TIMEOUT), and the process is always reaped.

The process itself (spawn, exit watch, stop, leftovers) is `ProgramProcess`, the
driver's base (program_process.py); this module is the protocol spoken over its pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from harness.frontends.api import (
    GREEDY,
    PASS_THROUGH_FIELDS,
    TENSOR_FIELDS,
    Capability,
    CommandTimeout,
    DriverFault,
    FrontendError,
    ObservedConfig,
    Sampling,
    StartupError,
    StreamHandle,
    UnsupportedOperation,
    check_generate_options,
)
from harness.frontends.subprocess.exchange import FROM_DRIVER, TO_DRIVER, ExchangeLog
from harness.frontends.subprocess.program_process import (
    DriverProgramFault,
    ProgramProcess,
    stuck_driver_warning,
    stuck_seconds,
)
from harness.frontends.subprocess.protocol import (
    MAX_LINE,
    PROTOCOL,
    VERSION,
    DriverProtocolError,
    answered_version,
    decode_line,
    encode_line,
    model_facts,
)
from harness.frontends.subprocess.stderr_capture import StderrCapture
from harness.hygiene import ownership, process_tree

if TYPE_CHECKING:
    from harness.frontends.api import EngineSide

# Commands added after the first protocol release: an older driver program that answers
# them with a plain "unknown command" error lacks them (UNSUPPORTED), it is not broken.
ADDED_COMMANDS = ("utility", "cancel")
# How long a program may take to start and answer `init` on top of the case's startup
# timeout (seconds, before the time-scale factor): the interpreter or binary starting and
# importing is the program's overhead, not the frontend's startup, and on a loaded machine it
# alone outlasts the 1.5 s a startup-failure case gives the frontend (the soak caught it).
PROGRAM_START_S = 20.0

__all__ = ["ADDED_COMMANDS", "PROGRAM_START_S", "DriverProgramFault", "SubprocessDriver",
           "stuck_driver_warning", "stuck_seconds"]


class SubprocessDriver(ProgramProcess):
    """Runs `argv` as a driver program and talks to it over stdin/stdout.

    `model`: the facts `init` hands a version-2 program (None: the tiny model's,
    `model_facts()`; a test may send others to see them reach the ADD).
    """

    def __init__(self, argv: Sequence[str], name: str = "subprocess",
                 command_timeout: float | None = None, env: dict[str, str] | None = None,
                 model: Mapping[str, Any] | None = None) -> None:
        self.argv = list(argv)
        self.name = name
        self.capabilities = frozenset()
        self.model = dict(model) if model is not None else model_facts()
        self.version = 1  # the protocol version the program answered in `init`
        self._command_timeout = command_timeout
        self.env = env
        self._proc: asyncio.subprocess.Process | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._token = process_tree.new_token()
        self._stderr = StderrCapture()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[str, float, asyncio.Future[dict[str, Any]]]] = {}
        self._given_up: list[str] = []  # commands still unanswered when the case gave up
        self._streams: dict[str, StreamHandle] = {}
        self._stream_ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []  # stdout, stderr and exit watchers
        self._fault: DriverFault | None = None
        self._closing = False  # teardown has begun (faults after it are the exit we asked for)
        self._late: str | None = None  # a protocol violation read during teardown (late_fault)
        self._shutdown_answered = False  # lines after the reply to `shutdown` are not graded
        self._abandoned: set[int] = set()  # command ids whose late replies are ignored
        self.leftovers: list[str] = []  # what teardown had to clean up after the program
        self.exchange = ExchangeLog()  # the protocol lines, for the case's transcript
        self.launched = False  # the program answered `init` (failfast: it came up)

    @property
    def command_timeout(self) -> float:
        """How long one command may wait for its reply (10 s scaled, unless given)."""
        if self._command_timeout is None:
            return self.timescale.scaled(10.0)
        return self._command_timeout

    # ------------------------------------------------------------------ process

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
                    code = await self._wait_exit(self.scaled(2.0))
                    what = ("driver closed its stdout and kept running" if code is None
                            else f"driver exited (code {code})")
                    raise DriverProgramFault(f"{what} {self._pending_text()}".rstrip())
                if not line.strip():
                    continue
                self.exchange.record(FROM_DRIVER, line)
                try:
                    try:
                        self._dispatch(decode_line(line))
                    except DriverFault:
                        raise
                    except Exception as exc:  # never a silent reader death: the line, quoted
                        raise DriverProtocolError(
                            f"could not use {line[:200]!r}: {type(exc).__name__}: "
                            f"{str(exc)[:200]}") from None
                except DriverProtocolError as exc:
                    if not self._closing:
                        raise
                    if self._shutdown_answered:
                        continue
                    # Written before the program answered `shutdown`: still its behaviour
                    # in the case (graded by run_case after teardown); read on to the reply.
                    if self._late is None:
                        self._late = f"driver broke the protocol: {exc}"
        except DriverProtocolError as exc:
            self._set_fault(DriverProgramFault(f"driver broke the protocol: {exc}"))
        except DriverFault as exc:
            self._set_fault(exc)

    def _pending_text(self) -> str:
        if not self._pending:
            return ""
        names = ", ".join(f"`{cmd}` (id {cid})" for cid, (cmd, _, _) in self._pending.items())
        return f"with no reply to {names}"

    def _set_fault(self, fault: DriverFault) -> None:
        if self._fault is None and not self._closing:  # after that: the exit we asked for
            self._fault = fault
        fault = self._fault or fault
        for _, _, future in self._pending.values():
            if not future.done():
                future.set_exception(fault)
        for handle in self._streams.values():
            handle.finish("error", f"driver fault: {fault}")

    def fault(self) -> str | None:
        return None if self._fault is None else str(self._fault)

    def late_fault(self) -> str | None:
        # run_case asks only when fault() was None at grading: a fault set since then came
        # before teardown began (faults after it are suppressed), so it is still the case's.
        if self._late is not None:
            return self._late
        return None if self._fault is None else str(self._fault)

    def unanswered(self) -> list[str]:
        now = time.monotonic()
        return self._given_up + [f"`{cmd}` (id {cid}, {now - sent:.1f} s)"
                                 for cid, (cmd, sent, _) in self._pending.items()]

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message:
            pending = self._pending.get(message["id"])
            if pending is None and message["id"] in self._abandoned:
                self._abandoned.discard(message["id"])
                return
            if pending is None:
                raise DriverProtocolError(f"reply to unknown command id {message['id']!r}")
            if pending[0] == "shutdown":
                self._shutdown_answered = True
            if not pending[2].done():
                pending[2].set_result(message)
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
        sent = time.monotonic()
        self._pending[cid] = (cmd, sent, future)
        try:
            line = encode_line({"id": cid, "cmd": cmd, **args})
            self.exchange.record(TO_DRIVER, line)
            self._proc.stdin.write(line)
            try:
                await self._proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                await asyncio.sleep(0.05)  # let the reader report the exit with its code
                if self._fault is not None:
                    raise self._fault from None
                raise DriverProgramFault(f"driver stdin closed during `{cmd}` (id {cid})") from None
            bound = self.command_timeout if timeout is None else timeout
            try:
                reply = await asyncio.wait_for(asyncio.shield(future), bound)
            except asyncio.CancelledError:
                self._abandoned.add(cid)
                if not future.done():
                    self._given_up.append(f"`{cmd}` (id {cid}, "
                                          f"{time.monotonic() - sent:.1f} s)")
                if cmd == "utility" and Capability.CANCEL_UTILITY in self.capabilities:
                    self._send_and_forget("cancel", target=cid)
                raise
            except asyncio.TimeoutError:
                self._abandoned.add(cid)
                raise CommandTimeout(f"no reply to `{cmd}` (id {cid}) within {bound:.1f} s"
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
        line = encode_line({"id": cid, "cmd": cmd, **args})
        self.exchange.record(TO_DRIVER, line)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, RuntimeError):
            self._proc.stdin.write(line)

    async def start(self, group: EngineSide, timeout: float) -> None:
        await self._spawn()
        assert self._workdir is not None
        reply = await self._command(
            "init", timeout=timeout + self.scaled(PROGRAM_START_S), protocol=PROTOCOL,
            version=VERSION, model=self.model, workdir=self._workdir.name,
            engines=[{"rank": e.rank} for e in group.engines], dp_size=len(group.engines),
            stats_address=group.stats_address, timescale=self.scaled(1.0),
            **({"handshake": True} if group.handshake else {}),
            **({"coordinator": True} if group.coordinated else {}))
        self.launched = True
        try:
            self.version = answered_version(reply)
        except DriverProtocolError as exc:
            fault = DriverProgramFault(f"driver broke the protocol: {exc}")
            self._set_fault(fault)
            raise fault from None
        declared = {Capability(c) for c in reply.get("capabilities", [])
                    if c in Capability._value2member_map_}
        # SAMPLING is the version's, not a declaration: only version 2 tells the program
        # the client's sampling and the model's EOS id.
        declared.discard(Capability.SAMPLING)
        self.capabilities = frozenset(declared | ({Capability.SAMPLING} if self.version >= 2
                                                  else set()))
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
        await self._command("wait_ready", timeout=timeout + self.scaled(1.0), timeout_s=timeout)

    async def introduce(self, timeout: float) -> str | None:
        """Start the program, send `init` (one engine, bootstrapped) and stop it again: the
        `name` it answers (None if it answers none within `timeout`). The run's probe for
        a frontend's name (harness/frontends/naming.py); no engine is ever started."""
        await self._spawn()
        assert self._workdir is not None
        try:
            reply = await self._command(
                "init", timeout=timeout, protocol=PROTOCOL, workdir=self._workdir.name,
                engines=[{"rank": 0}], dp_size=1, stats_address=None,
                timescale=self.scaled(1.0))
            name = reply.get("name")
            return name if isinstance(name, str) else None
        except (DriverFault, CommandTimeout, FrontendError):
            return None
        finally:
            await self.shutdown()

    async def generate(self, prompt_token_ids: Sequence[int], max_tokens: int, *,
                       stream: bool = True, data_parallel_rank: int | None = None,
                       stop: Sequence[str] | None = None, request_id: str | None = None,
                       params: Mapping[str, Any] | None = None,
                       sampling: Sampling | None = None) -> StreamHandle:
        # Only sent to programs that declared them: an older program would ignore them.
        check_generate_options(
            self.name, request_id, params,
            request_ids=Capability.CLIENT_REQUEST_ID in self.capabilities,
            pass_through=(PASS_THROUGH_FIELDS if Capability.PASS_THROUGH in self.capabilities
                          else ()) + (TENSOR_FIELDS if Capability.INPUT_TENSORS
                                      in self.capabilities else ()))
        options = self._sampling_option(sampling)
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
                           data_parallel_rank: int | None = None,
                           sampling: Sampling | None = None) -> StreamHandle:
        self._require_sessions()
        options = self._sampling_option(sampling)
        sid = f"s{next(self._stream_ids)}"
        handle = StreamHandle(list(prompt_token_ids))
        self._streams[sid] = handle
        reply = await self._command("open_session", stream=sid, prompt=list(prompt_token_ids),
                                    max_tokens=max_tokens,
                                    data_parallel_rank=data_parallel_rank, **options)
        handle.request_id = reply.get("request_id")
        return handle

    def _sampling_option(self, sampling: Sampling | None) -> dict[str, Any]:
        """`sampling` for a version-2 program, every field explicit (None: GREEDY). A
        version-1 program is told none: it makes its own greedy requests, and anything
        else is refused (UNSUPPORTED) rather than silently dropped."""
        if self.version >= 2:
            return {"sampling": (sampling or GREEDY).to_json()}
        if sampling is not None and sampling != GREEDY:
            raise UnsupportedOperation(f"{self.name}: a version-1 driver program is told no "
                                       f"sampling (protocol version 2 carries it)")
        return {}

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
        """Ask politely, then terminate, then kill; then end whatever the program left
        (its session, its token's carriers, their descendants) and verify none is left.
        Bounded (SHUTDOWN_REPLY_S + EXIT_GRACE_S + TERM_GRACE_S + KILL_VERIFY_S for the
        program, 2 x TERM_GRACE_S for what it left) and idempotent; every step beyond the
        polite one is a teardown note on the case."""
        proc = self._proc
        if proc is not None and not self._closing:
            self._closing = True
            # Taken while the program still runs: the parent chain finds a child that left
            # the session and scrubbed its environment, as long as the program is its parent.
            seen = process_tree.family(proc.pid, self._token)
            if proc.returncode is None:
                await self._stop_program(proc)
            await self._end_leftovers(proc.pid, seen)
            ownership.forget_program(proc.pid, self._token)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()
            transport = getattr(proc, "_transport", None)
            if transport is not None:  # pipes a leftover child held open: close our ends
                transport.close()
        if self._workdir is not None:
            self._workdir.cleanup()
            ownership.forget_dir(self._workdir.name)
            self._workdir = None

    def teardown_notes(self) -> list[str]:
        return list(self.leftovers)

    def diagnostics(self) -> str:
        return self._stderr.text()
