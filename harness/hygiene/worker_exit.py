"""A pytest-xdist worker of a conformance run ends without tearing its interpreter down.

Why: the xdist controller waits for every worker to exit before the run ends, and freeing
a worker's heap costs ~0.15 CPU-s (the reference lane: twelve workers, ~1 s of a 18 s run
on 2 CPUs) or ~2 CPU-s once vLLM is imported (six vllm-py workers: the last ~5 s of every
run; docs/benchmarks.md). Nothing is lost by skipping it: when the interpreter starts to
exit, the worker's session has finished (its results are with the controller, its session
helpers stopped, its leak checks done) and execnet has delivered everything (its serve
loop returned on the controller's terminate). So the worker registers one more exit
handler at unconfigure, the last registered and so the first to run: it runs every other
exit handler itself, in their usual order (logging's flush, multiprocessing's temp-dir
removal, weakref finalizers, vLLM's and torch's), flushes stdio and ends the process with
`os._exit`, keeping the interpreter's exit status.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys

_INSTALLED: list[int] = []  # the number of exit handlers once ours was registered


def install() -> None:
    """Register the exit (once per process; from a worker's pytest_unconfigure)."""
    if not _INSTALLED and hasattr(atexit, "_run_exitfuncs") and hasattr(atexit, "_ncallbacks"):
        atexit.register(_exit_now)
        _INSTALLED.append(atexit._ncallbacks())


def _exit_now() -> None:
    # Only as the first handler to run: one registered later has run already, and running
    # the rest here would run it twice (then the interpreter exits as usual).
    if atexit._ncallbacks() != _INSTALLED[0]:
        return
    # An uncaught exception in the worker's main code left its traceback here: exit 1, as
    # the interpreter would have.
    code = 1 if getattr(sys, "last_value", None) is not None else 0
    atexit.unregister(_exit_now)
    atexit._run_exitfuncs()  # the others, once each: this call never returns to the loop
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(code)
