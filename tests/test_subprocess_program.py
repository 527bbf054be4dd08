"""The driver program (harness/frontends/subprocess/program.py) serves ANY in-process driver:
the same case gives the same verdict through the protocol as in-process, a mutant included;
specs it cannot serve are refused at start; a stream's events are relayed in order; and the
startup bound is the one `wait_ready` carries (StartupBound)."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from harness.cases.context import run_case
from harness.cases.declaration import CaseSpec, cases_of
from harness.frontends.api import (
    FrontendDriver,
    ObservedConfig,
    StreamHandle,
    UnsupportedOperation,
)
from harness.frontends.subprocess.driver import SubprocessDriver
from harness.frontends.subprocess.faults import Faults
from harness.frontends.subprocess.program import EX_USAGE, DriverProgram
from harness.frontends.subprocess.remote_engines import StartupBound
from harness.mutation.registry import make_mutant_driver
from harness.results.records import Verdict

PROGRAM = [sys.executable, "-m", "harness.frontends.subprocess.program"]


def spec_of(fn: Any) -> CaseSpec:
    return cases_of(fn)[0].spec
# The cases are imported inside the tests: a case at module level would be collected here.


def test_the_program_serves_a_mutant_as_the_mutant_fails_in_process() -> None:
    """`--frontend mutant:duplicate_abort` behind the protocol: the case that catches the
    mutant in-process catches it through the program too, and passes on the default."""
    from conformance.abort.test_drop import burst_exactly_once

    spec = spec_of(burst_exactly_once)
    inside = asyncio.run(run_case(spec, burst_exactly_once,
                                  make_mutant_driver("duplicate_abort")))
    behind = asyncio.run(run_case(spec, burst_exactly_once, SubprocessDriver(
        [*PROGRAM, "--frontend", "mutant:duplicate_abort"], name="program:mutant")))
    clean = asyncio.run(run_case(spec, burst_exactly_once,
                                 SubprocessDriver(PROGRAM, name="program:reference")))
    assert inside.verdict is Verdict.FAIL, inside.message
    assert behind.verdict is Verdict.FAIL, (behind.message, behind.evidence.notes)
    assert behind.evidence.expected == inside.evidence.expected
    assert clean.verdict is Verdict.PASS, (clean.message, clean.evidence.notes)


def test_the_startup_bound_is_the_one_wait_ready_carries() -> None:
    """The driver starts at `init` but waits by `wait_ready`'s bound: an engine that never
    registers is named by the frontend's own error, within that bound."""
    from conformance.handshake.test_register import never_registers_named

    spec = spec_of(never_registers_named)
    began = time.monotonic()
    result = asyncio.run(run_case(spec, never_registers_named,
                                  SubprocessDriver(PROGRAM, name="program:reference")))
    assert result.verdict is Verdict.PASS, (result.message, result.evidence.notes)
    assert time.monotonic() - began < 60


@pytest.mark.parametrize(("frontend", "says"), [
    ("reference-subprocess", "is itself a driver program"),
    ("subprocess:python -m harness.frontends.subprocess.program", "is itself a driver program"),
    ("kv:reference", "is a component unit, not a frontend"),
    ("mutant:no_such_mutant", "unknown mutant 'no_such_mutant'"),
    ("frobnicate", "unknown frontend 'frobnicate'"),
])
def test_a_frontend_the_program_cannot_serve_is_refused_at_start(frontend: str,
                                                                 says: str) -> None:
    proc = subprocess.run([*PROGRAM, "--frontend", frontend], input="", capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == EX_USAGE, proc.stderr
    assert says in proc.stderr and proc.stdout == ""


class Prefilled(FrontendDriver):
    """A driver whose handles already made progress when generate returns (a driver may
    fill a handle before the program attaches its observer), then keep streaming."""

    name = "prefilled"

    def __init__(self) -> None:
        self.handles: list[StreamHandle] = []

    async def start(self, group: Any, timeout: float) -> None:
        raise AssertionError("not started in this test")

    async def generate(self, prompt_token_ids: Sequence[int], max_tokens: int, *,
                       stream: bool = True, data_parallel_rank: int | None = None,
                       stop: Sequence[str] | None = None, request_id: str | None = None,
                       params: Mapping[str, Any] | None = None) -> StreamHandle:
        handle = StreamHandle(list(prompt_token_ids), request_id="r-1")
        handle.add_tokens([100], " t100")
        handle.add_tokens([101], " t101")
        self.handles.append(handle)
        return handle

    async def drop(self, handles: Sequence[StreamHandle]) -> None:
        raise UnsupportedOperation("no drop")

    async def abort(self, request_ids: Sequence[str]) -> None:
        return None

    async def is_sleeping(self) -> bool:
        return False

    async def reset_prefix_cache(self, reset_running_requests: bool = False,
                                 reset_connector: bool = False) -> bool:
        return True

    async def observed_config(self) -> ObservedConfig:
        return ObservedConfig(4096, 16, None)

    async def shutdown(self) -> None:
        return None


def test_events_made_before_the_relay_come_first_and_in_order() -> None:
    """What the handle held when generate returned is relayed before anything after it."""
    driver, out = Prefilled(), io.BytesIO()

    async def exchange() -> None:
        program = DriverProgram(driver, Faults(), out, feed=None)  # type: ignore[arg-type]
        await program.handle({"id": 1, "cmd": "generate", "stream": "s1", "prompt": [1],
                              "max_tokens": 4})
        driver.handles[0].add_tokens([102], " t102")
        driver.handles[0].finish("length")
        await program.handle({"id": 2, "cmd": "drop", "streams": ["s1"]})
        await program.handle({"id": 3, "cmd": "observed_config"})

    asyncio.run(exchange())
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines == [
        {"event": "output", "stream": "s1", "tokens": [100, 101], "text": " t100 t101"},
        {"id": 1, "ok": True, "request_id": "r-1"},
        {"event": "output", "stream": "s1", "tokens": [102], "text": " t102"},
        {"event": "finished", "stream": "s1", "finish_reason": "length", "error": None},
        {"id": 2, "ok": False, "unsupported": True, "error": "no drop"},
        {"id": 3, "ok": True, "value": {"max_model_len": 4096, "block_size": 16,
                                        "num_gpu_blocks": None}},
    ]


def test_a_startup_bound_reads_as_the_seconds_it_was_settled_to() -> None:
    bound = StartupBound(600.0)
    assert 1.0 + bound == 601.0 and f"{bound:.1f}" == "600.0"
    bound.settle(1.5)
    assert 10.0 + bound == 11.5 and bound + 1 == 2.5 and 2.0 - bound == 0.5
    assert bound * 1000 == 1500.0 and bound < 2 and bound > 1 and bound == 1.5
    assert f"{bound:.1f}" == "1.5" and float(bound) == 1.5 and str(bound) == "1.5"


def test_the_program_exits_at_once_after_shutdown_while_stdin_stays_open(
        tmp_path: Any) -> None:
    """The harness keeps stdin open until the program exits: the reader thread, blocked in
    its read, must not hold a lock the interpreter's exit needs (it aborted with SIGABRT
    after a second)."""
    proc = subprocess.Popen(PROGRAM, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for command in ({"id": 1, "cmd": "init", "protocol": "corewire-driver/1",
                         "workdir": str(tmp_path), "engines": [{"rank": 0}], "dp_size": 1,
                         "stats_address": None, "timescale": 1.0},
                        {"id": 2, "cmd": "shutdown"}):
            proc.stdin.write((json.dumps(command) + "\n").encode())
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["ok"] is True
        answered = time.monotonic()
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - answered < 5
        assert list(tmp_path.iterdir()) == []  # the driver's ipc dir went with it
    finally:
        proc.kill()
        proc.wait()


def test_a_shutdown_right_behind_init_is_not_waited_for(tmp_path: Any) -> None:
    """A harness interrupted during init sends `shutdown` at once: the driver's start must
    not be held for a `wait_ready` that will never come (it was held until stdin closed,
    ten seconds, and the interrupted run left its dirs behind)."""
    proc = subprocess.Popen(PROGRAM, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        init = {"id": 1, "cmd": "init", "protocol": "corewire-driver/1",
                "workdir": str(tmp_path), "engines": [{"rank": 0}], "dp_size": 1,
                "stats_address": None, "timescale": 1.0}
        sent = time.monotonic()
        proc.stdin.write((json.dumps(init) + "\n" + json.dumps({"id": 2, "cmd": "shutdown"})
                          + "\n").encode())
        proc.stdin.flush()
        replies = {}
        for _ in range(2):
            reply = json.loads(proc.stdout.readline())
            replies[reply["id"]] = reply
        assert replies[2] == {"id": 2, "ok": True}
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - sent < 5
    finally:
        proc.kill()
        proc.wait()
