"""A session fixture asserting that a test session leaves nothing behind."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import pytest

from harness.hygiene.leaks import leaks_since, snapshot, stop_run_helpers


@pytest.fixture(scope="session", autouse=True)
def no_leaks_at_session_end() -> Iterator[None]:
    before = snapshot()
    yield
    stopped = stop_run_helpers()
    deadline = time.monotonic() + 5.0
    problems = stopped + leaks_since(before)
    while problems and time.monotonic() < deadline:  # sockets close asynchronously
        gc.collect()
        time.sleep(0.1)
        problems = stopped + leaks_since(before)
    assert not problems, "session leaked: " + "; ".join(problems)
