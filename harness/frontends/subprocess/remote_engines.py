"""The engine side a driver program hands its in-process driver: the harness's engines.

In-process, `FrontendDriver.start(group, timeout)` binds, starts the engines
(`group.start_bootstrapped` / `group.start_handshake`) and waits until serving, all in one
call. Behind the protocol the harness owns the engines and splits that call in two: `init`
asks where the frontend listens, the harness starts its engines after the reply, and
`wait_ready` brings the startup bound. `RemoteEngineSide` bridges the two: the driver's
start runs in a task from `init`; when it asks to start the engines, the side answers
`init` with the addresses and holds the driver there (synchronously, as the call is
synchronous) until the harness's `wait_ready` is in, so the driver's wait begins when the
harness's does, and it settles the `StartupBound` the driver was started with to the
seconds `wait_ready` carries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.frontends.api import StartupError


class StartupBound(float):
    """A driver's startup bound whose seconds arrive after the driver was started.

    A float (what `FrontendDriver.start` takes) that reads as its provisional value until
    `settle(seconds)`, and as those seconds afterwards: a driver that computes its deadline
    after asking for the engines (the reference driver: `time.monotonic() + timeout` in its
    wait) gets exactly the bound the harness's `wait_ready` gave, its own timeout error
    included ("engines [1] did not register within 1.5s"). A driver that computed its
    deadline earlier keeps the provisional one; the program bounds `wait_ready` itself.
    """

    _settled: float | None = None

    def settle(self, seconds: float) -> None:
        self._settled = float(seconds)

    @property
    def seconds(self) -> float:
        return float.__float__(self) if self._settled is None else self._settled

    def __float__(self) -> float:
        return self.seconds

    def __add__(self, other: float) -> float:
        return self.seconds + other

    def __radd__(self, other: float) -> float:
        return other + self.seconds

    def __sub__(self, other: float) -> float:
        return self.seconds - other

    def __rsub__(self, other: float) -> float:
        return other - self.seconds

    def __mul__(self, other: float) -> float:
        return self.seconds * other

    def __rmul__(self, other: float) -> float:
        return other * self.seconds

    def __truediv__(self, other: float) -> float:
        return self.seconds / other

    def __lt__(self, other: float) -> bool:
        return self.seconds < other

    def __le__(self, other: float) -> bool:
        return self.seconds <= other

    def __gt__(self, other: float) -> bool:
        return self.seconds > other

    def __ge__(self, other: float) -> bool:
        return self.seconds >= other

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (int, float)) and self.seconds == other

    def __hash__(self) -> int:
        return hash(self.seconds)

    def __format__(self, spec: str) -> str:
        return format(self.seconds, spec)

    def __repr__(self) -> str:
        return repr(self.seconds)

    __str__ = __repr__


@dataclass(frozen=True)
class RemoteEngine:
    """One of the harness's engines, as the driver sees it: its DP rank."""

    rank: int


class RemoteEngineSide:
    """An `EngineSide` whose engines the harness starts once `init` is answered.

    `answer(addresses)` replies to `init` with the protocol's address fields; `hold()` blocks
    until the harness's `wait_ready` is in and returns its bound in seconds, or raises
    StartupError (the harness shut the program down, closed stdin, or never sent it).
    """

    def __init__(self, ranks: Sequence[int], stats_address: str | None, *, handshake: bool,
                 coordinated: bool, bound: StartupBound,
                 answer: Callable[[dict[str, Any]], None], hold: Callable[[], float]) -> None:
        self.handshake = handshake
        self.coordinated = coordinated
        self._engines = [RemoteEngine(rank) for rank in ranks]
        self._stats_address = stats_address
        self._bound = bound
        self._answer = answer
        self._hold = hold
        self.addresses: dict[str, Any] | None = None  # what init was answered with

    @property
    def engines(self) -> Sequence[RemoteEngine]:
        return self._engines

    @property
    def stats_address(self) -> str | None:
        return self._stats_address

    def start_bootstrapped(self, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        """The frontend bound these: the harness's engines connect there after init."""
        self._started({"inputs": list(inputs), "outputs": list(outputs)})

    def start_handshake(self, address: str, *, local: bool = True, headless: bool = False,
                        timeout: float = 30.0) -> None:
        """The frontend owns HELLO / INIT / READY at `address` (and, when asked for, the DP
        coordinator: a driver that cannot run one refuses to start instead)."""
        self._started({"handshake": address,
                       **({"coordinator": True} if self.coordinated else {})})

    def _started(self, addresses: dict[str, Any]) -> None:
        if self.addresses is not None:
            raise StartupError("the driver asked to start the engines twice")
        self.addresses = addresses
        self._answer(addresses)
        self._bound.settle(self._hold())
