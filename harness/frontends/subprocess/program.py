"""The driver program: any in-process `FrontendDriver` behind the driver protocol.

Run as `python -m harness.frontends.subprocess.program [--frontend SPEC] [--fault SPEC]`
(SPEC: any frontend the registry builds in-process -- `reference`, the default, or
`mutant:NAME`, ...; never one that is itself a subprocess). It reads commands on stdin,
answers on stdout and logs to stderr (docs/driver-protocol.md) and maps every command onto
the driver's methods, so `--frontend reference-subprocess` runs the same frontend code as
`reference`, through the protocol; a port author can read it as the template. Faults for
the harness's own tests: `faults`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import sys
import tempfile
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO

from harness.frontends.api import (
    FrontendDriver,
    FrontendError,
    Sampling,
    StartupError,
    StartupHang,
    StreamHandle,
    UnsupportedOperation,
)
from harness.frontends.run_config import RunConfig
from harness.frontends.subprocess.faults import (
    Faults,
    exit_now,
    log,
    raise_a_bug,
    release_ipc_dirs,
)
from harness.frontends.subprocess.feed import CommandFeed
from harness.frontends.subprocess.protocol import (
    PROTOCOL,
    VERSION,
    decode_line,
    encode_line,
    model_facts,
)
from harness.frontends.subprocess.remote_engines import RemoteEngineSide, StartupBound
from harness.frontends.table import check_spec, make_driver, parse_frontend
from harness.protocol.timing import Timescale

EX_USAGE, EX_SOFTWARE = 64, 70
# The bound a driver's start reads until `wait_ready` settles it (see StartupBound).
PROVISIONAL_BOUND_S = 600.0
# How long the driver is held for `wait_ready` after init was answered (x timescale).
HOLD_S = 30.0
# How long `wait_ready` waits past its bound for the driver's own verdict (x timescale).
READY_GRACE_S = 0.25
# The longest workdir the driver's ipc dirs go into: a unix socket path has 107 bytes, the
# driver's dir and socket name take about 32 ("/cw-xxxxxxxx/coord-out-xxxxxxxx").
IPC_PATH_ROOM = 107 - 32
FAULT_POLL_S = 0.1

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]]


class AlreadyAnswered(Exception):
    """A handler that has written its reply itself (init: answered from inside start)."""


class ProgramUsageError(ValueError):
    """The program was started with a frontend it cannot serve."""


def in_process_driver(spec: str) -> FrontendDriver:
    """The driver this program serves; ProgramUsageError for a spec that is no in-process
    frontend (a subprocess would start yet another program; kv:/ec: are no frontends)."""
    try:
        parsed = parse_frontend(spec)
        check_spec(spec)
    except ValueError as exc:
        raise ProgramUsageError(str(exc)) from None
    if parsed.kind in ("subprocess", "reference-subprocess"):
        raise ProgramUsageError(f"--frontend {spec!r} is itself a driver program: this "
                                f"program serves an in-process driver (reference, "
                                f"mutant:NAME, vllm-py, ...)")
    if parsed.kind in ("kv", "ec"):
        raise ProgramUsageError(f"--frontend {spec!r} is a component unit, not a frontend")
    return make_driver(RunConfig(spec))  # its time scale comes with `init`


class DriverProgram:
    """One driver behind the protocol: commands in, replies and stream events out."""

    def __init__(self, driver: FrontendDriver, faults: Faults, out: BinaryIO,
                 feed: CommandFeed) -> None:
        self.driver = driver
        self.faults = faults
        self.out = out
        self.feed = feed
        self.streams: dict[str, StreamHandle] = {}
        self.tasks: dict[Any, asyncio.Task[None]] = {}  # command id -> its handler task
        self.start_task: asyncio.Task[None] | None = None
        self.timescale = 1.0
        self.version = 1  # the protocol version agreed in `init`
        self.closing = False
        # The startup commands the loop has taken already (`hold` must not wait for them).
        self.taken: dict[str, dict[str, Any]] = {}

    def emit(self, message: dict[str, Any]) -> None:
        self.out.write(encode_line(message))
        self.faults.after_emit(message, self.out)
        self.out.flush()

    def handler(self, cmd: str) -> Handler | None:
        if self.faults.buggy(cmd):
            return _buggy
        found: Handler | None = getattr(self, f"cmd_{cmd}", None)
        return found

    async def handle(self, msg: dict[str, Any]) -> None:
        cid, cmd = msg.get("id"), str(msg.get("cmd"))
        if self.faults.intercept(cmd, cid, self.out):
            return
        msg = self.faults.rewrite(cmd, msg)
        if self.faults.plain_unknown(cmd):
            self.emit({"id": cid, "ok": False, "error": f"unknown command {cmd!r}"})
            return
        handler = self.handler(cmd)
        if handler is None:  # only an unknown command is "unsupported", never a bug
            self.emit({"id": cid, "ok": False, "unsupported": True,
                       "error": f"unknown command {cmd!r}"})
            return
        try:
            value = await handler(msg)
        except AlreadyAnswered:
            return
        except UnsupportedOperation as exc:  # the driver cannot do it: UNSUPPORTED
            self.emit({"id": cid, "ok": False, "unsupported": True, "error": str(exc)})
            return
        except FrontendError as exc:  # the frontend refused or failed: a graded outcome
            self.emit({"id": cid, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
            return
        except asyncio.CancelledError:  # a `cancel` command: the harness gave up on it
            self.emit({"id": cid, "ok": False, "cancelled": True, "error": "cancelled"})
            return
        except Exception:  # a bug of this program or its driver: say so and exit (ERROR)
            log(f"internal error in `{cmd}`:\n{traceback.format_exc()}")
            exit_now(EX_SOFTWARE)
        self.emit({"id": cid, "ok": True, **(value or {})})

    def track(self, cid: Any, task: asyncio.Task[None]) -> None:
        """Remember the handler of command `cid` while it runs (for `cancel`)."""
        self.tasks[cid] = task

        def forget(_task: asyncio.Task[None]) -> None:
            self.tasks.pop(cid, None)

        task.add_done_callback(forget)

    # ------------------------------------------------------------------ startup

    async def cmd_init(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        """Start the driver in a task against the harness's engines: its start answers init
        from inside (RemoteEngineSide) and goes on waiting; `wait_ready` awaits the task."""
        if msg.get("protocol") != PROTOCOL:
            raise FrontendError(f"unsupported protocol {msg.get('protocol')!r}")
        if self.start_task is not None:
            raise FrontendError("init was already received")
        self.version = self.faults.version(agreed_version(msg.get("version")))
        if self.version >= 2:
            check_model(msg.get("model"))
        self.timescale = float(msg.get("timescale") or 1.0)
        self.driver.with_timescale(Timescale(self.timescale))  # every bound of the driver's
        use_workdir(str(msg.get("workdir") or ""))
        cid = msg.get("id")
        answered = asyncio.Event()

        def answer(addresses: dict[str, Any]) -> None:  # called from inside the driver's start
            self.answer_init(cid, addresses)
            answered.set()

        bound = StartupBound(PROVISIONAL_BOUND_S * self.timescale)
        stats = msg.get("stats_address")
        side = RemoteEngineSide(
            [int(e["rank"]) for e in msg["engines"]], str(stats) if stats else None,
            handshake=bool(msg.get("handshake")),
            coordinated=bool(msg.get("handshake") and msg.get("coordinator")), bound=bound,
            answer=answer, hold=self.hold)
        self.start_task = task = asyncio.create_task(self.driver.start(side, bound))
        waiter = asyncio.create_task(answered.wait())
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        await _cancelled(waiter)
        if answered.is_set():
            raise AlreadyAnswered
        task.result()  # start ended before asking for the engines: its error is the answer
        raise StartupError(f"{self.driver.name}: start returned without starting the engines")

    def answer_init(self, cid: Any, addresses: dict[str, Any]) -> None:
        self.emit({"id": cid, "ok": True, "name": f"{self.driver.name} (subprocess)",
                   **addresses, **self.faults.version_field(self.version),
                   "capabilities": self.faults.capabilities(self.driver.capabilities)})

    def hold(self) -> float:
        """Until the harness's `wait_ready` is in: its bound (the driver waits from now)."""
        limit = HOLD_S * self.timescale
        message = (self.taken.get("shutdown") or self.taken.get("wait_ready")
                   or self.feed.look_ahead(("wait_ready", "shutdown"), limit))
        if message is None or message.get("cmd") != "wait_ready":
            why = ("shutdown came first" if message is not None
                   else f"stdin closed or nothing came within {limit:.0f} s")
            raise StartupError(f"the harness sent no `wait_ready` after init ({why})")
        return float(message.get("timeout_s", 10.0))

    async def cmd_wait_ready(self, msg: dict[str, Any]) -> None:
        if self.start_task is None:
            raise FrontendError("not initialised")
        seconds = float(msg.get("timeout_s", 10.0))
        try:
            await asyncio.wait_for(asyncio.shield(self.start_task),
                                   seconds + READY_GRACE_S * self.timescale)
        except TimeoutError:
            await _cancelled(self.start_task)
            raise StartupHang(f"{self.driver.name} was not ready within {seconds:.1f}s and "
                              f"kept waiting") from None

    # ------------------------------------------------------------------ streams

    async def cmd_generate(self, msg: dict[str, Any]) -> dict[str, Any]:
        handle = await self.driver.generate(msg["prompt"], int(msg["max_tokens"]),
                                            data_parallel_rank=msg.get("data_parallel_rank"),
                                            stop=msg.get("stop"),
                                            request_id=msg.get("request_id"),
                                            params=msg.get("params"), **self.sampling(msg))
        return self.attach(str(msg["stream"]), handle)

    async def cmd_open_session(self, msg: dict[str, Any]) -> dict[str, Any]:
        handle = await self.driver.open_session(
            msg["prompt"], int(msg["max_tokens"]),
            data_parallel_rank=msg.get("data_parallel_rank"), **self.sampling(msg))
        return self.attach(str(msg["stream"]), handle)

    def sampling(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The client's sampling (version 2) as the driver's keyword, only when sent: a
        driver written before `sampling` keeps its signature. The in-process driver refuses
        what it cannot honour (UNSUPPORTED); a version-1 program is never sent one."""
        if "sampling" not in msg:
            return {}
        if self.version < 2:
            self.faults.refuse_newer_field(msg, "sampling")
        try:
            return {"sampling": Sampling.from_json(msg["sampling"])}
        except (TypeError, ValueError) as exc:
            raise FrontendError(f"bad `sampling`: {exc}") from None

    async def cmd_continue_session(self, msg: dict[str, Any]) -> None:
        await self.driver.continue_session(self.session(msg), msg["prompt"],
                                           int(msg["max_tokens"]))

    async def cmd_close_session(self, msg: dict[str, Any]) -> None:
        await self.driver.close_session(self.session(msg))

    def session(self, msg: dict[str, Any]) -> StreamHandle:
        handle = self.streams.get(str(msg["stream"]))
        if handle is None:
            raise FrontendError(f"unknown session stream {msg['stream']!r}")
        return handle

    def attach(self, sid: str, handle: StreamHandle) -> dict[str, Any]:
        """Relay the stream's events from now on, after what it already holds (a driver may
        have filled the handle before returning it); one stream's events keep their order."""
        self.streams[sid] = handle
        if handle.tokens or handle.ended:
            self.emit({"event": "output", "stream": sid, "tokens": handle.tokens,
                       "text": handle.text})
            if handle.ended:
                self.emit({"event": "finished", "stream": sid,
                           "finish_reason": handle.finish_reason, "error": handle.error})
        handle.observer = lambda event, fields: self.emit({"event": event, "stream": sid,
                                                           **fields})
        return {"request_id": handle.request_id}

    async def cmd_drop(self, msg: dict[str, Any]) -> None:
        await self.driver.drop([self.streams[s] for s in msg["streams"] if s in self.streams])

    async def cmd_abort(self, msg: dict[str, Any]) -> None:
        await self.driver.abort(msg["request_ids"])

    # ------------------------------------------------------------------ calls

    async def cmd_is_sleeping(self, _msg: dict[str, Any]) -> dict[str, Any]:
        return {"value": await self.driver.is_sleeping()}

    async def cmd_reset_prefix_cache(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"value": await self.driver.reset_prefix_cache(
            bool(msg.get("reset_running_requests")), bool(msg.get("reset_connector")))}

    async def cmd_utility(self, msg: dict[str, Any]) -> dict[str, Any]:
        value = await self.driver.call_utility(str(msg["method"]), list(msg.get("args") or []))
        return {"value": sorted(value) if isinstance(value, (set, frozenset)) else value}

    async def cmd_cancel(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Cancel the handler of command `target`; the driver unregisters its waiter."""
        task = self.tasks.get(msg.get("target"))
        found = task is not None and not task.done()
        if task is not None:
            task.cancel()
        return {"cancelled": found}

    async def cmd_observed_config(self, _msg: dict[str, Any]) -> dict[str, Any]:
        return {"value": dataclasses.asdict(await self.driver.observed_config())}

    async def cmd_shutdown(self, _msg: dict[str, Any]) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the driver (bounded by the driver; idempotent)."""
        self.closing = True
        if self.start_task is not None:
            await _cancelled(self.start_task)
        await self.driver.shutdown()

    async def watch_driver(self) -> None:
        """A fault of the driver itself (a background task of its frontend that died) is a
        fault of this program: exit, so the harness grades ERROR instead of a timeout."""
        while not self.closing:
            fault = self.driver.fault()
            if fault is not None and not self.closing:
                log(f"the driver failed: {fault}")
                exit_now(EX_SOFTWARE)
            await asyncio.sleep(FAULT_POLL_S)


async def _buggy(msg: dict[str, Any]) -> None:
    raise_a_bug(msg)


def agreed_version(offered: Any) -> int:
    """The version this program speaks with a harness that offered `offered` (absent: a
    first-release harness, 1): the newer of both sides' common versions."""
    if offered is None:
        return 1
    if type(offered) is not int or offered < 1:
        raise FrontendError(f"init: `version` must be a positive integer, got {offered!r}")
    return min(offered, VERSION)


def check_model(model: Any) -> None:
    """The in-process frontends serve harness.protocol.vocab's tiny model: a version-2 `init` naming
    another (an EOS id they would not put on the ADD) is refused, never half-honoured."""
    if not isinstance(model, dict):
        raise FrontendError(f"init: a version-2 `model` must be an object, got {model!r}")
    ours = model_facts()
    differ = sorted(k for k in ("eos_token_id", "special_token_ids", "token_text")
                    if model.get(k) != ours[k])
    if differ:
        raise FrontendError(f"init: the in-process frontends serve the tiny model "
                            f"({', '.join(f'{k}={ours[k]!r}' for k in differ)}); asked for "
                            f"{', '.join(f'{k}={model.get(k)!r}' for k in differ)}")


async def _cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel `task` (if still running) and collect its outcome, whatever it was."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


def use_workdir(workdir: str) -> None:
    """Let the driver's private ipc dirs live inside the harness's workdir (removed by the
    harness even after a SIGKILL), when socket paths there stay short enough; elsewhere
    every exit of the program removes them (`exit_now`)."""
    if workdir and os.path.isdir(workdir) and len(workdir) <= IPC_PATH_ROOM:
        tempfile.tempdir = workdir


def claim_stdout() -> BinaryIO:
    """The protocol's stream, a private copy of stdout; fd 1 and sys.stdout go to stderr
    from now on, so nothing a driver or library prints can break the protocol."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.frontends.subprocess.program",
                                     description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--frontend", default="reference",
                        help="the in-process frontend to serve (default: reference)")
    parser.add_argument("--fault", default="", help="faults to inject (see faults.py)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    out = claim_stdout()
    faults = Faults.from_environment(args.fault)
    code = faults.at_start(out)
    if code is not None:
        return code
    try:
        driver = in_process_driver(args.frontend)
    except ProgramUsageError as exc:
        log(f"usage: {exc}")
        return EX_USAGE
    feed = CommandFeed(sys.stdin.fileno(), asyncio.get_running_loop())
    feed.start()
    program = DriverProgram(driver, faults, out, feed)
    watcher = asyncio.create_task(program.watch_driver())
    pending: set[asyncio.Task[None]] = set()
    try:
        while True:
            line = await feed.next_line()
            if line is None:
                if "ignore_shutdown" in faults:
                    log("injected: stdin closed, staying up anyway")
                    await asyncio.sleep(3600)
                log("stdin closed; exiting")
                return 0
            message = decode_line(line)
            if message.get("cmd") in ("wait_ready", "shutdown"):
                program.taken[str(message["cmd"])] = message
            if message.get("cmd") == "shutdown":
                if pending:  # answer what is in flight first (bounded)
                    await asyncio.wait(pending, timeout=5.0)
                await program.handle(message)
                if program.closing:  # answered (not an injected hang or ignore)
                    return 0
                continue
            task = asyncio.create_task(program.handle(message))
            pending.add(task)
            task.add_done_callback(pending.discard)
            program.track(message.get("id"), task)
    finally:
        await program.close()
        await _cancelled(watcher)
        release_ipc_dirs()


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(serve(arguments(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
