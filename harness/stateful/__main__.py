"""``python -m harness.stateful``: see harness/stateful/cli.py."""

import sys

from harness.stateful.cli import main

sys.exit(main())
