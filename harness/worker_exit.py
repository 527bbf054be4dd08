"""A pytest-xdist worker of a conformance run that imported vLLM ends without freeing its heap.

Why: tearing down an interpreter that holds vLLM (torch, transformers: about a million
objects) costs ~2 CPU-s, and the xdist controller waits for every worker to exit before the
run ends. Six vllm-py workers on 2 CPUs made that the last ~5 s of every vllm-py run
(docs/benchmarks.md). Nothing is lost by skipping it: when the interpreter starts to exit,
the worker's session has finished (its results are with the controller, its session
helpers stopped, its leak checks done) and execnet has delivered everything (its serve loop
returned on the controller's terminate). So the last exit handler (registered first, at
configure) flushes logging and stdio and ends the process with `os._exit`; the handlers
registered after it (vLLM's, torch's, pyzmq's) have run by then. Workers that never
imported vLLM exit normally: their teardown is cheap.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys

_INSTALLED: list[bool] = []


def install() -> None:
    """Register the exit (once per process; call it from a worker's pytest_configure)."""
    if not _INSTALLED:
        _INSTALLED.append(True)
        atexit.register(_exit_now)


def _exit_now() -> None:
    if "vllm" not in sys.modules:
        return
    # An uncaught exception in the worker's main code left its traceback here: exit 1, as
    # the interpreter would have.
    code = 1 if getattr(sys, "last_value", None) is not None else 0
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(code)
