"""Shared plumbing of the driver smoke tests: start a driver against scripted engines, run a
body, and always tear both down."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from harness.frontends.api import FrontendDriver
from harness.protocol.transport.endpoints import PrivateIpcDir
from harness.protocol.wire import DEFAULT_CODEC
from mock_engines.group import EngineGroup
from mock_engines.script import EngineScript, UtilityReply

D = TypeVar("D", bound=FrontendDriver)
START_TIMEOUT = 15.0


def run_driver(make: Callable[[], D], scripts: Sequence[EngineScript],
               body: Callable[[D, EngineGroup], Awaitable[None]],
               start_timeout: float = START_TIMEOUT, body_timeout: float = 30.0) -> None:
    """Start the driver's frontend against these engines, run `body`, always tear down."""

    async def main() -> None:
        ipc = PrivateIpcDir()
        coordinator = ipc.address("dp-stats") if len(scripts) > 1 else None
        group = EngineGroup(list(scripts), coordinator_address=coordinator, codec=DEFAULT_CODEC)
        driver = make()
        try:
            await driver.start(group, start_timeout)
            await asyncio.wait_for(body(driver, group), body_timeout)
        finally:
            await driver.shutdown()
            await asyncio.to_thread(group.stop)
            ipc.cleanup()

    asyncio.run(main())


async def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll `predicate` until true or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def scripts(n: int, **kw: object) -> list[EngineScript]:
    return [EngineScript(**kw) for _ in range(n)]  # type: ignore[arg-type]


def answering(method: str, *values: object) -> list[EngineScript]:
    return [EngineScript(utilities={method: UtilityReply(v)}) for v in values]
