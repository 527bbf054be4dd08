"""The fault-driver matrix: driver programs that misbehave in every way we know of, run
through the harness end to end (`pytest conformance --frontend subprocess:...`).

Each fault asserts: the run ends within its stated bound, every case is graded with the
cause named (ERROR or TIMEOUT for a broken protocol; a teardown note for a program that
will not stop or leaves processes behind), the reports are complete (a results.json row per
collected case), and nothing is left: no process carrying the run's marker (grandchildren
that called setsid() included), no ipc or driver dir in the run's TMPDIR, no fd of this
process (the in-process half counts /proc/self/fd around one case).

Bounds are stated per end-to-end run (GROUPS: seconds of wall clock on the loaded 2-core
machine, pytest start-up included); the whole matrix runs in about a minute (57 s measured
at load average 11 on the 2 cores).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.cases.context import run_case
from harness.frontends.subprocess.driver import SubprocessDriver
from harness.frontends.table import REFERENCE_SUBPROCESS
from harness.hygiene import process_tree
from harness.results.records import Verdict
from tests.test_drivers import SPEC, smoke
from tests.timescale import RUN_CONFIG

ROOT = Path(__file__).resolve().parent.parent
MARK = "COREWIRE_FAULT_MATRIX"  # inherited by every process a matrix run starts
TWO_CASES = "streaming.finish.length or streaming.order.preserved"  # two quick ones
ONE_CASE = "streaming.finish.length"


@dataclass(frozen=True)
class Fault:
    """One misbehaving driver program and what the harness must make of it."""

    env: str  # COREWIRE_DRIVER_FAULT
    verdicts: frozenset[Verdict]
    cause: str  # in the verdict message (ERROR/TIMEOUT) or a teardown note (PASS)
    timescale: float = 1.0
    log: str = ""  # expected in the driver's stderr as attached to the verdict


BROKEN = frozenset({Verdict.ERROR})
FINE = frozenset({Verdict.PASS})  # the frontend behaved; the fault is a teardown note
FAULTS = {
    "crash after init": Fault("crash_on:wait_ready", BROKEN,
                              "driver exited (code 3) with no reply to `wait_ready`",
                              log="injected crash on wait_ready"),
    "never ready": Fault("hang_on:wait_ready", frozenset({Verdict.TIMEOUT}),
                         "no reply to `wait_ready` (id 2", timescale=0.4),
    "stray stdout mid-stream": Fault("stray_mid_stream", BROKEN,
                                     "not JSON: b'INFO loaded 3 adapters\\n'"),
    "reply with a wrong id": Fault("wrong_id_on:generate", BROKEN,
                                   "reply to unknown command id 1003"),
    "malformed JSON reply": Fault("truncated_json_on:generate", BROKEN,
                                  "not JSON: b'{\"id\": 3, \"ok\": tr\\n'"),
    "2 MiB line": Fault("huge_line_on:generate", BROKEN, "a stdout line over 1 MiB"),
    "ignores shutdown and SIGTERM": Fault(
        "ignore_shutdown", FINE, "driver ignored `shutdown` and SIGTERM; killed (SIGKILL) after"),
    "grandchild in its group": Fault("grandchild:cw-fault-{tag}", FINE,
                                     "driver left 1 process(es) behind"),
    "grandchild that called setsid": Fault("setsid_grandchild:cw-fault-{tag}", FINE,
                                           "had left its session"),
    "grandchild holding stdout, then a crash": Fault(
        "grandchild:cw-fault-{tag},crash_on:generate", BROKEN,
        "driver exited (code 3) with no reply to `generate`"),
    "stderr flood, then a crash": Fault("flood_stderr:40,crash_on:generate", BROKEN,
                                        "driver exited (code 3)", log="bytes elided"),
    # JSON that parses but breaks the protocol's shapes: an ERROR quoting the line, also
    # right after a stream's `finished` (where the reader used to die unseen and grade PASS).
    **{f"{kind} after {event}": Fault(f"bad_after_{event}:{kind}", BROKEN, cause)
       for event in ("output", "finished")
       for kind, cause in (("huge_int", "not JSON: b'{\"id\": 777"),
                           ("deep", "not JSON: b'{\"id\": 1, \"ok\": true, \"value\": [[["),
                           ("list_id", "a reply id must be an integer"),
                           ("null_tokens", "`tokens` must be a list of integers"),
                           ("nan_tokens", "not JSON"))},
}


def marked_processes(token: str) -> list[int]:
    return sorted(process_tree.marked(MARK, token, process_tree.process_table()))


def frontend_for(name: str, fault: Fault, tag: str) -> str:
    """`NAME=subprocess:...`: each fault's rows carry its own name (every program answers
    init with the same one), and no probe start is spent learning it."""
    python = os.path.relpath(sys.executable, ROOT)  # a relative command, with a slash
    label = "fault-" + "".join(c if c.isalnum() or c in "_.-" else "-" for c in name)
    return (f"{label}=subprocess:{python} -m harness.frontends.subprocess.program "
            f"--fault {fault.env.format(tag=tag)}")


# The faults run in three end-to-end runs (a pytest start-up each, every fault its own
# --frontend): what finishes in a second, what hangs (a shorter time scale), what will not
# stop. Bound: the wall clock of the whole run, pytest start-up included.
# The slow ones run one case (a hang costs its bound, a stuck driver its teardown).
SHAPES = [name for name, f in FAULTS.items() if f.env.startswith("bad_after_")]
GROUPS = {
    "quick": ([name for name, f in FAULTS.items() if f.timescale == 1.0
               and name != "ignores shutdown and SIGTERM" and name not in SHAPES], 1.0,
              TWO_CASES, 60.0),
    "shapes": (SHAPES, 1.0, ONE_CASE, 60.0),
    "hang": (["never ready"], 0.4, ONE_CASE, 25.0),
    "stuck": (["ignores shutdown and SIGTERM"], 1.0, ONE_CASE, 30.0),
}


def run_group(tmp: Path, names: list[str], timescale: float, cases: str, token: str
              ) -> tuple[subprocess.CompletedProcess[str], float, dict[str, str]]:
    """One end-to-end run with every fault of `names` as its own frontend."""
    frontends = {name: frontend_for(name, FAULTS[name], token[:8]) for name in names}
    private_tmp = tmp / "tmp"
    private_tmp.mkdir()
    env = {**os.environ, MARK: token, "TMPDIR": str(private_tmp),
           "COREWIRE_TIMESCALE": str(timescale)}
    env.pop("COREWIRE_DRIVER_FAULT", None)
    argv = [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-n", "0", "-p",
            "no:cacheprovider", "-k", cases, "--report-dir", str(tmp / "reports")]
    for frontend in frontends.values():
        argv += ["--frontend", frontend]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=env)
    return proc, time.monotonic() - started, frontends


@pytest.mark.parametrize("group", list(GROUPS))
def test_fault_drivers_end_to_end(tmp_path: Path, group: str) -> None:
    names, timescale, cases, bound = GROUPS[group]
    per_fault = len(cases.split(" or "))
    token = uuid.uuid4().hex
    proc, elapsed, frontends = run_group(tmp_path, names, timescale, cases, token)
    output = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert elapsed < bound, f"{group}: {elapsed:.1f} s > {bound} s\n{output}"
    assert "INTERNALERROR" not in output and "Traceback" not in proc.stderr, output
    records = json.loads((tmp_path / "reports" / "results.json").read_text())["results"]
    assert len(records) == per_fault * len(names), output  # every case of every fault: a row each
    for name, frontend in frontends.items():
        fault = FAULTS[name]
        rows = [r for r in records if r["frontend"] == frontend.split("=", 1)[0]]
        assert len(rows) == per_fault, (name, [r["frontend"] for r in records])
        for row in rows:
            assert Verdict(row["verdict"]) in fault.verdicts, (name, row["verdict"],
                                                               row["message"])
            notes = "\n".join(row["evidence"]["notes"])
            where = notes if fault.verdicts == {Verdict.PASS} else row["message"]
            assert fault.cause in where, f"{name}: {fault.cause!r} not in {where!r}"
            assert fault.log in notes, (name, notes[-2000:])
    broken = any(FAULTS[name].verdicts != {Verdict.PASS} for name in names)
    assert proc.returncode == (1 if broken else 0), output
    assert marked_processes(token) == [], "processes left behind"
    assert list((tmp_path / "tmp").iterdir()) == [], "ipc or driver dirs left behind"
    if group == "stuck":  # the time lost is added up for the whole run
        line = next((x for x in proc.stdout.splitlines() if x.startswith("WARNING: ")), "")
        assert "1 case(s) had a driver that would not stop when asked" in line, output
        assert "s lost in teardown" in line


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def settled_fds(limit: int, timeout: float = 3.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        count = open_fds()
        if count <= limit or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


@pytest.fixture(scope="module")
def warm() -> None:
    """One clean case first: imports and lazily created state do not count as leaks."""
    asyncio.run(run_case(SPEC, smoke, SubprocessDriver(REFERENCE_SUBPROCESS), config=RUN_CONFIG))


@pytest.mark.parametrize("name", ["grandchild that called setsid",
                                  "grandchild holding stdout, then a crash",
                                  "stderr flood, then a crash"])
def test_fault_driver_leaves_no_fd(warm: None, name: str) -> None:
    """One case in this process: the pipes, pidfds and sockets a faulty driver involved are
    all closed afterwards (a child holding the program's pipes open included)."""
    fault = FAULTS[name]
    token = uuid.uuid4().hex
    driver = SubprocessDriver(REFERENCE_SUBPROCESS, name=f"fault:{name}",
                              env={"COREWIRE_DRIVER_FAULT": fault.env.format(tag=token[:8]),
                                   MARK: token})
    before = settled_fds(0, timeout=0)
    result = asyncio.run(run_case(SPEC, smoke, driver, config=RUN_CONFIG))
    assert result.verdict in fault.verdicts, result.message
    assert settled_fds(before) <= before, f"fds: {before} before, {open_fds()} after"
    assert marked_processes(token) == []
