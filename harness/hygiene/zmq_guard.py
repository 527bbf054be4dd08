"""ZMQ contexts a case left open, found and destroyed at teardown before the GC can hang on them.

The hazard: a `zmq.Context` that becomes garbage while one of its sockets is still open (a
socket made through a shadow context, as vLLM's asyncio client does, or one with unsent
messages and an infinite LINGER) blocks for ever in `term()`, called from `__del__` by
whichever thread runs that GC pass. An in-process driver that leaks its frontend (a broken
mutant, a shutdown bug) so hangs some later, unrelated case, or the run's exit.

Every context made in this process is registered at construction, in a weak set (`install`
wraps `zmq.Context.__init__` once; zmq itself is untouched, nothing is mocked). A full
`gc.get_objects()` scan would find them too, but costs 0.3-0.8 s per scan once vLLM is
imported, so twice per case is too slow. At teardown `reap(mark)` takes every context made
since `mark` that is still open (owners not terminated; shadows with open sockets), closes
their sockets with LINGER 0 and terminates the owners on a daemon thread, bounded: it never
blocks the case. A context whose `term()` still does not return is kept referenced for the
life of the process, so the GC never calls its `__del__` (which would block). Contexts made
by a thread that is still running (other than the caller's) are reported, not touched:
closing a socket under a thread that uses it is not safe.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq

TERM_TIMEOUT = 2.0  # seconds for term() once every socket is closed with LINGER 0


@dataclass(frozen=True)
class _Origin:
    """Where and on which thread a context was made (named in the leak note)."""

    serial: int
    where: str
    thread: int  # threading.get_ident() of the creating thread


_ORIGINS: weakref.WeakKeyDictionary[Any, _Origin] = weakref.WeakKeyDictionary()
_SERIAL = itertools.count(1)
_LAST = [0]  # the serial of the newest context (a mark is "everything after this")
_STUCK: list[Any] = []  # contexts whose term() did not return: never let the GC have them
_LOCK = threading.Lock()
_ZMQ_DIR = os.path.dirname(zmq.__file__)


def _creator() -> str:
    """file:line of the first frame outside pyzmq (and this module): who made the context."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith(_ZMQ_DIR)
                                 or frame.f_code.co_filename == __file__):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"


def install() -> None:
    """Register every zmq.Context (subclasses and shadows included) made from now on."""
    with _LOCK:
        if getattr(zmq.Context.__init__, "_corewire_guard", False):
            return
        original = zmq.Context.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            serial = next(_SERIAL)
            _LAST[0] = serial
            _ORIGINS[self] = _Origin(serial, _creator(), threading.get_ident())

        __init__._corewire_guard = True  # type: ignore[attr-defined]
        zmq.Context.__init__ = __init__  # type: ignore[method-assign]


def mark() -> int:
    """A point in time: `reap(mark())` later considers only contexts made after it."""
    install()
    return _LAST[0]


def _open_sockets(ctx: Any) -> list[Any]:
    return [s for s in list(getattr(ctx, "_sockets", None) or ()) if not s.closed]


def _left_open(ctx: Any) -> bool:
    if ctx is type(ctx)._instance:  # the process-wide zmq.Context.instance() outlives cases
        return bool(_open_sockets(ctx))
    if getattr(ctx, "_shadow", False):  # a shadow owns nothing but the sockets made through it
        return bool(_open_sockets(ctx))
    return not ctx.closed


def close_leaked(since: int, spare: Sequence[Any] = ()) -> tuple[list[str], list[Any]]:
    """Close (LINGER 0) the open sockets of every context made after `since` that is still
    open; one note per leaked context, and the owners still to terminate. Call it on the
    thread that ran the case (asyncio sockets are not thread-safe). Contexts in `spare` are
    left alone (the engine group's, when its threads did not stop: they still use it)."""
    spared = {id(c) for c in spare}
    with _LOCK:
        leaked = sorted(((o, c) for c, o in list(_ORIGINS.items())
                         if o.serial > since and id(c) not in spared and _left_open(c)),
                        key=lambda oc: oc[0].serial)
    live_threads = {t.ident for t in threading.enumerate()} - {threading.get_ident()}
    notes: list[str] = []
    owners: list[Any] = []
    for origin, ctx in leaked:
        sockets = _open_sockets(ctx)
        shadow = bool(getattr(ctx, "_shadow", False))
        what = (f"{'shadow ' if shadow else ''}zmq context made at {origin.where} left open "
                f"with {len(sockets)} open socket(s)")
        if origin.thread in live_threads:
            notes.append(f"{what}: not destroyed (the thread that made it still runs)")
            continue
        for sock in sockets:
            with contextlib.suppress(Exception):
                sock.close(linger=0)
        owner = not shadow and not ctx.closed and ctx is not type(ctx)._instance
        if owner:
            owners.append(ctx)
        notes.append(f"{what}: sockets closed with LINGER 0"
                     + ("; context terminated" if owner else ""))
    return notes, owners


def terminate(owners: list[Any], timeout: float = TERM_TIMEOUT) -> list[str]:
    """term() every owner on a daemon thread, waiting at most `timeout` seconds; a note if
    some did not terminate (they are then kept referenced: their __del__ would block)."""
    if not owners:
        return []
    finished = threading.Event()

    def term() -> None:
        for ctx in owners:
            with contextlib.suppress(Exception):
                ctx.term()
        finished.set()

    started = time.monotonic()
    thread = threading.Thread(target=term, name="corewire-zmq-reap", daemon=True)
    thread.start()
    if finished.wait(timeout):
        thread.join(1.0)
        return []
    stuck = [ctx for ctx in owners if not ctx.closed]
    _STUCK.extend(stuck)
    return [f"{len(stuck)} zmq context(s) did not terminate within "
            f"{time.monotonic() - started:.1f}s (a socket made elsewhere is still open); "
            f"kept referenced so that the GC never blocks on them"]


def reap(since: int, timeout: float = TERM_TIMEOUT) -> list[str]:
    """close_leaked + terminate, on the calling thread (bounded by about `timeout`)."""
    notes, owners = close_leaked(since)
    return notes + terminate(owners, timeout)
