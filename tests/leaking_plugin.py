"""A pytest plugin that leaves a child process running: a session-end leak, outside any case."""

from __future__ import annotations

import os
import subprocess

import pytest

_LEFT: list[subprocess.Popen[bytes]] = []


def pytest_runtest_call(item: pytest.Item) -> None:
    if not _LEFT:
        _LEFT.append(subprocess.Popen(["sleep", "60"]))
        with open(os.environ["LEAKING_PLUGIN_PIDS"], "a") as pids:  # the test ends it
            pids.write(f"{_LEFT[0].pid}\n")
