"""What a conformance case holds while it runs, and how its outcome becomes a verdict.

A case never touches sockets: it starts a scripted engine group behind the driver under
test, drives the frontend, and states requirements with `ctx.require(...)`. `run_case`
turns whatever happens (unmet requirement, frontend error, timeout, harness bug) into a
graded `CaseResult` with evidence, and always tears everything down.
"""

from __future__ import annotations

import asyncio
import json
import linecache
import os
import re
import time
import traceback
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from harness.cases.declaration import CaseFn, CaseSpec
from harness.cases.grading import (
    GRADES,
    CaseUnmet,
    CaseUnsupported,
    grade_of,
    message_for,
    verdict_for,
)
from harness.frontends.api import Capability, FrontendDriver
from harness.frontends.run_config import RunConfig
from harness.frontends.subprocess.exchange import ExchangeLog
from harness.hygiene import zmq_guard
from harness.hygiene.leaks import observe_temp_sockets
from harness.hygiene.memory_guard import guarded
from harness.locations import IMPORT_ROOT
from harness.protocol.timing import Timescale, poll_until, use_in_case
from harness.protocol.transport.endpoints import PrivateIpcDir
from harness.protocol.wire import codec_for
from harness.protocol.wire.profiles import ProtocolProfile
from harness.results.bounds import TRANSCRIPT_TEXT_LIMIT, bound_result, clip_value
from harness.results.excerpt import transcript_excerpt
from harness.results.failsafe import TRANSCRIPT_NOT_WRITTEN, describe
from harness.results.records import CaseResult, Evidence, Level, Verdict
from harness.results.startup import StartAttempt, stderr_tail
from harness.results.writer import write_atomically
from mock_engines.group import EngineGroup
from mock_engines.script import EngineScript


class CaseContext:
    """Per-case handle: the driver, the engine group, timing and evidence."""

    def __init__(self, spec: CaseSpec, driver: FrontendDriver, config: RunConfig) -> None:
        self.spec = spec
        self.driver = driver
        self.config = config  # the run's settings for this frontend
        self.group: EngineGroup | None = None
        self.evidence = Evidence()
        self.start_attempt = StartAttempt()
        self.start_error: BaseException | None = None  # what driver.start() raised
        self._ipc = PrivateIpcDir()
        self._zmq_mark = zmq_guard.mark()  # contexts made after this are the case's

    @property
    def timescale(self) -> Timescale:
        """The run's factor for every window."""
        return self.config.timescale

    @property
    def profile(self) -> ProtocolProfile:
        """The protocol the mock engines speak: the run's --profile, else the frontend's."""
        return self.config.engine_profile

    def t(self, seconds: float) -> float:
        """A wait bound, scaled by the run's time-scale factor."""
        return self.timescale.scaled(seconds)

    def needs(self, *capabilities: Capability) -> None:
        missing = [c.value for c in capabilities if not self.driver.supports(c)]
        if missing:
            raise CaseUnsupported(f"driver {self.driver.name!r} lacks {', '.join(missing)}")

    async def start(self, scripts: Sequence[EngineScript] | int = 1, *,
                    startup_timeout: float = 10.0, rank_offset: int = 0,
                    handshake: bool = False, coordinated: bool = False) -> EngineGroup:
        """Start the engines behind the frontend under test and wait until it serves.

        `coordinated` (implies `handshake`): the frontend owns the DP coordinator and names
        it in INIT, so no mock coordinator is started."""
        scripts = [EngineScript() for _ in range(scripts)] if isinstance(scripts, int) \
            else list(scripts)
        coordinator = (self._ipc.address("dp-stats") if len(scripts) > 1 and not coordinated
                       else None)
        self.group = EngineGroup(scripts, codec=codec_for(self.profile),
                                 coordinator_address=coordinator, rank_offset=rank_offset)
        self.group.handshake = handshake or coordinated
        self.group.coordinated = coordinated
        self.start_attempt.attempted = True
        try:
            await self.driver.start(self.group, self.t(startup_timeout))
        except Exception as exc:
            self.start_error = exc
            raise
        self.needs(*self.spec.needs)  # drivers may learn their capabilities at start
        return self.group

    @property
    def engines(self) -> EngineGroup:
        if self.group is None:
            raise RuntimeError("case has not started its engines")
        return self.group

    def require(self, condition: bool, *, expected: str, observed: Any) -> None:
        """State a requirement; unmet ones are graded by the case's level."""
        if not condition:
            self.fail(expected=expected, observed=observed)

    def fail(self, *, expected: str, observed: Any) -> NoReturn:
        """The requirement is not met (graded by the case's level): what `require` raises."""
        raise CaseUnmet(expected, observed if isinstance(observed, str) else repr(observed))

    def note(self, text: str) -> None:
        """Record an observation (shown with the verdict, for INFO cases especially)."""
        self.evidence.notes.append(text)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float,
                         interval: float = 0.005) -> bool:
        """Poll a condition for at most `timeout` (scaled) seconds."""
        return await poll_until(predicate, self.t(timeout), interval)

    async def quiet(self, seconds: float) -> None:
        """Let a window pass (for 'nothing more arrives' checks), scaled."""
        await asyncio.sleep(self.t(seconds))

    async def close(self) -> list[str]:
        """Shut the frontend and engines down; returns teardown problems (never raises)."""
        problems: list[str] = []
        spare: list[Any] = []  # zmq contexts still in use by threads that did not stop
        try:  # while the frontend still runs: which temp-dir sockets are this run's
            observe_temp_sockets()
        except Exception as exc:
            problems.append(f"temp-dir socket accounting: {type(exc).__name__}: {exc}")
        try:
            await asyncio.wait_for(self.driver.shutdown(), self.t(10))
        except Exception as exc:  # reported, never lost
            problems.append(f"driver shutdown: {type(exc).__name__}: {exc}")
        problems.extend(self.driver.teardown_notes())
        if self.group is not None:
            try:
                await asyncio.to_thread(self.group.stop)
            except Exception as exc:
                problems.append(f"engine group stop: {exc}")
                # Mock engines' context, or the vLLM-core group's proxy's (vllm_core/).
                spare += [getattr(self.group, "ctx", None),
                          getattr(getattr(self.group, "proxy", None), "ctx", None)]
            problems.extend(f"engine {rank} thread failed: {exc!r}"
                            for rank, exc in self.group.failures())
        problems.extend(await self._reap_zmq_contexts(spare))
        self._ipc.cleanup()
        return problems

    async def _reap_zmq_contexts(self, spare: Sequence[Any]) -> list[str]:
        """ZMQ contexts the case's in-process frontend left open: destroyed now (LINGER 0,
        bounded) so the GC never blocks on them later; each named (harness/hygiene/zmq_guard.py)."""
        try:
            notes, owners = zmq_guard.close_leaked(self._zmq_mark, spare)  # loop's thread
            if owners:
                notes += await asyncio.to_thread(zmq_guard.terminate, owners,
                                                 self.t(zmq_guard.TERM_TIMEOUT))
        except Exception as exc:  # reported, never raised
            return [f"zmq context check: {type(exc).__name__}: {exc}"]
        return notes


async def run_case(spec: CaseSpec, fn: CaseFn, driver: FrontendDriver,
                   transcript_dir: str | None = None, config: RunConfig | None = None,
                   start_attempt: StartAttempt | None = None) -> CaseResult:
    """Run one case against one driver under the run's settings (None: the defaults), its
    engines speaking the config's engine profile, and grade it. Every window, the case's
    and the driver's, is scaled by the config's time scale. `start_attempt`, when given, is
    filled with whether the case tried to start the frontend and, if it never came up,
    why (harness/run/failfast.py)."""
    config = config or RunConfig()
    if driver.timescale != config.timescale:  # a driver a test built itself
        driver.with_timescale(config.timescale)
    ctx = CaseContext(spec, driver, config)
    if start_attempt is not None:
        ctx.start_attempt = start_attempt
    with use_in_case(ctx.timescale):  # code not handed the factor (harness/protocol/timing.py)
        return await _run_case(ctx, fn, transcript_dir)


async def _run_case(ctx: CaseContext, fn: CaseFn, transcript_dir: str | None) -> CaseResult:
    spec, driver = ctx.spec, ctx.driver
    start = time.monotonic()
    verdict, message = Verdict.PASS, "requirement met"
    cancelled = False
    try:
        if driver.capabilities:  # statically known; others are checked after start()
            ctx.needs(*spec.needs)
        await guarded(_within_case_bound(fn(ctx), ctx.t(spec.timeout)))
        if spec.level is Level.INFO:
            verdict, message = Verdict.INFO, "; ".join(ctx.evidence.notes) or "recorded"
    except Exception as exc:  # every outcome class names its verdict: harness/cases/grading.py
        grade = grade_of(exc)
        verdict = verdict_for(grade, spec.level)
        message = (_case_timeout_message(ctx, exc, _file_of(fn))
                   if grade.case_bound else message_for(grade, exc))
        if exc is ctx.start_error and verdict in (Verdict.ERROR, Verdict.TIMEOUT) \
                and _not_launched(driver, exc):
            ctx.start_attempt.failure = message  # the frontend never came up (failfast)
        if isinstance(exc, CaseUnmet):
            ctx.evidence.expected, ctx.evidence.observed = exc.expected, exc.observed
        elif grade.traceback:
            ctx.note(traceback.format_exc(limit=6))
        elif grade.verdict is None and verdict is Verdict.INFO:
            ctx.note(message)  # an INFO case records what the frontend did
    except asyncio.CancelledError:  # interrupted (SIGINT/SIGTERM): tear down, no verdict
        cancelled = True
    fault = driver.fault()  # before teardown: the exit teardown asks for is no fault
    if fault is not None and verdict is not Verdict.ERROR and not cancelled:
        # What the case saw came through a broken driver: not frontend behaviour to grade.
        ctx.note(f"outcome before the driver fault (not graded): {verdict.value}: {message}")
        verdict, message = Verdict.ERROR, f"driver fault: {fault}"
        if ctx.start_attempt.failure is not None:
            ctx.start_attempt.failure = message
    problems, cancelled_in_close = await _close_to_the_end(ctx)
    if cancelled or cancelled_in_close:
        raise asyncio.CancelledError
    late = driver.late_fault() if fault is None else None
    if late is not None and verdict is not Verdict.ERROR:
        ctx.note(f"outcome before the driver fault (not graded): {verdict.value}: {message}")
        verdict, message = Verdict.ERROR, f"driver fault: {late}"
    for problem in problems:
        ctx.note(f"teardown: {problem}")
    diagnostics = driver.diagnostics()
    if diagnostics and verdict is not Verdict.PASS:
        ctx.note(f"frontend log tail:\n{diagnostics}")
    if ctx.start_attempt.failure is not None:
        ctx.start_attempt.stderr_tail = stderr_tail(diagnostics)
    result = CaseResult(spec.case_id, driver.name, spec.level.value, spec.source,
                        spec.requirement, verdict, message, time.monotonic() - start,
                        evidence=ctx.evidence)
    if verdict is not Verdict.PASS and ctx.group is not None:
        exchange = getattr(driver, "exchange", None)
        _attach_transcript(result, ctx.group, transcript_dir,
                           exchange if isinstance(exchange, ExchangeLog) else None)
    return bound_result(result)


def _not_launched(driver: FrontendDriver, exc: BaseException) -> bool:
    """The frontend never came up: a driver program that did not answer `init`; for a
    driver without that notion, a harness fault (not a DriverFault / StartupError /
    CommandTimeout, which a case's own startup can cause)."""
    launched = getattr(driver, "launched", None)
    if isinstance(launched, bool):
        return not launched
    return grade_of(exc) is GRADES[Exception]


def _file_of(fn: CaseFn) -> str:
    code = getattr(fn, "__code__", None)
    return code.co_filename if code is not None else ""


class CaseBoundExpired(TimeoutError):
    """The case's own bound ran out; the message says where the case was waiting."""


async def _within_case_bound(case: Coroutine[Any, Any, None], bound: float) -> None:
    """`asyncio.wait_for(case, bound)`, except that the timeout names what the case was
    awaiting when its bound ran out (its await chain, read before it is cancelled)."""
    task = asyncio.ensure_future(case)
    try:
        await asyncio.wait({task}, timeout=bound)
    except asyncio.CancelledError:  # an interrupt: the case is cancelled and torn down
        task.cancel()
        await asyncio.wait({task})
        raise
    if task.done():
        task.result()  # the case's own outcome (an exception is its grade)
        return
    where = awaiting(task)
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # a case that failed while being cancelled: the bound wins
    raise CaseBoundExpired(f"{bound:.1f} s; awaiting {where}" if where else f"{bound:.1f} s")


ROOT = IMPORT_ROOT


def _site(path: str, line: int, function: str) -> str:
    """`file:line (function): `source``, the file relative to the repository."""
    where = os.path.relpath(path, ROOT) if path.startswith(str(ROOT)) else path
    code = " ".join(linecache.getline(path, line).split())
    code = code if len(code) <= 120 else code[:117] + "..."
    return f"`{code}` at {where}:{line} ({function})" if code else f"{where}:{line} ({function})"


def awaiting(task: asyncio.Task[Any]) -> str:
    """Where a suspended case is waiting: the innermost frame of the case's own code (its
    file under conformance/ or a case helper) and, when deeper, the innermost frame."""
    frames: list[FrameType] = []
    coro: Any = task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        frames.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    if not frames:
        return ""
    case_frames = [f for f in frames if "conformance" in Path(f.f_code.co_filename).parts]
    outer = case_frames[-1] if case_frames else frames[0]
    text = _site(outer.f_code.co_filename, outer.f_lineno, outer.f_code.co_name)
    ours = [f for f in frames if f.f_code.co_filename.startswith(str(ROOT))]
    inner = ours[-1] if ours else frames[-1]  # not asyncio's own frames
    if inner is not outer:
        text += (" -> " + _site(inner.f_code.co_filename, inner.f_lineno,
                                inner.f_code.co_name))
    return text


def _timeout_site(exc: BaseException, case_file: str) -> str:
    """Where a wait inside the case timed out: the case's own frame (in `case_file` or a
    suite file) and the innermost frame of ours."""
    stack = traceback.extract_tb(exc.__traceback__)
    if not stack:
        return ""
    case_frames = [f for f in stack
                   if f.filename == case_file or "conformance" in Path(f.filename).parts]
    outer = case_frames[-1] if case_frames else stack[0]
    text = _site(outer.filename, outer.lineno or 0, outer.name)
    ours = [f for f in stack if f.filename.startswith(str(ROOT))]
    inner = ours[-1] if ours else stack[-1]  # not asyncio's own frames
    if inner is not outer:
        text += " -> " + _site(inner.filename, inner.lineno or 0, inner.name)
    return text


def _case_timeout_message(ctx: CaseContext, exc: BaseException, case_file: str) -> str:
    """What the case was waiting for when it timed out (its bound, or a wait of its own
    that ran out first) and the driver commands left unanswered; the evidence says it too."""
    bound = f"{ctx.t(ctx.spec.timeout):.1f} s"
    if isinstance(exc, CaseBoundExpired):
        message = f"no outcome within the case bound ({exc})"
        observed = str(exc).split("; awaiting ", 1)[1] if "; awaiting " in str(exc) else ""
    else:
        site = _timeout_site(exc, case_file)
        detail = f": {exc}" if str(exc) else ""
        message = f"a wait of the case timed out{detail}" + (f" at {site}" if site else "")
        observed = site
    waiting = ctx.driver.unanswered()
    if waiting:
        message += f"; no reply to {', '.join(waiting)}"
    if not ctx.evidence.expected and not ctx.evidence.observed:
        bounded = isinstance(exc, CaseBoundExpired)
        ctx.evidence.expected = (f"an outcome within the case bound ({bound})" if bounded
                                 else "what the case awaited, within that wait's bound")
        ctx.evidence.observed = (("still awaiting " if bounded else "the wait ran out: ")
                                 + (observed or "(no frame of the case found)")
                                 + (f"; driver commands unanswered: {', '.join(waiting)}"
                                    if waiting else ""))
    return message


async def _close_to_the_end(ctx: CaseContext) -> tuple[list[str], bool]:
    """Teardown that a cancellation (an interrupt) cannot cut short: engines, driver and
    ipc dir are gone when this returns. Also says whether it was cancelled meanwhile."""
    closing = asyncio.ensure_future(ctx.close())
    cancelled = False
    while not closing.done():
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            cancelled = True
    if closing.cancelled():  # only when the whole event loop is being torn down
        return ["teardown cancelled"], True
    return closing.result(), cancelled


def transcript_file_name(case_id: str, frontend: str) -> str:
    """A file name for any frontend spec (`subprocess:./drv --x` has slashes and spaces)."""
    safe = re.sub(r"[^A-Za-z0-9_.:@=+-]+", "_", frontend).strip("_.") or "frontend"
    return f"{case_id}[{safe[:80]}].json"


def _attach_transcript(result: CaseResult, group: EngineGroup, directory: str | None,
                       exchange: ExchangeLog | None = None) -> None:
    """Attach the excerpt and write the full transcript: the engines' records and, for a
    driver program, the protocol lines it exchanged with corewire (channel `driver`), in
    time order. A failure here is noted on the verdict, never allowed to lose it."""
    path = ""
    try:
        records = group.transcript.snapshot()
        lines = exchange.lines() if exchange is not None else []
        starts = [r.t for r in records[:1]] + [line.t for line in lines[:1]]
        t0 = min(starts) if starts else 0.0
        full = [clip_value(r.to_json(t0), TRANSCRIPT_TEXT_LIMIT) for r in records]
        if exchange is not None:
            full = sorted(full + exchange.records(t0), key=lambda rec: float(rec["t"]))
        result.evidence.transcript = transcript_excerpt(full)
        if directory:
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, transcript_file_name(result.case_id,
                                                                result.frontend))
            # Whole or absent: a full disk leaves no half-written transcript.
            write_atomically(path, json.dumps(full, indent=1))
            result.evidence.transcript_file = path
    except OSError as exc:  # reported on the verdict (and by the run's exit code)
        result.evidence.notes.append(TRANSCRIPT_NOT_WRITTEN + describe(path or str(directory),
                                                                       exc))
    except Exception as exc:  # reported on the verdict, never raised
        result.evidence.notes.append(f"{TRANSCRIPT_NOT_WRITTEN}{type(exc).__name__}: {exc}")
