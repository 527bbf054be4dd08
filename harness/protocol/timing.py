"""One time-scale factor for every bound the harness waits on.

Slow machines (or sanitizer builds of a port) run with `--timescale 3` (or
COREWIRE_TIMESCALE=3) and every window grows together, instead of timeouts being tuned
one by one.

The factor is a value, not ambient state: the entry points (the pytest plugin, `corewire
run`, the stateful CLI, a driver program) read the user's input once (`Timescale.from_user`,
`Timescale.from_environment`) and hand the `Timescale` down -- CaseContext.t(), every
driver (`FrontendDriver.timescale`, set by harness/frontends/table.make_driver), the stateful
worlds. Nothing below them reads the environment, and nothing writes it: a driver program
gets COREWIRE_TIMESCALE in its own child environment (`Timescale.child_env`).

`scaled()` is kept for code that is not given a Timescale yet (a mutant core, which is
sans-IO and owns no driver): it scales by the factor of the case that runs it
(`use_in_case`, a context variable set by run_case; 1 outside any case).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

ENV_VAR = "COREWIRE_TIMESCALE"


class TimescaleError(ValueError):
    """A time-scale factor that is not a positive number."""


@dataclass(frozen=True)
class Timescale:
    """A positive factor applied to every timing window."""

    factor: float = 1.0

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise TimescaleError(f"--timescale must be a positive factor, got {self.factor}")

    def scaled(self, seconds: float) -> float:
        """`seconds` multiplied by this factor."""
        return seconds * self.factor

    def child_env(self) -> dict[str, str]:
        """The environment entry that carries this factor to a driver program."""
        return {ENV_VAR: repr(self.factor)}

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> Timescale:
        """The factor an entry point was started with; lenient as it always was: a value
        that is no positive number means the default factor 1."""
        try:
            return cls(float(env.get(ENV_VAR, "1")))
        except ValueError:  # TimescaleError included
            return DEFAULT

    @classmethod
    def from_user(cls, option: float | None, env: Mapping[str, str]) -> Timescale:
        """`--timescale` when given (a non-positive one is a TimescaleError: a usage
        error), else $COREWIRE_TIMESCALE."""
        if option is not None:
            return cls(option)
        return cls.from_environment(env)


DEFAULT = Timescale()

_IN_CASE: contextvars.ContextVar[Timescale] = contextvars.ContextVar("corewire_timescale",
                                                                     default=DEFAULT)


@contextlib.contextmanager
def use_in_case(timescale: Timescale) -> Iterator[None]:
    """Within this block (and the tasks it starts), `scaled()` uses `timescale`."""
    token = _IN_CASE.set(timescale)
    try:
        yield
    finally:
        _IN_CASE.reset(token)


def scaled(seconds: float) -> float:
    """`seconds` scaled by the running case's factor (see the module docstring: for code
    that is not handed a Timescale)."""
    return _IN_CASE.get().scaled(seconds)


async def poll_until(predicate: Callable[[], bool], timeout: float,
                     interval: float = 0.005) -> bool:
    """Poll `predicate` every `interval` s for at most `timeout` s (already scaled by the
    caller); True as soon as it holds. The one polling loop of cases and transcripts."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)
    return True
