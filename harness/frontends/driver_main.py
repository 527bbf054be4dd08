"""A driver program: the reference frontend behind the subprocess driver protocol.

Run as `python -m harness.frontends.driver_main`. It proves the protocol end to end and is
the template for ports: read commands from stdin, answer on stdout, log to stderr.

COREWIRE_DRIVER_FAULT (or the argument `--fault SPEC`, so that faults can differ between
the frontends of one run) injects misbehaviour for the harness's own fault tests (several
may be combined, separated by commas): `exit_at_start`, `crash_on:CMD`, `hang_on:CMD`,
`garbage_on:CMD`, `stray_text_on:CMD`, `huge_line_on:CMD` (a 2 MiB line),
`wrong_id_on:CMD` (the reply names another id), `truncated_json_on:CMD` (a reply cut off
mid-object), `stray_mid_stream` (a non-JSON line right after a stream's first output event),
`grandchild:TAG` (leaves a child running in its process group), `setsid_grandchild:TAG`
(leaves a daemon that double-forked into its own session), `respawning_grandchild:TAG` (a child
that, on SIGTERM, starts a new daemon before exiting), `ignore_shutdown` (never answers
`shutdown`, ignores SIGTERM and the end of stdin), `flood_stderr:MB` (writes MB megabytes to
stderr at start),
`old_protocol` (a first-release program: none of the later capabilities, and a plain
"unknown command" error for later commands),
`plain_unknown:CMD` (every capability declared, but CMD answered with a plain "unknown
command" error), `bug_on:CMD` (CMD's handler raises an AttributeError: a bug of the program,
which exits with code 70 -- never an "unsupported" answer).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import traceback
from typing import Any

from harness.frontends.driver import ALL_CAPABILITIES, FrontendError, StreamHandle
from harness.frontends.driver_protocol import PROTOCOL, decode_line, encode_line
from harness.frontends.reference.frontend import ReferenceFrontend
from harness.timing import Timescale
from harness.wire import VLLM_0_33, codec_for

# What a first-release driver program declares (COREWIRE_DRIVER_FAULT=old_protocol).
OLD_CAPABILITIES = ("generate", "drop", "abort", "is_sleeping", "reset_prefix_cache",
                    "dp_rank", "stop_strings", "max_model_len", "block_size",
                    "num_gpu_blocks", "request_errors", "engine_death")


def fault_argument(argv: list[str]) -> str:
    """`--fault SPEC` from the command line ("" without one)."""
    if "--fault" in argv[:-1]:
        return argv[argv.index("--fault") + 1]
    return ""


def log(text: str) -> None:
    print(f"[driver_main] {text}", file=sys.stderr, flush=True)


class DriverProgram:
    def __init__(self) -> None:
        self.frontend: ReferenceFrontend | None = None
        self.streams: dict[str, StreamHandle] = {}
        self.fault = ",".join(filter(None, [os.environ.get("COREWIRE_DRIVER_FAULT", ""),
                                            fault_argument(sys.argv[1:])]))
        self.faults = [f for f in self.fault.split(",") if f]
        self.strayed = False  # stray_mid_stream: the stray line is written once
        self.tasks: dict[Any, asyncio.Task[None]] = {}  # command id -> its handler task

    def emit(self, message: dict[str, Any]) -> None:
        sys.stdout.buffer.write(encode_line(message))
        if ("stray_mid_stream" in self.faults and message.get("event") == "output"
                and not self.strayed):
            self.strayed = True
            log("injected stray stdout line mid-stream")
            sys.stdout.buffer.write(b"INFO loaded 3 adapters\n")
        sys.stdout.buffer.flush()

    def has(self, kind: str) -> list[str]:
        """The targets of every injected fault of this kind (`kind:target`)."""
        return [f.partition(":")[2] for f in self.faults if f.partition(":")[0] == kind]

    def _injected(self, cmd: str, cid: Any) -> bool:
        """Apply an injected fault for `cmd`; True if the command must not be answered."""
        if cmd == "shutdown" and "ignore_shutdown" in self.faults:
            log("injected: ignoring shutdown")
            return True
        kind = next((f.partition(":")[0] for f in self.faults if f.partition(":")[2] == cmd),
                    None)
        if kind == "crash_on":
            log(f"injected crash on {cmd}")
            os._exit(3)
        if kind == "hang_on":
            log(f"injected hang on {cmd}")
            return True
        if kind == "garbage_on":
            sys.stdout.buffer.write(b"\x00\xffnot json at all\n")
        elif kind == "huge_line_on":  # a 2 MiB protocol line: over the 1 MiB limit
            sys.stdout.buffer.write(b'{"pad": "' + b"x" * (2 << 20) + b'"}\n')
        elif kind == "stray_text_on":
            sys.stdout.buffer.write(b"some library printed this to stdout\n")
        elif kind == "wrong_id_on":
            sys.stdout.buffer.write(encode_line({"id": int(cid) + 1000, "ok": True}))
        elif kind == "truncated_json_on":
            sys.stdout.buffer.write(f'{{"id": {cid}, "ok": tr\n'.encode())
        else:
            return False
        sys.stdout.buffer.flush()
        return True

    def _plain_unknown(self, cmd: str) -> bool:
        """An older program's answer to a command it does not know (no `unsupported`)."""
        return (("old_protocol" in self.faults and cmd in ("utility", "cancel"))
                or cmd in self.has("plain_unknown"))

    async def handle(self, msg: dict[str, Any]) -> None:
        cid, cmd = msg.get("id"), str(msg.get("cmd"))
        if self._injected(cmd, cid):
            return
        if self._plain_unknown(cmd):
            self.emit({"id": cid, "ok": False, "error": f"unknown command {cmd!r}"})
            return
        handler = getattr(self, f"cmd_{cmd}", None)
        if cmd in self.has("bug_on"):
            handler = self.cmd_with_a_bug
        if handler is None:  # only an unknown command is "unsupported", never a bug
            self.emit({"id": cid, "ok": False, "unsupported": True,
                       "error": f"unknown command {cmd!r}"})
            return
        try:
            value = await handler(msg)
        except FrontendError as exc:
            self.emit({"id": cid, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
            return
        except asyncio.CancelledError:  # a `cancel` command: the harness gave up on it
            self.emit({"id": cid, "ok": False, "cancelled": True, "error": "cancelled"})
            return
        except Exception:  # a bug of this program: say so and exit (the harness: ERROR)
            log(f"internal error in `{cmd}`:\n{traceback.format_exc()}")
            os._exit(70)  # EX_SOFTWARE
        self.emit({"id": cid, "ok": True, **(value or {})})
        if cmd == "shutdown":
            raise SystemExit(0)

    async def cmd_with_a_bug(self, _msg: dict[str, Any]) -> None:
        """`bug_on:CMD`: the handler of CMD has a bug (it used to read as "unsupported")."""
        missing: Any = None
        missing.attribute_that_is_not_there  # noqa: B018 - the injected AttributeError

    def track(self, cid: Any, task: asyncio.Task[None]) -> None:
        """Remember the handler of command `cid` while it runs (for `cancel`)."""
        self.tasks[cid] = task

        def forget(_task: asyncio.Task[None]) -> None:
            self.tasks.pop(cid, None)

        task.add_done_callback(forget)

    def fe(self) -> ReferenceFrontend:
        if self.frontend is None:
            raise FrontendError("not initialised")
        return self.frontend

    async def cmd_init(self, msg: dict[str, Any]) -> dict[str, Any]:
        if msg.get("protocol") != PROTOCOL:
            raise FrontendError(f"unsupported protocol {msg.get('protocol')!r}")
        workdir = str(msg["workdir"])
        inputs, outputs = f"ipc://{workdir}/in.sock", f"ipc://{workdir}/out.sock"
        stats = msg.get("stats_address")
        # The harness's factor: init's `timescale`, else this program's COREWIRE_TIMESCALE.
        timescale = (Timescale(float(msg["timescale"])) if msg.get("timescale")
                     else Timescale.from_environment(os.environ))
        self.frontend = ReferenceFrontend([int(e["rank"]) for e in msg["engines"]],
                                          codec=codec_for(VLLM_0_33),  # what it speaks
                                          stats_address=str(stats) if stats else None,
                                          timescale=timescale)
        capabilities = (list(OLD_CAPABILITIES) if "old_protocol" in self.faults
                        else sorted(c.value for c in ALL_CAPABILITIES))
        reply: dict[str, Any] = {"name": "reference (subprocess)", "inputs": [inputs],
                                 "outputs": [outputs], "capabilities": capabilities}
        coordinator: tuple[str, str] | None = None
        if msg.get("handshake"):  # the frontend owns HELLO / INIT / READY
            reply["handshake"] = f"ipc://{workdir}/handshake.sock"
            if msg.get("coordinator"):  # ... and the DP coordinator INIT names
                coordinator = (f"ipc://{workdir}/coord-in.sock",
                               f"ipc://{workdir}/coord-out.sock")
                reply["coordinator"] = True
        self.frontend.bind(inputs, outputs, reply.get("handshake"), coordinator)
        return reply

    async def cmd_wait_ready(self, msg: dict[str, Any]) -> None:
        await self.fe().wait_ready(float(msg.get("timeout_s", 10.0)))

    async def cmd_generate(self, msg: dict[str, Any]) -> dict[str, Any]:
        handle = await self.fe().generate(msg["prompt"], int(msg["max_tokens"]),
                                          data_parallel_rank=msg.get("data_parallel_rank"),
                                          stop=msg.get("stop"),
                                          request_id=msg.get("request_id"),
                                          params=msg.get("params"))
        return self.attach(str(msg["stream"]), handle)

    async def cmd_open_session(self, msg: dict[str, Any]) -> dict[str, Any]:
        handle = await self.fe().open_session(msg["prompt"], int(msg["max_tokens"]),
                                              data_parallel_rank=msg.get("data_parallel_rank"))
        return self.attach(str(msg["stream"]), handle)

    async def cmd_continue_session(self, msg: dict[str, Any]) -> None:
        await self.fe().continue_session(self.session_id(msg), msg["prompt"],
                                         int(msg["max_tokens"]))

    async def cmd_close_session(self, msg: dict[str, Any]) -> None:
        await self.fe().close_session(self.session_id(msg))

    def session_id(self, msg: dict[str, Any]) -> str:
        handle = self.streams.get(str(msg["stream"]))
        if handle is None or handle.request_id is None:
            raise FrontendError(f"unknown session stream {msg['stream']!r}")
        return handle.request_id

    def attach(self, sid: str, handle: StreamHandle) -> dict[str, Any]:
        """Relay the stream's events from now on (and what it already holds)."""
        self.streams[sid] = handle
        handle.observer = lambda event, fields: self.emit({"event": event, "stream": sid,
                                                           **fields})
        if handle.tokens or handle.ended:  # progress made before the observer was attached
            self.emit({"event": "output", "stream": sid, "tokens": handle.tokens,
                       "text": handle.text})
            if handle.ended:
                self.emit({"event": "finished", "stream": sid,
                           "finish_reason": handle.finish_reason, "error": handle.error})
        return {"request_id": handle.request_id}

    async def cmd_drop(self, msg: dict[str, Any]) -> None:
        self.fe().drop([self.streams[s].request_id or "" for s in msg["streams"]
                        if s in self.streams])

    async def cmd_abort(self, msg: dict[str, Any]) -> None:
        await self.fe().abort(msg["request_ids"])

    async def cmd_is_sleeping(self, _msg: dict[str, Any]) -> dict[str, Any]:
        return {"value": await self.fe().is_sleeping()}

    async def cmd_reset_prefix_cache(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"value": await self.fe().reset_prefix_cache(
            bool(msg.get("reset_running_requests")), bool(msg.get("reset_connector")))}

    async def cmd_utility(self, msg: dict[str, Any]) -> dict[str, Any]:
        value = await self.fe().call_utility(str(msg["method"]), list(msg.get("args") or []))
        return {"value": sorted(value) if isinstance(value, (set, frozenset)) else value}

    async def cmd_cancel(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Cancel the handler of command `target`; the frontend unregisters its waiter."""
        task = self.tasks.get(msg.get("target"))
        found = task is not None and not task.done()
        if task is not None:
            task.cancel()
        return {"cancelled": found}

    async def cmd_observed_config(self, _msg: dict[str, Any]) -> dict[str, Any]:
        cfg = self.fe().core.config
        return {"value": {"max_model_len": cfg.max_model_len, "block_size": cfg.block_size,
                          "num_gpu_blocks": cfg.num_gpu_blocks}}

    async def cmd_shutdown(self, _msg: dict[str, Any]) -> None:
        if self.frontend is not None:
            await self.frontend.close()


def leave_children(program: DriverProgram) -> None:
    """The injected children a sloppy program leaves behind (they inherit stdout/stderr)."""
    for tag in program.has("grandchild"):  # in the program's process group
        child = subprocess.Popen([sys.executable, "-c",
                                  f"import time; time.sleep(300)  # {tag}"])
        log(f"injected grandchild pid {child.pid}")
    for tag in program.has("setsid_grandchild"):  # a daemon: new session, orphaned at once
        child = subprocess.Popen([sys.executable, "-c",
                                  "import os, time\nos.setsid()\nif os.fork() == 0:\n"
                                  "    print('ready', flush=True)\n"
                                  f"    time.sleep(300)  # {tag}\nos._exit(0)"],
                                 stdout=subprocess.PIPE)
        assert child.stdout is not None
        child.stdout.readline()  # the daemon runs, in its own session
        log("injected setsid grandchild")
    for tag in program.has("respawning_grandchild"):  # on SIGTERM: a new daemon, then exit
        child = subprocess.Popen([sys.executable, "-c", RESPAWNER.replace("TAG", tag)],
                                 stdout=subprocess.PIPE)
        assert child.stdout is not None
        child.stdout.readline()  # its SIGTERM handler is in place
        log("injected respawning grandchild")


RESPAWNER = """import signal, subprocess, sys, time
def respawn(*_):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)  # TAG"],
                     start_new_session=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, respawn)
print("ready", flush=True)
time.sleep(300)
"""


def flood_stderr(megabytes: float) -> None:
    line = b"[driver_main] flood " + b"." * 100 + b"\n"
    for _ in range(int(megabytes * (1 << 20)) // len(line)):
        sys.stderr.buffer.write(line)
    sys.stderr.buffer.write(b"[driver_main] flood done\n")
    sys.stderr.buffer.flush()


async def main() -> int:
    program = DriverProgram()
    if "exit_at_start" in program.faults:
        log("injected exit at start")
        return 4
    if "ignore_shutdown" in program.faults:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    leave_children(program)
    for size in program.has("flood_stderr"):
        flood_stderr(float(size))
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    pending: set[asyncio.Task[None]] = set()
    try:
        while True:
            line = await reader.readline()
            if not line:
                if "ignore_shutdown" in program.faults:
                    log("injected: stdin closed, staying up anyway")
                    await asyncio.sleep(3600)
                log("stdin closed; exiting")
                return 0
            message = decode_line(line)
            if message.get("cmd") == "shutdown":
                if pending:  # answer what is in flight first (bounded)
                    await asyncio.wait(pending, timeout=5.0)
                try:
                    await program.handle(message)
                except SystemExit:
                    return 0
                continue
            task = asyncio.create_task(program.handle(message))
            pending.add(task)
            task.add_done_callback(pending.discard)
            program.track(message.get("id"), task)
    finally:
        if program.frontend is not None:
            await program.frontend.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
