"""A driver program that holds its case until the test lets it go, then serves the
reference frontend (harness.frontends.subprocess.program).

    python tests/gated_driver.py GATE

It creates GATE.waiting (the case has started: its run is mid-case) and waits for GATE to
exist, 60 s at most, before it reads anything; then it is the reference driver program.
"""

from __future__ import annotations

import os
import sys
import time

WAIT_S = 60.0


def main() -> int:
    gate = sys.argv[1]
    with open(f"{gate}.waiting", "w"):
        pass
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    from harness.frontends.subprocess.program import main as serve

    return serve([])


if __name__ == "__main__":
    sys.exit(main())
