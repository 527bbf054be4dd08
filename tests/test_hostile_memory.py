"""What a hostile frontend asks for costs the harness a bounded amount of memory and report.

Two halves. In process: a case that keeps growing the worker's memory is stopped by the
memory guard and graded ERROR with the figures (harness/hygiene/memory_guard.py), and the worker
goes on. End to end: driver programs that ask for 10**9 tokens, send an 8 MiB prompt or a
1 MiB request id (the `oversize:KIND` faults) run through `pytest conformance` under an
address-space cap (RLIMIT_AS, so an exhaustion would kill the run, not the machine); the run
must finish, grade every case with its cause, keep every results.json row under ROW_LIMIT,
and its processes' peak resident memory must stay under PEAK_RSS_BOUND.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cases.context import CaseContext, run_case
from harness.cases.declaration import CaseSpec
from harness.frontends.reference import ReferenceDriver
from harness.hygiene import memory_guard
from harness.results.bounds import ROW_LIMIT
from harness.results.records import Level, Verdict
from tests.timescale import RUN_CONFIG

ROOT = Path(__file__).resolve().parent.parent
ADDRESS_SPACE_CAP = 6 << 30  # RLIMIT_AS of the end-to-end run (threads reserve much VA)
PEAK_RSS_BOUND = 600 << 20  # the largest resident set of any process of that run
CASES = "streaming.add_fields.external_req_id_client_chosen or streaming.order.preserved"
FAULTS = ("max_tokens", "prompt", "request_id")
# Runs the command and reports the largest resident set among it and its descendants.
PEAK_REPORTER = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
                 "print('corewire-peak-rss-kib', "
                 "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
                 "sys.exit(code)")


async def _grow(ctx: CaseContext) -> None:
    """Grows this process by 16 MiB every 10 ms (touched, so it is resident)."""
    hoard = []
    for _ in range(64):
        hoard.append(b"\x01" * (16 << 20))
        await asyncio.sleep(0.01)
    raise AssertionError("the guard let the case allocate 1 GiB")


def test_a_case_growing_the_worker_past_its_memory_bound_is_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_guard, "CASE_MEMORY_LIMIT", 96 << 20)
    spec = CaseSpec("streaming.smoke.memory", Level.MUST, "grows", "tests", timeout=30.0)
    result = asyncio.run(run_case(spec, _grow, ReferenceDriver(), config=RUN_CONFIG))
    assert result.verdict is Verdict.ERROR, result.message
    assert result.message.startswith("memory bound: the case grew"), result.message
    assert "past its bound of 96 MiB" in result.message


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_CAP, ADDRESS_SPACE_CAP))


def test_hostile_requests_cost_bounded_memory_and_report(tmp_path: Path) -> None:
    python = os.path.relpath(sys.executable, ROOT)
    argv = [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-n", "0", "-p",
            "no:cacheprovider", "-k", CASES, "--report-dir", str(tmp_path / "reports")]
    for kind in FAULTS:
        argv += ["--frontend", f"subprocess:{python} -m harness.frontends.subprocess.program "
                               f"--fault oversize:{kind}"]
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(private_tmp)}
    env.pop("COREWIRE_DRIVER_FAULT", None)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", PEAK_REPORTER, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240, preexec_fn=_capped)
    elapsed = time.monotonic() - started
    peak = int(proc.stderr.rsplit("corewire-peak-rss-kib ", 1)[1].split()[0]) << 10
    output = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "INTERNALERROR" not in output and "Traceback" not in proc.stderr, output
    assert elapsed < 120, f"{elapsed:.0f} s\n{output}"
    report = tmp_path / "reports" / "results.json"
    rows = json.loads(report.read_text())["results"]
    assert len(rows) == 2 * len(FAULTS), output
    for row in rows:
        assert len(json.dumps(row)) < ROW_LIMIT, (row["id"], row["frontend"])
        assert row["verdict"] in {v.value for v in Verdict}, row
        if row["verdict"] != "PASS":
            assert row["message"].strip(), row  # the cause is named
    assert report.stat().st_size < len(rows) * ROW_LIMIT
    assert list(private_tmp.iterdir()) == [], "ipc or driver dirs left behind"
    assert peak < PEAK_RSS_BOUND, f"peak resident set {peak >> 20} MiB\n{output}"
