"""Kept for users' scripts: the driver program is `harness.frontends.subprocess.program`."""

import sys

from harness.frontends.subprocess.program import main

if __name__ == "__main__":
    sys.exit(main())
