"""Data-parallel rules of the reference frontend: routing, the coordinator's publications.

A request without an explicit rank goes to the least-loaded engine (its own in-flight
count raised to the load the engine or the DP coordinator last reported); the
coordinator's DPStatsUpdate carries the newest wave and per-rank counts, and DP control
messages (wave_complete / start_wave) on the main output path mean a miswired engine.
These rules are the `DataParallelRules` mixin of the reference core (core.py), one small
method each, so a mutant frontend overrides exactly one; the core provides the
attributes and hooks below.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from harness.frontends.api import FrontendError
from harness.protocol.wire import messages as m

if TYPE_CHECKING:
    from harness.frontends.reference.state import EngineState


class DataParallelRules:
    """DP rules of `ReferenceFrontendCore` (which provides the attributes below)."""

    engines: dict[int, EngineState]
    current_wave: int  # the DP coordinator's latest wave, stamped on every ADD
    _rotation: Iterator[int]  # the tie-break among equally loaded engines

    def load_score(self, rank: int) -> int:
        raise NotImplementedError

    def on_load_report(self, rank: int, waiting: int, running: int) -> None:
        raise NotImplementedError

    def mark_dead(self, reason: str) -> None:
        raise NotImplementedError

    def route(self, data_parallel_rank: int | None) -> int:
        """An explicit rank is honoured (and validated); otherwise the least-loaded engine."""
        if data_parallel_rank is not None:
            if data_parallel_rank not in self.engines:
                raise FrontendError(f"data_parallel_rank {data_parallel_rank} is not one of "
                                    f"this frontend's engines {sorted(self.engines)}")
            return data_parallel_rank
        start = next(self._rotation)
        order = sorted(self.engines, key=lambda r: (self.load_score(r),
                                                    (r - start) % len(self.engines)))
        return order[0]

    def on_dp_control(self, message: m.EngineCoreOutputs) -> None:
        """wave_complete / start_wave belong on the coordinator's path; on the main output
        path they mean a miswired engine or coordinator, so the client fails closed
        (vLLM's Rust client: UnexpectedDispatcherOutput)."""
        self.mark_dead(f"DP control on the main output path from engine "
                       f"{message.engine_index} (wave_complete={message.wave_complete}, "
                       f"start_wave={message.start_wave})")

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        """A coordinator publication: the newest wave is what later ADDs carry; counts (one
        triple per DP rank, in rank order) are load reports."""
        self.current_wave = update.current_wave
        ranks = sorted(self.engines)
        for i, (waiting, running, _kv) in enumerate(update.counts or []):
            if i < len(ranks):
                self.on_load_report(ranks[i], int(waiting), int(running))
