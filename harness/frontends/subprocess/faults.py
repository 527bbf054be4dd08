"""Misbehaviour injected into the driver program, for the harness's own fault tests.

`COREWIRE_DRIVER_FAULT` (or `--fault SPEC`, so that faults can differ between the frontends
of one run) holds one or more faults separated by commas:

- `exit_at_start` (exit code 4 before reading anything), `crash_on:CMD` (exit code 3 when
  CMD arrives), `hang_on:CMD` (CMD is never answered);
- stdout broken on CMD instead of its reply: `garbage_on:CMD`, `stray_text_on:CMD`,
  `huge_line_on:CMD` (a 2 MiB line), `wrong_id_on:CMD` (the reply names another id),
  `truncated_json_on:CMD` (a reply cut off mid-object); `stray_mid_stream` (a non-JSON line
  right after a stream's first output event); `bad_after_output:KIND` and
  `bad_after_finished:KIND`, JSON that parses but breaks the protocol's shapes, written once
  right after a stream's first output event or its `finished` event, KIND one of
  `huge_int` (a 5000-digit integer), `deep` (100k nested arrays), `list_id` (`"id": [3]`),
  `null_tokens` (what a Go driver writes for an empty slice), `nan_tokens` (`[NaN]`);
- processes left behind: `grandchild:TAG` (a child in the program's process group, holding
  its stdout), `setsid_grandchild:TAG` (a daemon that double-forked into its own session),
  `respawning_grandchild:TAG` (a child that, on SIGTERM, starts a new daemon before exiting);
- `ignore_shutdown` (never answers `shutdown`, ignores SIGTERM and the end of stdin),
  `flood_stderr:MB` (writes MB megabytes to stderr at start);
- what a hostile frontend asks for (the harness's memory and report bounds): `oversize:KIND`
  rewrites every `generate` before the frontend sees it, KIND one of `max_tokens` (10**9
  tokens), `prompt` (an 8 MiB prompt), `request_id` (a 1 MiB request id);
- older or buggy programs: `old_protocol` (a first-release program: none of the later
  capabilities, a plain "unknown command" error for later commands, protocol version 1),
  `protocol_v1` (every capability, but a version-1 program: its `init` reply names no
  `version`, and a version-2 field sent to it anyway fails the command), `version:JSON`
  (the `init` reply's `version` is JSON, e.g. `version:3` or `version:"2"`), `plain_unknown:CMD`
  (every capability declared, but CMD answered with a plain "unknown command" error),
  `bug_on:CMD` (CMD's handler raises an AttributeError: a bug of the program, which exits
  with code 70 -- never an "unsupported" answer).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence
from types import FrameType
from typing import Any, BinaryIO, NoReturn

from harness.frontends.api import Capability, FrontendError
from harness.frontends.subprocess.protocol import encode_line
from harness.hygiene import ownership
from harness.protocol.transport.endpoints import PrivateIpcDir

FAULT_VARIABLE = "COREWIRE_DRIVER_FAULT"
# What a first-release driver program declares (the `old_protocol` fault).
OLD_CAPABILITIES = ("generate", "drop", "abort", "is_sleeping", "reset_prefix_cache",
                    "dp_rank", "stop_strings", "max_model_len", "block_size",
                    "num_gpu_blocks", "request_errors", "engine_death")
# Commands a first-release program does not know.
LATER_COMMANDS = ("utility", "cancel")
EXIT_AT_START = 4
EXIT_CRASH = 3
OVERSIZE_MAX_TOKENS = 10**9
OVERSIZE_BYTES = 8 << 20


def log(text: str) -> None:
    """The program's log line (stderr: stdout carries only protocol messages)."""
    print(f"[driver program] {text}", file=sys.stderr, flush=True)


def release_ipc_dirs() -> None:
    """Remove the private ipc dirs the driver still holds (a graceful shutdown has already
    removed them; an abrupt exit must not leave them behind)."""
    for path in sorted(ownership.LIVE_IPC_DIRS):
        PrivateIpcDir.remove(path)


def exit_now(code: int) -> NoReturn:
    """Exit at once (no cleanup of the driver, no flushing): only the ipc dirs go."""
    release_ipc_dirs()
    os._exit(code)


def on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    """SIGTERM ends the program as its default action would, without leaving ipc dirs."""
    exit_now(128 + signal.SIGTERM)


def ignore_sigterm(_signum: int, _frame: FrameType | None) -> None:
    """`ignore_shutdown`: SIGTERM is ignored (the ipc dirs still go: SIGKILL comes next)."""
    release_ipc_dirs()
    log("injected: ignoring SIGTERM")


class Faults:
    """The faults injected into this run of the program (none in normal use)."""

    def __init__(self, spec: str = "") -> None:
        self.items = [f for f in spec.split(",") if f]
        self._strayed = False  # stray_mid_stream: the stray line is written once
        self._bad_written: set[str] = set()  # bad_after_*: each written once

    @classmethod
    def from_environment(cls, argument: str = "") -> Faults:
        """COREWIRE_DRIVER_FAULT and the `--fault` argument together."""
        return cls(",".join(filter(None, [os.environ.get(FAULT_VARIABLE, ""), argument])))

    def __contains__(self, name: str) -> bool:
        return name in self.items

    def targets(self, kind: str) -> list[str]:
        """The targets of every injected fault of this kind (`kind:target`)."""
        return [f.partition(":")[2] for f in self.items if f.partition(":")[0] == kind]

    # ------------------------------------------------------------------ per command

    def intercept(self, cmd: str, cid: Any, out: BinaryIO) -> bool:
        """Apply an injected fault for `cmd`; True if the command must not be answered."""
        if cmd == "shutdown" and "ignore_shutdown" in self.items:
            log("injected: ignoring shutdown")
            return True
        kind = next((f.partition(":")[0] for f in self.items if f.partition(":")[2] == cmd),
                    None)
        if kind == "crash_on":
            log(f"injected crash on {cmd}")
            exit_now(EXIT_CRASH)
        if kind == "hang_on":
            log(f"injected hang on {cmd}")
            return True
        if kind == "garbage_on":
            out.write(b"\x00\xffnot json at all\n")
        elif kind == "huge_line_on":  # a 2 MiB protocol line: over the 1 MiB limit
            out.write(b'{"pad": "' + b"x" * (2 << 20) + b'"}\n')
        elif kind == "stray_text_on":
            out.write(b"some library printed this to stdout\n")
        elif kind == "wrong_id_on":
            out.write(encode_line({"id": int(cid) + 1000, "ok": True}))
        elif kind == "truncated_json_on":
            out.write(f'{{"id": {cid}, "ok": tr\n'.encode())
        else:
            return False
        out.flush()
        return True

    def rewrite(self, cmd: str, msg: dict[str, Any]) -> dict[str, Any]:
        """`oversize:KIND`: the `generate` the frontend receives asks for far too much."""
        kinds = self.targets("oversize")
        if cmd != "generate" or not kinds:
            return msg
        msg = dict(msg)
        for kind in kinds:
            if kind == "max_tokens":
                msg["max_tokens"] = OVERSIZE_MAX_TOKENS
            elif kind == "prompt":
                msg["prompt"] = "x" * OVERSIZE_BYTES
            elif kind == "request_id":
                msg["request_id"] = "r" * (OVERSIZE_BYTES // 8)
            else:
                raise ValueError(f"unknown oversize fault {kind!r}")
        log(f"injected: oversize {'+'.join(kinds)} on generate")
        return msg

    def plain_unknown(self, cmd: str) -> bool:
        """An older program's answer to a command it does not know (no `unsupported`)."""
        return (("old_protocol" in self.items and cmd in LATER_COMMANDS)
                or cmd in self.targets("plain_unknown"))

    def buggy(self, cmd: str) -> bool:
        """`bug_on:CMD`: the handler of CMD has a bug (see `raise_a_bug`)."""
        return cmd in self.targets("bug_on")

    def after_emit(self, message: dict[str, Any], out: BinaryIO) -> None:
        """`stray_mid_stream`: a library's line right after a stream's first output;
        `bad_after_output` / `bad_after_finished`: a badly shaped line after the event."""
        if ("stray_mid_stream" in self.items and message.get("event") == "output"
                and not self._strayed):
            self._strayed = True
            log("injected stray stdout line mid-stream")
            out.write(b"INFO loaded 3 adapters\n")
        event = message.get("event")
        for kind in self.targets(f"bad_after_{event}"):
            if kind not in self._bad_written:
                self._bad_written.add(kind)
                log(f"injected badly shaped line after {event}: {kind}")
                out.write(bad_line(kind, str(message.get("stream"))))

    def version(self, agreed: int) -> int:
        """The protocol version the program speaks: a first-release program's is 1."""
        return 1 if {"old_protocol", "protocol_v1"} & set(self.items) else agreed

    def version_field(self, version: int) -> dict[str, Any]:
        """The `init` reply's version: none from a first-release program (it did not know
        the field), the injected JSON under `version:JSON`."""
        for value in self.targets("version"):
            return {"version": json.loads(value)}
        if version < 2 and {"old_protocol", "protocol_v1"} & set(self.items):
            return {}
        return {"version": version}

    def refuse_newer_field(self, message: dict[str, Any], name: str) -> None:
        """A strict first-release program fails a command carrying a field it never heard
        of (what corewire must never send it)."""
        if {"old_protocol", "protocol_v1"} & set(self.items):
            log(f"a version-1 program got `{name}` on `{message.get('cmd')}`")
            raise FrontendError(f"unexpected field `{name}` (this program speaks version 1)")

    def capabilities(self, declared: Iterable[Capability]) -> list[str]:
        """What the program declares at init: its driver's capabilities, or a first
        release's under `old_protocol`."""
        if "old_protocol" in self.items:
            return list(OLD_CAPABILITIES)
        return sorted(c.value for c in declared)

    # ------------------------------------------------------------------ at start

    def at_start(self, out: BinaryIO) -> int | None:
        """Faults that act before any command; an exit code to exit with at once, or None."""
        if "exit_at_start" in self.items:
            log("injected exit at start")
            return EXIT_AT_START
        signal.signal(signal.SIGTERM, ignore_sigterm if "ignore_shutdown" in self.items
                      else on_sigterm)
        leave_children(self, out)
        for size in self.targets("flood_stderr"):
            flood_stderr(float(size))
        return None


def bad_line(kind: str, stream: str) -> bytes:
    """One line of JSON that parses (with Python's lenient decoder) but has a wrong shape."""
    lines = {
        "huge_int": b'{"id": ' + b"7" * 5000 + b', "ok": true}',
        "deep": b'{"id": 1, "ok": true, "value": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "list_id": b'{"id": [3], "ok": true}',
        "null_tokens": encode_line({"event": "output", "stream": stream,
                                    "tokens": None}).rstrip(),
        "nan_tokens": b'{"event": "output", "stream": "' + stream.encode()
                      + b'", "tokens": [NaN]}',
    }
    return lines[kind] + b"\n"


def raise_a_bug(_message: dict[str, Any]) -> None:
    """The handler of a `bug_on` command: an AttributeError, as a real bug would raise."""
    missing: Any = None
    missing.attribute_that_is_not_there  # noqa: B018 - the injected AttributeError


def leave_children(faults: Faults, out: BinaryIO) -> None:
    """The injected children a sloppy program leaves behind (they inherit stderr)."""
    for tag in faults.targets("grandchild"):  # in the program's group, holding its stdout
        child = spawn([sys.executable, "-c", f"import time; time.sleep(300)  # {tag}"],
                      stdout=out.fileno())
        log(f"injected grandchild pid {child.pid}")
    for tag in faults.targets("setsid_grandchild"):  # a daemon: new session, orphaned at once
        spawn_and_wait_ready([sys.executable, "-c",
                              "import os, time\nos.setsid()\nif os.fork() == 0:\n"
                              "    print('ready', flush=True)\n"
                              f"    time.sleep(300)  # {tag}\nos._exit(0)"])
        log("injected setsid grandchild")
    for tag in faults.targets("respawning_grandchild"):  # on SIGTERM: a new daemon, then exit
        spawn_and_wait_ready([sys.executable, "-c", RESPAWNER.replace("TAG", tag)])
        log("injected respawning grandchild")


def spawn(argv: Sequence[str], stdout: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(argv), stdout=stdout)


def spawn_and_wait_ready(argv: Sequence[str]) -> None:
    """Start a child and wait for its "ready" line (it runs, its handlers are in place)."""
    child = subprocess.Popen(list(argv), stdout=subprocess.PIPE)
    assert child.stdout is not None
    child.stdout.readline()


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
    line = b"[driver program] flood " + b"." * 100 + b"\n"
    for _ in range(int(megabytes * (1 << 20)) // len(line)):
        sys.stderr.buffer.write(line)
    sys.stderr.buffer.write(b"[driver program] flood done\n")
    sys.stderr.buffer.flush()
