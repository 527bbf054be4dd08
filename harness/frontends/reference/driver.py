"""`FrontendDriver` for the embedded reference frontend (in-process, the default)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from harness.frontends.api import (
    ALL_CAPABILITIES,
    GREEDY,
    PASS_THROUGH_FIELDS,
    TENSOR_FIELDS,
    Capability,
    FrontendDriver,
    FrontendError,
    ObservedConfig,
    Sampling,
    StreamHandle,
    check_generate_options,
)
from harness.frontends.reference.core import ReferenceFrontendCore
from harness.frontends.reference.frontend import CoreFactory, ReferenceFrontend
from harness.protocol.transport.endpoints import PrivateIpcDir
from harness.protocol.wire import VLLM_0_33, ProtocolProfile, codec_for

if TYPE_CHECKING:
    from harness.frontends.api import EngineSide


class ReferenceDriver(FrontendDriver):
    """Drives `ReferenceFrontend`; `core_factory` swaps in a mutant core for self-tests.

    `profile`: the protocol the frontend speaks (its codec is threaded into the core).
    """

    name = "reference"
    capabilities: frozenset[Capability] = ALL_CAPABILITIES

    def __init__(self, core_factory: CoreFactory = ReferenceFrontendCore,
                 name: str | None = None, frontend_kwargs: dict[str, Any] | None = None,
                 profile: ProtocolProfile = VLLM_0_33,
                 frontend_class: type[ReferenceFrontend] = ReferenceFrontend) -> None:
        self.core_factory = core_factory
        self.protocol_profile = profile
        self.frontend_kwargs = frontend_kwargs or {}
        self.frontend_class = frontend_class  # the I/O layer (a mutant's, when its bug is there)
        if name is not None:
            self.name = name
        self.frontend: ReferenceFrontend | None = None
        self._ipc: PrivateIpcDir | None = None

    def _fe(self) -> ReferenceFrontend:
        if self.frontend is None:
            raise RuntimeError("reference driver is not started")
        return self.frontend

    async def start(self, group: EngineSide, timeout: float) -> None:
        self._ipc = PrivateIpcDir()
        inputs, outputs = self._ipc.address("in"), self._ipc.address("out")
        self.frontend = self.frontend_class([e.rank for e in group.engines],
                                          codec=codec_for(self.protocol_profile),
                                          core_factory=self.core_factory,
                                          stats_address=group.stats_address,
                                          timescale=self.timescale, **self.frontend_kwargs)
        if group.handshake:
            handshake = self._ipc.address("handshake")
            coordinator = ((self._ipc.address("coord-in"), self._ipc.address("coord-out"))
                           if group.coordinated else None)
            self.frontend.bind(inputs, outputs, handshake, coordinator)
            group.start_handshake(handshake, timeout=timeout)
        else:
            self.frontend.bind(inputs, outputs)
            group.start_bootstrapped([inputs], [outputs])
        await self.frontend.wait_ready(timeout)

    async def generate(self, prompt_token_ids: Sequence[int], max_tokens: int, *,
                       stream: bool = True, data_parallel_rank: int | None = None,
                       stop: Sequence[str] | None = None, request_id: str | None = None,
                       params: Mapping[str, Any] | None = None,
                       sampling: Sampling | None = None) -> StreamHandle:
        check_generate_options(self.name, request_id, params, request_ids=True,
                               pass_through=PASS_THROUGH_FIELDS + TENSOR_FIELDS)
        return await self._fe().generate(prompt_token_ids, max_tokens,
                                         data_parallel_rank=data_parallel_rank, stop=stop,
                                         request_id=request_id, params=params,
                                         sampling=sampling or GREEDY)

    async def open_session(self, prompt_token_ids: Sequence[int], max_tokens: int, *,
                           data_parallel_rank: int | None = None,
                           sampling: Sampling | None = None) -> StreamHandle:
        return await self._fe().open_session(prompt_token_ids, max_tokens,
                                             data_parallel_rank=data_parallel_rank,
                                             sampling=sampling or GREEDY)

    async def continue_session(self, handle: StreamHandle, prompt_token_ids: Sequence[int],
                               max_tokens: int) -> None:
        await self._fe().continue_session(_session_id(handle), prompt_token_ids, max_tokens)

    async def close_session(self, handle: StreamHandle) -> None:
        await self._fe().close_session(_session_id(handle))

    async def drop(self, handles: Sequence[StreamHandle]) -> None:
        self._fe().drop(handles)

    async def abort(self, request_ids: Sequence[str]) -> None:
        await self._fe().abort(request_ids)

    async def is_sleeping(self) -> bool:
        return await self._fe().is_sleeping()

    async def reset_prefix_cache(self, reset_running_requests: bool = False,
                                 reset_connector: bool = False) -> bool:
        return await self._fe().reset_prefix_cache(reset_running_requests, reset_connector)

    async def call_utility(self, method: str, args: Sequence[Any]) -> Any:
        return await self._fe().call_utility(method, args)

    async def observed_config(self) -> ObservedConfig:
        cfg = self._fe().core.config
        return ObservedConfig(cfg.max_model_len, cfg.block_size, cfg.num_gpu_blocks)

    def fault(self) -> str | None:
        """A background task of the reference frontend that died: a harness fault (ERROR)."""
        return None if self.frontend is None else self.frontend.task_failure

    async def shutdown(self) -> None:
        if self.frontend is not None:
            await self.frontend.close()
        if self._ipc is not None:
            self._ipc.cleanup()
            self._ipc = None


def _session_id(handle: StreamHandle) -> str:
    if handle.request_id is None:
        raise FrontendError("the handle names no request: it is not a session's handle")
    return handle.request_id
