"""A daemon a driver program starts that escapes every way a process tree can be left:
setsid + double fork (own session, orphaned) + re-exec, then either a fresh copy of itself
on each SIGTERM (a new pid every time: it used to outrun the terminate-and-rescan rounds,
flagged STILL RUNNING and left running) or an empty environment (no token: it was neither
found nor flagged). Teardown must end it and say so (tests/escaping_drivers.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness.cases.context import run_case
from harness.frontends.subprocess.driver import SubprocessDriver
from harness.hygiene.leaks import leaks_since, snapshot
from harness.results.records import Verdict
from tests.test_drivers import SPEC, smoke
from tests.timescale import RUN_CONFIG

PROGRAM = Path(__file__).resolve().parent / "escaping_drivers.py"


def running(tag: str) -> list[str]:
    return subprocess.run(["pgrep", "-af", tag], capture_output=True, text=True
                          ).stdout.splitlines()


def end_strays(tag: str) -> None:
    """A failing run must not leave the daemons to this session's leak check."""
    for _ in range(50):
        pids = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True
                              ).stdout.split()
        if not pids:
            return
        subprocess.run(["kill", "-STOP", *pids], capture_output=True)
        subprocess.run(["kill", "-KILL", *pids], capture_output=True)
        time.sleep(0.05)


@pytest.mark.parametrize("mode, note", [
    ("respawn", "stopped (SIGSTOP) and killed"),
    ("scrubbed", "had left its session"),
])
def test_an_escaping_daemon_is_ended_at_teardown(mode: str, note: str) -> None:
    tag = f"corewire-escape-{mode}-{uuid.uuid4().hex[:8]}"
    before = snapshot()
    driver = SubprocessDriver([sys.executable, str(PROGRAM), mode, tag], name=f"escape-{mode}")
    try:
        result = asyncio.run(run_case(SPEC, smoke, driver, config=RUN_CONFIG))
        assert result.verdict is Verdict.PASS, result.message
        notes = result.evidence.notes
        assert any("driver left" in n and note in n for n in notes), notes
        assert not any("STILL RUNNING" in n for n in notes), notes
        assert running(tag) == [], f"daemon still running: {running(tag)}"
        assert leaks_since(before) == []
    finally:
        end_strays(tag)
