"""Temp dirs a run could not remove because it was SIGKILLed (its process group, mid-case)
are removed by the next run, and only those: harness/hygiene/ownership.py's registries (a flock'd
file per process naming its cw-* dirs and driver programs) prove which owners are dead.

Before: a subprocess-driver case killed with its process group left two empty dirs in the
temp dir, the case's ipc dir (cw-XXXX) and the driver's workdir (cw-drv-XXXX), and no later
run removed them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.hygiene import ownership, process_tree
from tests.timescale import scaled

ROOT = Path(__file__).resolve().parent.parent
MARK = "COREWIRE_STALE_TEMP_TEST"


def _run(tmp: Path, reports: Path, case: str, fault: str = "") -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmp), MARK: str(tmp), "PYTHONPATH": str(ROOT)}
    env.pop("COREWIRE_DRIVER_FAULT", None)
    if fault:
        env["COREWIRE_DRIVER_FAULT"] = fault
    argv = [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-n", "0",
            "-p", "no:cacheprovider", "-k", case, "--frontend", "reference-subprocess",
            "--report-dir", str(reports)]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _ours(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("cw-"))


def _marked(tmp: Path) -> list[int]:
    return sorted(process_tree.marked(MARK, str(tmp), process_tree.process_table()))


def test_dirs_a_killed_run_left_are_swept_by_the_next_run(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    killed = _run(tmp, tmp_path / "killed", "streaming.finish.length", "hang_on:generate")
    try:
        deadline = time.monotonic() + scaled(60)
        while not any(n.startswith("cw-drv-") for n in _ours(tmp)):
            assert killed.poll() is None and time.monotonic() < deadline, "no case started"
            time.sleep(0.05)
        time.sleep(scaled(0.5))  # the driver program is up, the case waits on `generate`
        os.killpg(killed.pid, signal.SIGKILL)
        killed.communicate(timeout=30)
        deadline = time.monotonic() + scaled(10)  # the program exits on its stdin's EOF
        while _marked(tmp) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _ours(tmp)
        assert any(n.startswith("cw-drv-") for n in left), left
        assert any(n.startswith(ownership.PREFIX) for n in left), left  # the registry
    finally:
        for pid in _marked(tmp):
            os.kill(pid, signal.SIGKILL)
    later = _run(tmp, tmp_path / "later", "streaming.finish.length")
    output, _ = later.communicate(timeout=300)
    assert later.returncode == 0, output[-3000:]
    assert _ours(tmp) == [], f"left after the next run: {_ours(tmp)}"


def test_a_live_owners_dirs_are_never_swept(tmp_path: Path) -> None:
    """A sweep takes only the registries of dead owners: a live process's dir stays, and
    goes once that process is dead (SIGKILL: no cleanup of its own)."""
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, tempfile, time\n"
         f"sys.path.insert(0, {str(ROOT)!r})\n"
         "tempfile.tempdir = sys.argv[1]\n"
         "from harness.protocol.transport.endpoints import PrivateIpcDir\n"
         "d = PrivateIpcDir()\n"
         "print(d.path, flush=True)\n"
         "time.sleep(60)\n", str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        path = Path(owner.stdout.readline().strip())
        assert path.is_dir()
        swept = ownership.sweep(str(tmp_path))
        assert path.is_dir() and swept.dirs == []
    finally:
        owner.kill()
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    swept = ownership.sweep(str(tmp_path))
    assert not path.exists() and swept.dirs == [str(path)] and swept.owners == [owner.pid]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_only_dirs_the_dead_owner_recorded_and_named_cw_are_removed(tmp_path: Path) -> None:
    """A registry is a list of paths: a sweep never follows one out of the cw-* dirs (a
    forged or corrupt line naming another dir is ignored), and a dir the owner removed
    itself (a `-dir` record) is not looked for."""
    other = tmp_path / "not-ours"
    other.mkdir()
    cleaned = tmp_path / "cw-cleaned"
    left = tmp_path / "cw-left"
    left.mkdir()
    (left / "sock").write_text("")
    registry = tmp_path / f"{ownership.PREFIX}999999999-dead"
    registry.write_text(f"dir\t{other}\ndir\t{cleaned}\n-dir\t{cleaned}\ndir\t{left}\n"
                        "dir\trelative/cw-x\ngarbage line\n")
    swept = ownership.sweep(str(tmp_path))
    assert swept.dirs == [str(left)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-ours"]


@pytest.mark.parametrize("scope", ["owner", "all"])
def test_a_dead_owners_program_is_ended(tmp_path: Path, scope: str) -> None:
    """A driver program recorded by an owner that died (an xdist worker SIGKILLed mid-case)
    is ended with what carries its token, the token's carriers found even in a new
    session."""
    token = process_tree.new_token()
    program = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
         " start_new_session=True)\n"
         "print('up', flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, process_tree.TOKEN_VAR: token})
    try:
        assert program.stdout is not None and program.stdout.readline().strip() == "up"
        info = process_tree.read_stat(program.pid)
        assert info is not None
        registry = tmp_path / f"{ownership.PREFIX}999999998-dead"
        registry.write_text(f"program\t{program.pid}\t{info.start_time}\t{token}\n")
        family = process_tree.family(program.pid, token)
        assert len(family) == 2
        swept = ownership.sweep(str(tmp_path), owner=999999998 if scope == "owner" else None)
        assert sorted(swept.ended) == sorted(family) and swept.survivors == []
        program.wait(timeout=5)
        assert process_tree.family(program.pid, token) == {}
        assert list(tmp_path.iterdir()) == []
    finally:
        for pid in process_tree.marked(process_tree.TOKEN_VAR, token,
                                       process_tree.process_table()):
            os.kill(pid, signal.SIGKILL)
        if program.poll() is None:
            program.kill()
        program.wait()
        if program.stdout is not None:
            program.stdout.close()
