"""The driver program's OS process: spawned, watched, stopped, and cleaned up after.

Everything here is about the process, not the protocol spoken over its pipes: starting it
in its own session with a token its descendants inherit, noticing its exit even while a
child holds stdout open, stopping it politely then by signal, and ending (and verifying
gone) every process it left behind. `ProgramProcess` is the base of `SubprocessDriver`
(driver.py), which provides the protocol side (the attributes and hooks below); the
teardown notes it writes are parsed back here for the run summary (`stuck_seconds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from harness.frontends.api import DriverFault, FrontendDriver
from harness.frontends.subprocess.protocol import MAX_LINE
from harness.frontends.subprocess.stderr_capture import StderrCapture
from harness.hygiene import ownership, process_tree

# Teardown bounds (seconds, before the time-scale factor): the reply to `shutdown`, the exit
# after it, the exit after SIGTERM, and SIGKILL's verification. At most 9 s in all.
SHUTDOWN_REPLY_S = 3.0
EXIT_GRACE_S = 2.0
TERM_GRACE_S = 2.0
KILL_VERIFY_S = 2.0
# After the program exits, how long stdout may still deliver its last lines before the exit
# itself is the fault (a child holding stdout open must not hide the exit).
EXIT_DRAIN_S = 0.3
# The teardown note of a program that had to be terminated; the run summary adds up the
# seconds (`stuck_seconds`).
STUCK_NOTE = re.compile(r"driver (?:did not exit on `shutdown`|ignored|answered `shutdown` but)"
                        r".*? after ([0-9.]+) s")


def stuck_seconds(note: str) -> float | None:
    """The teardown time lost to a driver that would not stop, from its case note."""
    found = STUCK_NOTE.search(note)
    return float(found.group(1)) if found else None


def stuck_driver_warning(notes_by_case: Mapping[str, Sequence[str]]) -> str | None:
    """One run-level line: how many cases' drivers would not stop, and the time it cost."""
    lost = {case: sum(v for v in map(stuck_seconds, notes) if v is not None)
            for case, notes in notes_by_case.items()}
    lost = {case: seconds for case, seconds in lost.items() if seconds}
    if not lost:
        return None
    worst = ", ".join(sorted(lost, key=lambda c: -lost[c])[:3])
    return (f"WARNING: {len(lost)} case(s) had a driver that would not stop when asked "
            f"(ignored `shutdown` or SIGTERM): {sum(lost.values()):.1f} s lost in teardown "
            f"(e.g. {worst}; see their teardown notes)")



class DriverProgramFault(DriverFault):
    """The driver program crashed, exited, or broke the protocol (graded ERROR)."""



class ProgramProcess(FrontendDriver):
    """The process side of `SubprocessDriver` (which provides the attributes below)."""

    argv: list[str]
    env: dict[str, str] | None
    leftovers: list[str]  # what teardown had to clean up after the program
    _proc: asyncio.subprocess.Process | None
    _workdir: tempfile.TemporaryDirectory[str] | None
    _token: str  # carried by the program and every descendant (process_tree.TOKEN_VAR)
    _stderr: StderrCapture
    _tasks: list[asyncio.Task[None]]  # stdout, stderr and exit watchers
    _fault: DriverFault | None

    async def _read_stdout(self) -> None:
        raise NotImplementedError

    def _set_fault(self, fault: DriverFault) -> None:
        raise NotImplementedError

    def _pending_text(self) -> str:
        raise NotImplementedError

    async def _command(self, cmd: str, timeout: float | None = None, **args: Any
                       ) -> dict[str, Any]:
        raise NotImplementedError

    async def _spawn(self) -> None:
        self._workdir = tempfile.TemporaryDirectory(prefix="cw-drv-")
        os.chmod(self._workdir.name, 0o700)
        # Recorded where a later run finds them if this process dies before teardown.
        ownership.record_dir(self._workdir.name)
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, limit=MAX_LINE + 2, start_new_session=True,
            preexec_fn=process_tree.become_subreaper,  # orphans stay its descendants
            env={**os.environ, **self.timescale.child_env(), **(self.env or {}),
                 process_tree.TOKEN_VAR: self._token})
        ownership.record_program(self._proc.pid, self._token)
        assert self._proc.stderr is not None
        self._tasks = [asyncio.create_task(self._read_stdout()),
                       asyncio.create_task(self._stderr.read_from(self._proc.stderr)),
                       asyncio.create_task(self._watch_exit())]

    async def _watch_exit(self) -> None:
        """The program's exit is a fault even while a child of it still holds stdout open
        (no EOF would ever come): the last lines get EXIT_DRAIN_S to arrive first."""
        assert self._proc is not None
        while self._proc.returncode is None:
            await asyncio.sleep(0.05)
        code = self._proc.returncode
        await asyncio.sleep(self.scaled(EXIT_DRAIN_S))
        self._set_fault(DriverProgramFault(f"driver exited (code {code}) "
                                    f"{self._pending_text()}".rstrip()))

    async def _wait_exit(self, timeout: float) -> int | None:
        """The exit code once the program has exited, None after `timeout`. Polled: on
        Python 3.11 `Process.wait()` also waits for every pipe to close, which a child of
        the program holding stdout or stderr open delays indefinitely."""
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while self._proc.returncode is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self._proc.returncode

    async def _stop_program(self, proc: asyncio.subprocess.Process) -> None:
        """`shutdown` (unless the program is already faulty), SIGTERM, SIGKILL; a program
        that needed more than the polite step is noted with the seconds it cost."""
        started = time.monotonic()
        asked = answered = False
        if self._fault is None:
            asked = True
            with contextlib.suppress(Exception):
                await self._command("shutdown", timeout=self.scaled(SHUTDOWN_REPLY_S))
                answered = True
            if await self._wait_exit(self.scaled(EXIT_GRACE_S)) is not None:
                return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        if await self._wait_exit(self.scaled(TERM_GRACE_S)) is not None:
            if asked:
                what = ("answered `shutdown` but did not exit" if answered
                        else "did not exit on `shutdown`")
                self.leftovers.append(f"driver {what}; ended by SIGTERM after "
                                      f"{time.monotonic() - started:.1f} s")
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        code = await self._wait_exit(self.scaled(KILL_VERIFY_S))
        what = ("answered `shutdown` but ignored it and SIGTERM" if answered
                else "ignored `shutdown` and SIGTERM" if asked
                else "ignored SIGTERM (sent after its fault)")
        self.leftovers.append(f"driver {what}; killed (SIGKILL) after "
                              f"{time.monotonic() - started:.1f} s"
                              + ("" if code is not None else "; STILL RUNNING"))

    async def _end_leftovers(self, pid: int, seen: dict[int, process_tree.ProcessInfo]
                             ) -> None:
        """Processes the program left (its children in its group, daemons that called
        setsid(), their children): SIGTERM, then SIGKILL; a fresh scan then finds what came
        back (a daemon that answers SIGTERM with a new copy of itself, in a new session,
        re-exec'd), which is stopped, scanned again and killed (process_tree.stop_and_kill);
        a last scan verifies that none is left. Noted on the case."""
        grace = self.scaled(TERM_GRACE_S)
        left = {p: info for p, info in {**seen, **process_tree.family(pid, self._token)
                                        }.items() if p != pid}
        if not left:
            return  # everything had already gone with the program
        first = await process_tree.end_all(left.values(), grace)
        ended = first.terminated + first.killed + first.survivors
        killed = len(first.killed)
        seconds = first.seconds

        def rest() -> list[process_tree.ProcessInfo]:
            found = [info for p, info in process_tree.family(pid, self._token).items()
                     if p != pid]
            left.update((info.pid, info) for info in found)
            return found

        respawned: list[int] = []
        survivors: list[int] = []
        if rest():  # came back, or would not go
            second = await process_tree.stop_and_kill(rest, grace)
            respawned = [p for p in second.killed + second.survivors if p not in ended]
            survivors = second.survivors
            seconds += second.seconds
            ended += respawned
        survivors = sorted(set(survivors) | {info.pid for info in rest()})
        outside = [p for p in ended if left[p].sid != pid]
        self.leftovers.append(
            f"driver left {len(ended)} process(es) behind (pids {sorted(ended)}"
            + (f"; {sorted(outside)} had left its session" if outside else "")
            + f"): {len(first.terminated)} ended by SIGTERM, {killed} by SIGKILL in "
            f"{seconds:.1f} s"
            + (f"; {len(respawned)} more started while they were ended ({sorted(respawned)}"
               f"): stopped (SIGSTOP) and killed" if respawned else "")
            + (f"; STILL RUNNING: {survivors}" if survivors else ""))
