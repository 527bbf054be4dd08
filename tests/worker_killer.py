"""A driver program that SIGKILLs the xdist worker running its case, mid-case, and stays up.

    python tests/worker_killer.py

It starts a daemon of its own first (a new session, the driver's token kept: what a real
frontend's helper process would be), reads the harness's `init`, kills its parent (the
worker: the subprocess driver starts the program directly) and then ignores the end of its
stdin, as a program that does not watch it would. Everything lives 120 s at most, so a
harness that fails to end it leaves nothing for ever. It refuses to run outside an xdist
worker (PYTEST_XDIST_WORKER unset): its parent would be something else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

LIFETIME_S = 120


def main() -> int:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        print("worker_killer: not started by an xdist worker; refusing", file=sys.stderr)
        return 64
    subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({LIFETIME_S})"],
                     start_new_session=True, stdout=subprocess.DEVNULL)
    sys.stdin.readline()  # `init`: the case has started
    print("worker_killer: killing the worker", os.getppid(), file=sys.stderr, flush=True)
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(LIFETIME_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
