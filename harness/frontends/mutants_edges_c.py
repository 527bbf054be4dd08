"""Mutant cores for the coordinator / DP edges that mutmut's survivors exposed (registered in
mutants.py under `-- mutation survivors C (coordinator, DP) --`). Each swaps in a
`CoordinatorCore` (or overrides one core rule) that breaks one rule the way a port author
plausibly would, calling the reference for everything else.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.frontends.api import FrontendError
from harness.frontends.reference.coordinator import (
    READY,
    SUBSCRIBE_ALL,
    CoordinatorCore,
    CoordinatorError,
    Effect,
    LoadReport,
    Publish,
)
from harness.frontends.reference.core import ReferenceFrontendCore
from harness.protocol.wire import ProtocolError
from harness.protocol.wire import messages as m


class _LoadIgnoringCoordinator(CoordinatorCore):
    def on_stats(self, rank: int, stats: object) -> list[Effect]:
        return []  # stats-only messages accepted, their counts never reach routing


class CoordinatorLoadIgnored(ReferenceFrontendCore):
    """The coordinator accepts stats-only messages but keeps no load from them (what
    vllm-rs's in-process coordinator does; Python routes by those counts)."""

    coordinator_class = _LoadIgnoringCoordinator


class _RunningOnlyCoordinator(CoordinatorCore):
    def on_stats(self, rank: int, stats: object) -> list[Effect]:
        return [LoadReport(r.rank, 0, r.running) for r in super().on_stats(rank, stats)
                if isinstance(r, LoadReport)]


class CoordinatorWaitingIgnored(ReferenceFrontendCore):
    """Only num_running_reqs counts as load; queued (waiting) requests are not."""

    coordinator_class = _RunningOnlyCoordinator


class _TolerantCoordinator(CoordinatorCore):
    def on_engine_output(self, frames: Sequence[bytes]) -> list[Effect]:
        try:
            message = self.codec.decode_outputs(frames)
        except ProtocolError:
            return super().on_engine_output(frames)
        if isinstance(message, m.EngineCoreOutputs) and (
                message.outputs or message.utility_output is not None
                or message.finished_requests):
            return []  # a miswired engine's request traffic silently dropped
        return super().on_engine_output(frames)


class CoordinatorMiswiringTolerated(ReferenceFrontendCore):
    """Request outputs, utility replies and finished ids on the coordinator path are
    dropped instead of failing the client closed."""

    coordinator_class = _TolerantCoordinator


class _CauseDroppingCoordinator(CoordinatorCore):
    def on_engine_output(self, frames: Sequence[bytes]) -> list[Effect]:
        try:
            return super().on_engine_output(frames)
        except CoordinatorError:
            raise CoordinatorError("coordinator failure") from None


class CoordinatorErrorWithoutCause(ReferenceFrontendCore):
    """The client fails closed on a miswired coordinator path, but the error names neither
    the engine nor what it sent."""

    coordinator_class = _CauseDroppingCoordinator


class _EarlyGateCoordinator(CoordinatorCore):
    def on_subscription(self, frame: bytes) -> list[Effect]:
        if (frame == SUBSCRIBE_ALL and not self.gate_open
                and self.subscriptions + 1 == self.engine_count - 1):  # off by one
            self.subscriptions += 1
            self.gate_open = True
            return [Publish((READY,))]
        return super().on_subscription(frame)


class CoordinatorReadyOneEarly(ReferenceFrontendCore):
    """The startup gate opens one subscription early: READY goes out before the last
    engine subscribed."""

    coordinator_class = _EarlyGateCoordinator


class _OnceOnlyGateCoordinator(CoordinatorCore):
    def on_subscription(self, frame: bytes) -> list[Effect]:
        if self.gate_open and frame == SUBSCRIBE_ALL:
            self.subscriptions += 1
            return []  # READY only at startup; a re-subscribing engine waits forever
        return super().on_subscription(frame)


class CoordinatorLateSubscriptionIgnored(ReferenceFrontendCore):
    """READY is published once at startup; an engine that subscribes again gets none."""

    coordinator_class = _OnceOnlyGateCoordinator


class RankRefusalUnexplained(ReferenceFrontendCore):
    """An out-of-range data_parallel_rank is refused without saying which rank."""

    def route(self, data_parallel_rank: int | None) -> int:
        try:
            return super().route(data_parallel_rank)
        except FrontendError:
            raise FrontendError("invalid data_parallel_rank") from None


class DpControlUnexplained(ReferenceFrontendCore):
    """DP control on the main output path fails the client closed without saying why."""

    def on_dp_control(self, message: m.EngineCoreOutputs) -> None:
        self.mark_dead("engine failure")
