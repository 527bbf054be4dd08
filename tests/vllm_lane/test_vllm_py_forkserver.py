"""The DP coordinator's fork server, forked from the worker (harness/frontends/vllm_py_forkserver).

The server is process-wide and made once, so the forked path is checked in a fresh
interpreter (a script below, ~8 s: it imports vLLM). What it must hold: the server is this
process's child and forks children in milliseconds; its stop at session end is bounded
when a coordinator outlives its case (the server is killed and that reported); it keeps
none of the worker's sockets (a listening port held open there would refuse the next
bind); a child that writes to a stream it inherited from the worker writes nowhere, and the
server survives it (before the descriptors were blanked instead of closed, such a write
landed in the server's alive pipe and ended it: "Not at EOF?", every later coordinator then
came from a fresh interpreter).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from harness.frontends.vllm_py import forkserver as vllm_py_forkserver

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = textwrap.dedent("""
    import os, socket, sys, time
    from harness.frontends.vllm_py import driver as vllm_py
    from harness.frontends.vllm_py import forkserver as vllm_py_forkserver
    from harness.frontends.vllm_py.forkserver import coordinator_context, how_started
    from multiprocessing import forkserver

    def write_inherited():  # a coordinator-like child using the worker's stream object
        STREAM.write("a log line through a stream the worker opened\\n")
        STREAM.flush()

    def parent_pid():
        return os.getppid()

    vllm_py._load_vllm()
    held = socket.socket()  # a port the worker holds while the server is made
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    STREAM = open(os.devnull, "w")  # any stream the worker holds open
    began = time.monotonic()
    context = coordinator_context()
    made = time.monotonic() - began
    server = forkserver._forkserver._forkserver_pid
    assert how_started() == "forked", how_started()
    assert made < 2.0, made
    with open(f"/proc/{server}/stat") as fh:
        assert int(fh.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    for target in (write_inherited, write_inherited):  # served: the server is in its loop
        child = context.Process(target=target)
        child.start()
        child.join(30)
        assert child.exitcode == 0, child.exitcode
        time.sleep(0.2)
        assert os.waitpid(server, os.WNOHANG) == (0, 0), "the server ended"
    inodes = {os.stat(f"/proc/{server}/fd/{fd}").st_ino for fd in os.listdir(f"/proc/{server}/fd")}
    assert os.fstat(held.fileno()).st_ino not in inodes, "the server holds the worker's port"
    held.close()
    again = socket.socket()
    again.bind(("127.0.0.1", port))  # free again once the worker let it go
    again.close()
    probe = context.Process(target=parent_pid)
    began = time.monotonic()
    probe.start()
    probe.join(30)
    assert probe.exitcode == 0 and time.monotonic() - began < 2.0
    assert forkserver._forkserver._forkserver_pid == server, "a second server was made"
    # A coordinator that outlives its case keeps the server serving: the stop is bounded.
    lingering = context.Process(target=time.sleep, args=(60,))
    lingering.start()
    vllm_py_forkserver.STOP_TIMEOUT = 0.5
    began = time.monotonic()
    try:
        vllm_py_forkserver._stop_server()
        raise AssertionError("the stop did not report the lingering coordinator")
    except RuntimeError as exc:
        assert "still serving" in str(exc), exc
    assert time.monotonic() - began < 5.0
    assert forkserver._forkserver._forkserver_pid is None
    try:
        os.kill(server, 0)
        raise AssertionError("the server was not reaped")
    except ProcessLookupError:
        pass
    os.kill(lingering.pid, 9)
    print("OK")
""")


def test_forked_server_is_clean_and_survives_inherited_writes() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, timeout=300,
                          capture_output=True, text=True)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]


def test_never_forked_beside_another_thread() -> None:
    """A second thread could hold a lock the server would inherit held: spawn instead."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="another-thread", daemon=True)
    thread.start()
    try:
        assert not vllm_py_forkserver._can_fork_here()
    finally:
        stop.set()
        thread.join(5)
