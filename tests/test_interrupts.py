"""SIGINT / SIGTERM to `corewire run` or to plain pytest (issue: no verdict lost, no process
leaked): the run stops within STOP_BOUND_S, exits 2, writes partial reports of the cases
that finished, and leaves no process and no ipc dir behind.

Each test starts a real run against reference-subprocess (so drivers are grandchildren in
sessions of their own) in a session of its own, with a marker in its environment that every
descendant inherits; "no process left" means no process carries the marker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from junitparser import JUnitXml

from tests.timescale import scaled

ROOT = Path(__file__).resolve().parent.parent
STOP_BOUND_S = 30.0  # documented in docs/cli.md: signal -> exit, scaled by the timescale
MARK = "COREWIRE_INTERRUPT_TEST_MARK"


def _marked(mark: str) -> list[int]:
    """Live processes whose environment carries `mark` (every descendant of the run)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(pid))
    return found


class Run:
    """A run in a session of its own, its output read line by line."""

    def __init__(self, argv: list[str], tmp: Path) -> None:
        self.mark = uuid.uuid4().hex
        self.tmpdir = tmp / "tmp"
        self.tmpdir.mkdir()
        env = {**os.environ, MARK: self.mark, "TMPDIR": str(self.tmpdir),
               "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        self.finished = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if any(word in line for word in (" PASSED", " FAILED", " SKIPPED")):
                self.finished.set()

    def output(self) -> str:
        return "".join(self.lines)[-4000:]

    def kill_everything(self) -> None:
        for pid in _marked(self.mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue


def _argv(how: str, report_dir: Path, workers: str) -> list[str]:
    selection = ["-m", "streaming", "--frontend", "reference-subprocess"]
    if how == "corewire":
        return [sys.executable, "-m", "harness.run.cli", "run", "--report-dir", str(report_dir),
                "-n", workers, *selection, "--", "-vv"]
    return [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-p",
            "no:cacheprovider", "-vv", "--report-dir", str(report_dir),
            f"--junitxml={report_dir / 'junit.xml'}", "-o", "junit_family=xunit2",
            "-n", workers, *selection]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("how, sig, workers", [
    ("corewire", signal.SIGINT, "0"),
    ("corewire", signal.SIGTERM, "2"),
    ("pytest", signal.SIGTERM, "0"),
    ("pytest", signal.SIGINT, "2"),
])
def test_interrupt_keeps_finished_verdicts_and_leaves_nothing(
        tmp_path: Path, how: str, sig: signal.Signals, workers: str) -> None:
    report_dir = tmp_path / "reports"
    run = Run(_argv(how, report_dir, workers), tmp_path)
    try:
        assert run.finished.wait(scaled(240)), "no case finished:\n" + run.output()
        assert run.proc.poll() is None, "the run ended before the signal:\n" + run.output()
        os.kill(run.proc.pid, sig)
        signalled = time.monotonic()
        code = run.proc.wait(timeout=scaled(STOP_BOUND_S) + 30)
        took = time.monotonic() - signalled
        assert took < scaled(STOP_BOUND_S), f"stopping took {took:.1f} s"
        assert code == 2, f"exit {code}:\n" + run.output()

        doc = json.loads((report_dir / "results.json").read_text())
        assert doc["meta"]["partial"] is True
        assert doc["meta"]["partial_reason"] == f"interrupted by {sig.name}"
        finished = {(r["id"], r["frontend"]) for r in doc["results"]}
        assert finished, "the finished cases are not in results.json"
        assert len(finished) < 97, "every case ran: the interrupt stopped nothing"
        html = (report_dir / "report.html").read_text()
        assert "id='partial'" in html and "PARTIAL" in html
        junit = {case.name for suite in JUnitXml.fromfile(str(report_dir / "junit.xml"))
                 for case in suite}
        assert {f"{case}[{fe}]" for case, fe in finished} <= junit
        assert f"PARTIAL: interrupted by {sig.name}" in run.output()
        assert "session leaked" not in run.output() and "INTERNALERROR" not in run.output()

        deadline = time.monotonic() + 5  # the kernel reaps the last exits
        while _marked(run.mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _marked(run.mark), f"processes left: {_marked(run.mark)}"
        leftover = [p.name for p in run.tmpdir.iterdir() if p.name.startswith("cw-")]
        assert not leftover, f"ipc dirs left: {leftover}"
    finally:
        run.kill_everything()


def test_a_forked_child_takes_sigterm_by_default() -> None:
    """Hazard: a child forked after install (vLLM forks its DP coordinator) inherited our
    handler, ignored SIGTERM and made its parent wait out a 5 s shutdown bound."""
    from harness.run import interrupts

    interrupts.install()
    try:
        pid = os.fork()
        if pid == 0:  # the child: wait to be terminated
            time.sleep(30)
            os._exit(0)
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child ignored SIGTERM")
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        assert interrupts.interrupted_by() is None  # the parent was not interrupted
    finally:
        interrupts.restore()


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found


def test_corewire_run_killed_takes_its_pytest_with_it(tmp_path: Path) -> None:
    """`corewire run` killed with SIGKILL (no handler runs) used to leave its pytest running
    and writing reports later: the child now gets SIGTERM when its parent dies, stops with
    partial reports (exit 2 path) and is gone within the interrupt bound."""
    # A selection that runs for minutes: an orphaned pytest would still be at it below.
    log = tmp_path / "out.txt"
    with log.open("w") as out:
        cli = subprocess.Popen([sys.executable, "-m", "harness.run.cli", "run", "-n", "0", "-k",
                                "abort or dp or streaming", "--report-dir",
                                str(tmp_path / "r")], cwd=ROOT, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        children: list[int] = []
        while time.monotonic() < deadline and not (
                children and ".." in log.read_text()):  # cases are running
            children = children or _children_of(cli.pid)
            time.sleep(0.1)
        assert children and ".." in log.read_text(), log.read_text()[-2000:]
        cli.kill()
        cli.wait(10)
        deadline = time.monotonic() + scaled(20.0)
        while any(os.path.exists(f"/proc/{c}") and "Z" not in _state(c) for c in children) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(os.path.exists(f"/proc/{c}") and "Z" not in _state(c)
                       for c in children), "pytest ran on after corewire run was killed"
        meta = json.loads((tmp_path / "r" / "results.json").read_text())["meta"]
        assert meta["partial"] is True  # it stopped early and wrote its partial reports
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cli.pid, signal.SIGKILL)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
