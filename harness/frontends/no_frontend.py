"""A driver with no frontend: component cases (which test a component, not the wire) run
through the same case runner and reports, and must never touch a frontend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.frontends.api import (
    FrontendDriver,
    ObservedConfig,
    Sampling,
    StreamHandle,
    UnsupportedOperation,
)


class NoFrontend(FrontendDriver):
    """Component cases start no engines and drive no frontend; every call is refused."""

    def __init__(self, name: str = "none") -> None:
        self.name = name

    async def start(self, group: Any, timeout: float) -> None:
        raise UnsupportedOperation("component cases start no frontend")

    async def generate(self, prompt_token_ids: Sequence[int], max_tokens: int, *,
                       stream: bool = True, data_parallel_rank: int | None = None,
                       stop: Sequence[str] | None = None, request_id: str | None = None,
                       params: Mapping[str, Any] | None = None,
                       sampling: Sampling | None = None) -> StreamHandle:
        raise UnsupportedOperation("generate")

    async def drop(self, handles: Sequence[StreamHandle]) -> None:
        raise UnsupportedOperation("drop")

    async def abort(self, request_ids: Sequence[str]) -> None:
        raise UnsupportedOperation("abort")

    async def is_sleeping(self) -> bool:
        raise UnsupportedOperation("is_sleeping")

    async def reset_prefix_cache(self, reset_running_requests: bool = False,
                                 reset_connector: bool = False) -> bool:
        raise UnsupportedOperation("reset_prefix_cache")

    async def observed_config(self) -> ObservedConfig:
        raise UnsupportedOperation("observed_config")

    async def shutdown(self) -> None:
        return None
