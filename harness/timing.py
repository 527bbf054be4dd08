"""One time-scale factor for every bound the harness waits on.

Slow machines (or sanitizer builds of a port) set COREWIRE_TIMESCALE=3 and every window
grows together, instead of timeouts being tuned one by one.
"""

from __future__ import annotations

import os


def timescale() -> float:
    try:
        value = float(os.environ.get("COREWIRE_TIMESCALE", "1"))
    except ValueError:
        return 1.0
    return value if value > 0 else 1.0


def scaled(seconds: float) -> float:
    """`seconds` multiplied by the global time-scale factor."""
    return seconds * timescale()
