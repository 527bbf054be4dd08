"""The transport-neutral half of driving `ReferenceFrontendCore`: waiters and drain passes.

Two transports drive the same sans-IO core: `ReferenceFrontend` (asyncio + pyzmq) and the
stateful fuzzer's in-memory world, where the harness plays the sockets. What they do
with each engine message (resolve utility waiters, note owed aborts, fail every waiter on
death), how a utility call is registered and always unregistered, and what one abort drain
pass sends is protocol logic, not I/O: it lives here once, so the in-memory world cannot
drift from the real one. A waiter is anything with asyncio.Future's three completion
methods: the real transport passes futures, the in-memory one `SyncWaiter`.

Status: the in-memory world uses this module; `ReferenceFrontend` still spells the same
steps inline (call_all, _read_outputs, _drain_aborts, _fail_waiters) until
harness/frontends/reference/ may change again, and then switches to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from harness.frontends.api import FrontendError

if TYPE_CHECKING:  # annotations only: reference/frontend.py imports this module, and
    # importing reference.core runs reference/__init__, which imports frontend.py: a cycle
    # when this module is imported first (tests/test_core_io.py run on its own).
    from harness.frontends.reference.core import PendingUtility, ReferenceFrontendCore, ToEngine


class Waiter(Protocol):
    """The completion side of one pending utility call (asyncio.Future fits)."""

    def done(self) -> bool: ...
    def set_result(self, result: PendingUtility, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


W = TypeVar("W", bound=Waiter)


class SyncWaiter:
    """A waiter for a transport without an event loop: it only remembers the outcome."""

    def __init__(self) -> None:
        self.result: PendingUtility | None = None
        self.exception: BaseException | None = None

    def done(self) -> bool:
        return self.result is not None or self.exception is not None

    def set_result(self, result: PendingUtility, /) -> None:
        self.result = result

    def set_exception(self, exception: BaseException, /) -> None:
        self.exception = exception


class UtilityWaiters(Generic[W]):
    """The waiter of every utility call in flight, keyed by the call."""

    def __init__(self) -> None:
        self._by_call: dict[int, W] = {}

    def __len__(self) -> int:
        return len(self._by_call)

    def resolve(self, calls: Iterable[PendingUtility]) -> None:
        """Complete the waiters of calls every engine has answered."""
        for call in calls:
            waiter = self._by_call.get(id(call))
            if waiter is not None and not waiter.done():
                waiter.set_result(call)

    def fail_all(self, error: BaseException) -> None:
        """Fail every waiter still pending (engine death, frontend closed)."""
        for waiter in self._by_call.values():
            if not waiter.done():
                waiter.set_exception(error)

    @contextmanager
    def call(self, core: ReferenceFrontendCore, method: str, args: Sequence[Any],
             waiter: W) -> Iterator[tuple[PendingUtility, list[ToEngine]]]:
        """Start a fanned-out call with `waiter` registered; on exit (reply, timeout or
        cancellation) unregister both, so a late reply is dropped as unknown."""
        call, sends = core.start_utility(method, args)
        key = id(call)
        self._by_call[key] = waiter
        try:
            yield call, sends
        finally:
            self._by_call.pop(key, None)
            core.forget_utility(call)


def take_output(core: ReferenceFrontendCore, frames: Sequence[bytes],
                waiters: UtilityWaiters[Any]) -> bool:
    """Hand one engine message to the core and complete the calls it finished.

    Returns whether the drain pass has work (a stop string ended a stream, say). Death is
    the caller's to act on (`core.dead`): the real frontend has a knob for it.
    """
    waiters.resolve(core.on_output(frames))
    return bool(core.pending_drops)


def drain_pass(core: ReferenceFrontendCore) -> tuple[list[ToEngine], bool]:
    """One pass of the abort drain loop: the frames to send, and whether ids are left."""
    sends = core.drain_drops()
    return sends, bool(core.pending_drops)


def no_reply(call: PendingUtility, bound: str) -> FrontendError:
    """The error of a utility call some engine never answered within `bound`."""
    return FrontendError(f"utility {call.method}: no reply from engines "
                         f"{call.missing_ranks()} {bound}")
