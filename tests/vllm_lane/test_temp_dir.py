"""The real vLLM frontends leave nothing in the temp dir: one vllm-py and one vllm-rs case in
a pytest run whose TMPDIR is a fresh empty dir, which must be empty again afterwards.

The case is a DP=2 handshake-mode case: vllm-py then runs vLLM's own DP coordinator, whose
front publish address is `ipc://{VLLM_RPC_BASE_PATH}/{uuid4()}` (v1/engine/coordinator.py:
89-95, vllm/utils/network_utils.py:175-177) and is never unlinked (the process is killed at
shutdown). Before the drivers pointed that base at their private dirs, every such case left a
socket file in /tmp; the second test puts the old behaviour back and checks that the
session's leak check reports the file (so it cannot come back silently).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.protocol.timing import scaled

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
CASE = "handshake.mode.hello_init_ready_2_engines"
RUN_BOUND = 300.0  # seconds (scaled): vLLM's import (~30 s here) and two cases
# Loaded with -p: vllm-py without its fix (vLLM's ipc base left at the temp dir).
OLD_BEHAVIOUR = """
from harness.frontends.vllm_py import driver as vllm_py
vllm_py.hold_rpc_base = lambda path: None
vllm_py.release_rpc_base = lambda path: None
"""


@pytest.fixture
def temp() -> Iterator[Path]:
    """A fresh TMPDIR for the run, short: unix socket paths end at 107 bytes, and pytest's
    tmp_path plus a private dir plus vLLM's uuid would pass that."""
    path = Path(tempfile.mkdtemp(prefix="cw-t-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _run(tmp_path: Path, temp: Path, frontends: list[str], *plugins: str
         ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}",
           # torch's compile cache would otherwise appear in TMPDIR (not ours, not a leak)
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    env.pop("VLLM_RPC_BASE_PATH", None)
    args = [sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider", "-n", "0",
            "-k", CASE, "--report-dir", str(tmp_path / "reports"),
            "--tb=short"]  # the session-end leak check's message (conformance runs hide it)
    for frontend in frontends:
        args += ["--frontend", frontend]
    for plugin in plugins:
        args += ["-p", plugin]
    run = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=scaled(RUN_BOUND))
    return run


def _sockets(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if stat.S_ISSOCK(p.lstat().st_mode))


def test_vllm_frontends_leave_the_temp_dir_empty(tmp_path: Path, temp: Path) -> None:
    run = _run(tmp_path, temp, ["vllm-py", "vllm-rs"])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "PASS=2" in run.stdout, run.stdout[-3000:]
    assert sorted(os.listdir(temp)) == []


def test_the_leak_check_reports_vllms_socket_left_in_the_temp_dir(tmp_path: Path,
                                                                  temp: Path) -> None:
    (tmp_path / "cw_old_rpc_base.py").write_text(OLD_BEHAVIOUR)
    run = _run(tmp_path, temp, ["vllm-py"], "cw_old_rpc_base")
    left = _sockets(temp)
    assert len(left) == 1, os.listdir(temp)  # the DP coordinator's publish socket
    assert run.returncode != 0, run.stdout[-3000:]
    output = run.stdout + run.stderr
    assert "left in the temp dir" in output and left[0] in output, output[-3000:]
