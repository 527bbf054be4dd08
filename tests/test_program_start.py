"""A driver program's own start-up is not the frontend's startup.

Found by the soak (docs/soak.md): on a loaded machine the interpreter of the reference
driver program took longer to answer `init` than the 1.5 s startup bound of
handshake.register.never_registers, which then graded TIMEOUT ("no reply to `init`")
instead of the frontend's bounded startup error. A program that starts slowly (here: 2.5 s
before it even execs) must still be graded on what its frontend does once started.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLOW_PROGRAM = ("subprocess:sh -c " + shlex.quote(
    f"sleep 2.5; exec {sys.executable} -m harness.frontends.driver_main"))


def test_slow_starting_program_is_graded_on_its_frontend(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-p",
         "no:cacheprovider", "-n", "0", "-k", "handshake.register.never_registers",
         "--frontend", SLOW_PROGRAM, "--report-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "COREWIRE_TIMESCALE": "1"})
    rows = json.loads((tmp_path / "results.json").read_text())["results"]
    verdicts = {row["id"]: (row["verdict"], row["message"]) for row in rows}
    assert set(verdicts) == {"handshake.register.never_registers",
                             "handshake.register.never_registers_named"}, run.stdout[-2000:]
    for case_id, (verdict, message) in verdicts.items():
        assert verdict == "PASS", f"{case_id}: {verdict} {message}"
