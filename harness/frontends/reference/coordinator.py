"""The reference frontend's DP coordinator as a pure state machine (no sockets, no clock).

What vLLM 0.33.0's coordinators agree on (Python `DPCoordinatorProc`, coordinator.py:186-456,
with wave coordination on, i.e. a MoE model; Rust `InProcCoordinatorRunner`,
rust/src/engine-core-client/src/coordinator/inproc.rs):

- startup gate: every engine subscribes (`b"\\x01"` on the engine-facing XPUB), then one
  `b"READY"` is published (coordinator.py:245-253, bootstrap.rs:47-81);
- `wave_complete(w)` from an engine with `w >= current_wave` -> `current_wave = w + 1`,
  paused; an older one is stale and ignored (coordinator.py:412-425, inproc.rs:93-108);
- `start_wave(w)` with `w > current_wave`, or `w == current_wave` while paused ->
  `current_wave = w`, running, and `START_DP_WAVE (w, sender)` is published so every engine
  but the sender joins; anything else is a duplicate and is not rebroadcast (:426-441);
- stats-only messages carry load, never wave control (:380-410; Rust ignores them);
- only engines start waves: a request the frontend sends does not make the coordinator
  publish anything (coordinator.py:43-46, core.py:2374-2385);
- request outputs or utility replies on the coordinator path are a wiring error (Python
  asserts, coordinator.py:383-384; Rust `bail_unexpected_coordinator_output`).

Transitions are data (`TRANSITIONS`); `CoordinatorCore` applies them and returns effects.
The frontend's in-process view of the wave (what later ADDs carry) is `WaveChanged`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.protocol.wire import ProtocolError, WireCodec
from harness.protocol.wire import messages as m

READY = b"READY"
SUBSCRIBE_ALL = b"\x01"
UNSUBSCRIBE_ALL = b"\x00"


class CoordinatorError(Exception):
    """An engine sent the coordinator something it must never receive (fatal, as in vLLM)."""


@dataclass(frozen=True)
class WaveState:
    current_wave: int = 0
    engines_running: bool = False


class Signal(enum.Enum):
    WAVE_COMPLETE = "wave_complete"
    START_WAVE = "start_wave"


@dataclass(frozen=True)
class Transition:
    """One wave rule: when `guard(state, wave)` holds, move to `target(state, wave)`;
    `rebroadcast` publishes START_DP_WAVE (wave, sender) to the engines."""

    signal: Signal
    guard: Callable[[WaveState, int], bool]
    target: Callable[[WaveState, int], WaveState]
    rebroadcast: bool
    rule: str


TRANSITIONS: tuple[Transition, ...] = (
    Transition(Signal.WAVE_COMPLETE,
               lambda s, w: w >= s.current_wave,
               lambda s, w: WaveState(w + 1, False), False,
               "wave w finished: the next wave is w + 1, engines paused (older: stale)"),
    Transition(Signal.START_WAVE,
               lambda s, w: w > s.current_wave or (w == s.current_wave
                                                    and not s.engines_running),
               lambda s, w: WaveState(w, True), True,
               "an engine started wave w: the others join it (a duplicate is dropped)"),
)


@dataclass(frozen=True)
class Publish:
    """Frames to publish on the engine-facing XPUB."""

    frames: tuple[bytes, ...]


@dataclass(frozen=True)
class WaveChanged:
    """The frontend's view of the wave (stamped on later ADDs) must follow."""

    state: WaveState


@dataclass(frozen=True)
class LoadReport:
    rank: int
    waiting: int
    running: int


Effect = Publish | WaveChanged | LoadReport


class CoordinatorCore:
    """Wave state and startup gate of one frontend-owned coordinator over N engines."""

    transitions: tuple[Transition, ...] = TRANSITIONS

    def __init__(self, engine_count: int, *, codec: WireCodec) -> None:
        self.engine_count = engine_count
        self.codec = codec
        self.state = WaveState()
        self.subscriptions = 0
        self.gate_open = False

    # ------------------------------------------------------------ subscriptions

    def on_subscription(self, frame: bytes) -> list[Effect]:
        """An XPUB subscription event: READY once every engine subscribed; a later
        subscription (an engine that reconnected) gets READY again (coordinator.py:351-360)."""
        if frame == UNSUBSCRIBE_ALL:
            return []
        if frame != SUBSCRIBE_ALL:
            raise CoordinatorError(f"unexpected message on the coordinator's engine-facing "
                                   f"socket: {frame[:16].hex()}")
        self.subscriptions += 1
        if self.gate_open:
            return [Publish((READY,))]
        if self.subscriptions >= self.engine_count:
            self.gate_open = True
            return [Publish((READY,))]
        return []

    # ------------------------------------------------------------ engine messages

    def on_engine_output(self, frames: Sequence[bytes]) -> list[Effect]:
        """One message an engine PUSHed to the coordinator (client index -1)."""
        try:
            message = self.codec.decode_outputs(frames)
        except ProtocolError as exc:
            raise CoordinatorError(f"undecodable message on the coordinator path: "
                                   f"{exc}") from exc
        if not isinstance(message, m.EngineCoreOutputs):
            raise CoordinatorError("ENGINE_CORE_DEAD on the coordinator path")
        if message.outputs or message.utility_output is not None or message.finished_requests:
            raise CoordinatorError(f"engine {message.engine_index} sent request outputs or a "
                                   "utility reply on the coordinator path")
        effects: list[Effect] = []
        if message.scheduler_stats is not None:
            effects.extend(self.on_stats(message.engine_index, message.scheduler_stats))
        if message.wave_complete is not None:
            effects.extend(self.apply(Signal.WAVE_COMPLETE, message.wave_complete,
                                      message.engine_index))
        elif message.start_wave is not None:
            effects.extend(self.apply(Signal.START_WAVE, message.start_wave,
                                      message.engine_index))
        return effects

    def on_stats(self, rank: int, stats: object) -> list[Effect]:
        """Load only: the counts feed routing; the wave state is untouched."""
        if not isinstance(stats, dict):
            return []
        return [LoadReport(rank, int(stats.get("num_waiting_reqs") or 0),
                           int(stats.get("num_running_reqs") or 0))]

    def apply(self, signal: Signal, wave: int, sender: int) -> list[Effect]:
        for transition in self.transitions:
            if transition.signal is signal and transition.guard(self.state, wave):
                self.state = transition.target(self.state, wave)
                effects: list[Effect] = [WaveChanged(self.state)]
                if transition.rebroadcast:
                    effects.insert(0, self.start_dp_wave(self.state.current_wave, sender))
                return effects
        return []

    def start_dp_wave(self, wave: int, sender: int | None) -> Publish:
        """START_DP_WAVE excluding the engine that already runs the wave."""
        return Publish(tuple(self.codec.encode_start_dp_wave(wave, sender)))

    # ------------------------------------------------------------ frontend requests

    def on_frontend_request(self, rank: int) -> list[Effect]:
        """The frontend sent an ADD to `rank`. Only engines start waves: the engine that
        gets it while paused reports start_wave itself; the coordinator stays silent."""
        return []


__all__ = ["TRANSITIONS", "CoordinatorCore", "CoordinatorError", "Effect", "LoadReport",
           "Publish", "Signal", "Transition", "WaveChanged", "WaveState"]
