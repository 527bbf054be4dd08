"""harness/hygiene/worker_exit.py: a conformance worker ends at its last exit handler.

Checked in a child interpreter (the exit is the thing under test): output still buffered is
written, every other exit handler runs once, in the usual order, the interpreter's teardown
does not (an object's finaliser at teardown never prints), and the exit status stays the
interpreter's: 0, or 1 after an uncaught exception. Where a handler was registered after
install() (it has run when ours runs), the process exits as usual: nothing runs twice.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHILD = textwrap.dedent("""
    import atexit
    from harness.hygiene import worker_exit
    atexit.register(lambda: print("|earlier handler ran", end=""))
    worker_exit.install()
    if {later!r}:
        atexit.register(lambda: print("later handler ran|", end=""))

    class Teardown:
        def __del__(self):
            print(" teardown ran", end="")

    KEPT = Teardown()  # freed only by the interpreter's teardown
    print("buffered ", end="")
    if {fail!r}:
        raise RuntimeError("uncaught")
""")


@pytest.mark.parametrize(("fail", "later", "code", "teardown"), [
    (False, False, 0, False), (True, False, 1, False), (False, True, 0, True)])
def test_exit_skips_teardown(fail: bool, later: bool, code: int, teardown: bool) -> None:
    child = CHILD.format(fail=fail, later=later)
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == code, done.stderr
    ran = "later handler ran||earlier handler ran" if later else "|earlier handler ran"
    assert done.stdout.startswith("buffered " + ran), done.stdout
    assert done.stdout.count("handler ran") == (2 if later else 1)
    assert ("teardown ran" in done.stdout) is teardown
