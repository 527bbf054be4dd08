"""Mutant cores for the frontend-owned DP coordinator cases: each breaks one coordinator rule
the way a port author plausibly would (a guard left out, an off-by-one, the sender's index
forgotten, an older vLLM's behaviour kept). Registered in `mutants.py`'s coordinator section.

A mutant here is a `ReferenceFrontendCore` whose `coordinator_class` (or INIT) differs.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.frontends.reference.coordinator import (
    TRANSITIONS,
    CoordinatorCore,
    CoordinatorError,
    Effect,
    Publish,
    Signal,
    Transition,
    WaveState,
)
from harness.frontends.reference.core import ReferenceFrontendCore


class _ExcludeNoneCoordinator(CoordinatorCore):
    def start_dp_wave(self, wave: int, sender: int | None) -> Publish:
        return super().start_dp_wave(wave, None)


class StartWaveWakesEveryone(ReferenceFrontendCore):
    """START_DP_WAVE is published without the sender's index (exclude None)."""

    coordinator_class = _ExcludeNoneCoordinator


class _ExcludeRankZeroCoordinator(CoordinatorCore):
    def start_dp_wave(self, wave: int, sender: int | None) -> Publish:
        return super().start_dp_wave(wave, 0)


class StartWaveExcludesRankZero(ReferenceFrontendCore):
    """The exclude index is hard-wired to rank 0 (the rank that usually starts waves)."""

    coordinator_class = _ExcludeRankZeroCoordinator


def _replace(signal: Signal, **changes: object) -> tuple[Transition, ...]:
    out = []
    for t in TRANSITIONS:
        if t.signal is signal:
            fields = {"signal": t.signal, "guard": t.guard, "target": t.target,
                      "rebroadcast": t.rebroadcast, "rule": t.rule, **changes}
            t = Transition(**fields)  # type: ignore[arg-type]
        out.append(t)
    return tuple(out)


class _UnguardedStartCoordinator(CoordinatorCore):
    transitions = _replace(Signal.START_WAVE, guard=lambda s, w: True)


class DuplicateStartWaveRebroadcast(ReferenceFrontendCore):
    """Every start_wave is rebroadcast, even for the wave already running."""

    coordinator_class = _UnguardedStartCoordinator


class _WaveNotAdvancedCoordinator(CoordinatorCore):
    transitions = _replace(Signal.WAVE_COMPLETE,
                           target=lambda s, w: WaveState(w, False))


class WaveCompleteNotAdvanced(ReferenceFrontendCore):
    """wave_complete(w) pauses the engines but leaves the wave at w (no +1)."""

    coordinator_class = _WaveNotAdvancedCoordinator


class _UnguardedCompleteCoordinator(CoordinatorCore):
    transitions = _replace(Signal.WAVE_COMPLETE, guard=lambda s, w: True)


class StaleWaveCompleteRewinds(ReferenceFrontendCore):
    """Every wave_complete(w) moves the wave to w + 1, a stale one too (the wave rewinds)."""

    coordinator_class = _UnguardedCompleteCoordinator


class _StatsFatalCoordinator(CoordinatorCore):
    def on_stats(self, rank: int, stats: object) -> list[Effect]:
        raise CoordinatorError(f"engine {rank}: coordinator message without wave control")


class StatsOnlyFatal(ReferenceFrontendCore):
    """Every coordinator message must carry start_wave / wave_complete; stats-only kills it."""

    coordinator_class = _StatsFatalCoordinator


class _FrontendWakesCoordinator(CoordinatorCore):
    def on_frontend_request(self, rank: int) -> list[Effect]:
        if self.state.engines_running:
            return []
        return [self.start_dp_wave(self.state.current_wave, rank)]


class FrontendStartsWave(ReferenceFrontendCore):
    """A request sent while paused makes the coordinator publish START_DP_WAVE itself
    (vLLM's earlier FIRST_REQ behaviour, which 0.33.0 dropped: coordinator.py:43-46)."""

    coordinator_class = _FrontendWakesCoordinator


class InitWithoutCoordinator(ReferenceFrontendCore):
    """INIT carries only the input/output addresses; the coordinator's are left out."""

    def init_message(self, rank: int, inputs: Sequence[str], outputs: Sequence[str]) -> bytes:
        saved, self.coordinator_addresses = self.coordinator_addresses, None
        try:
            return super().init_message(rank, inputs, outputs)
        finally:
            self.coordinator_addresses = saved


class InitNamesAbsentCoordinator(ReferenceFrontendCore):
    """INIT always names coordinator addresses, also when this frontend runs no coordinator
    (the DP path's INIT reused for a single engine): the engine takes itself for a DP rank
    with a coordinator (vllm/v1/engine/core.py:1210)."""

    def init_message(self, rank: int, inputs: Sequence[str], outputs: Sequence[str]) -> bytes:
        if self.coordinator_addresses is not None:
            return super().init_message(rank, inputs, outputs)
        self.coordinator_addresses = (inputs[0] + "-coord-in", inputs[0] + "-coord-out")
        try:
            return super().init_message(rank, inputs, outputs)
        finally:
            self.coordinator_addresses = None
