"""Nothing a case's frontend makes outlives the case: unix socket files in the temp dir (the
leak check attributes them to this run and reports them) and ZMQ contexts left open (the
case teardown destroys them, bounded, and names them; the GC would otherwise block for ever
in their term()). The real frontends' side of it is tests/vllm_lane/test_temp_dir.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from harness.cases.context import run_case
from harness.hygiene.leaks import leaks_since, observe_temp_sockets, snapshot, temp_entry
from harness.protocol.timing import scaled
from harness.protocol.transport.endpoints import PrivateIpcDir
from harness.results.records import Verdict
from tests.leaky_drivers import SPEC, TempSocketDriver, spawn_binder, start_only

ROOT = Path(__file__).resolve().parent.parent
ZMQ_RUN_BOUND = 40.0  # seconds (scaled): interpreter start + harness import + one case


def _temp_left(problems: list[str]) -> list[str]:
    return [p for p in problems if "left in the temp dir" in p]


def test_temp_entry_names_what_a_run_must_not_leave() -> None:
    root = tempfile.gettempdir()
    sock = os.path.join(root, str(uuid.uuid4()))
    assert temp_entry(sock) == sock  # vLLM's ipc://{tempdir}/{uuid4}
    assert temp_entry(os.path.join(root, "cw-rs-abc", "in-1")) == os.path.join(root, "cw-rs-abc")
    assert temp_entry(os.path.join(root, "pytest-of-me", "x", "s")) is None
    assert temp_entry("/run/other/socket") is None


def test_a_socket_a_child_left_in_the_temp_dir_is_reported() -> None:
    """A process of this run bound a socket directly in the temp dir and was killed (as
    vLLM's DP coordinator is): the file stays, and the leak check names it."""
    before = snapshot()
    path = os.path.join(tempfile.gettempdir(), str(uuid.uuid4()))
    proc = spawn_binder(path)
    try:
        observe_temp_sockets()
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    try:
        assert os.path.exists(path)  # nothing unlinks a killed binder's socket file
        left = _temp_left(leaks_since(before))
        assert left and path in left[0], left
    finally:
        os.unlink(path)
    assert leaks_since(before) == []


def test_a_socket_another_process_left_is_not_this_runs() -> None:
    """Other programs on the machine make sockets in the same temp dir (same uid too): one
    bound by a process outside this run's tree (orphaned, environment scrubbed) is not
    counted, though it appeared during the session."""
    before = snapshot()
    path = os.path.join(tempfile.gettempdir(), str(uuid.uuid4()))
    # setsid + double fork + an empty environment: neither a descendant nor marked.
    launcher = ("import os, subprocess, sys\nos.setsid()\n"
                "p = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]], env={},"
                " stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)\n"
                "print(p.pid, p.stdout.readline().decode().strip(), flush=True)\n")
    from tests.leaky_drivers import BINDER
    out = subprocess.run([sys.executable, "-c", launcher, BINDER, path], env={},
                         capture_output=True, text=True, timeout=30, check=True).stdout.split()
    pid = int(out[0])
    try:
        assert out[1] == "bound"
        observe_temp_sockets()
    finally:
        os.kill(pid, signal.SIGKILL)  # the one process this test started outside its tree
    try:
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.path.exists(path)
        assert _temp_left(leaks_since(before)) == []
    finally:
        os.unlink(path)


def test_case_teardown_attributes_a_frontends_temp_socket() -> None:
    """End to end through run_case: the frontend's 'coordinator' binds ipc://{tempdir}/{uuid}
    and is killed at shutdown; the case teardown saw it bound, so the leak check reports the
    file. With the base pointed at a private dir (what the vLLM drivers now do), nothing."""
    before = snapshot()
    leaky = TempSocketDriver()
    result = asyncio.run(run_case(SPEC, start_only, leaky))
    assert result.verdict is Verdict.PASS, result.message
    try:
        left = _temp_left(leaks_since(before))
        assert left and leaky.path in left[0], left
    finally:
        os.unlink(leaky.path)
    private = PrivateIpcDir()
    try:
        tidy = TempSocketDriver(base=private.path)
        assert asyncio.run(run_case(SPEC, start_only, tidy)).verdict is Verdict.PASS
    finally:
        private.cleanup()
    assert leaks_since(before) == []


ZMQ_SCRIPT = """
import asyncio, gc, json, sys
from harness.cases.context import run_case
from tests.leaky_drivers import SPEC, ZmqLeakDriver, start_only
driver = ZmqLeakDriver(sys.argv[1])
result = asyncio.run(run_case(SPEC, start_only, driver))
print(json.dumps({"verdict": result.verdict.value, "notes": result.evidence.notes}), flush=True)
del driver, result
gc.collect()  # without the teardown guard this blocks for ever in the context's term()
print("collected", flush=True)
"""


def test_a_zmq_context_left_open_is_destroyed_and_named(tmp_path: Path) -> None:
    """A driver leaves a context and a socket with an unsent message (LINGER -1) in a
    reference cycle. The case teardown closes the socket with LINGER 0 and terminates the
    context, the case's evidence names where it was made, and the later GC pass (which
    would otherwise hang: the context is finalized first) returns; all within the bound."""
    bound = scaled(ZMQ_RUN_BOUND)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    try:
        run = subprocess.run([sys.executable, "-c", ZMQ_SCRIPT, f"ipc://{tmp_path}/nobody"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=bound)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the run hung (no exit within {bound:.0f}s): {exc.stdout!r}")
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[-1] == "collected", run.stdout
    outcome = json.loads(lines[-2])
    assert outcome["verdict"] == "PASS"
    notes = [n for n in outcome["notes"] if "zmq context made at" in n]
    assert len(notes) == 1, outcome["notes"]
    assert "tests/leaky_drivers.py" in notes[0] and "1 open socket(s)" in notes[0], notes
    assert "context terminated" in notes[0], notes
    assert time.monotonic() - started < bound
