"""The failure area's mutants: reference frontends that each break one failure rule.

Each registers itself (harness/mutation/registry.py); the kill matrix and
`--frontend mutant:NAME` find it there.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.frontends.reference.core import (
    PendingUtility,
    ReferenceFrontendCore,
)
from harness.mutation import registry
from harness.mutation.registry import VLLM, Mutant, mutant, register
from harness.protocol.lifecycle import Event
from harness.protocol.wire import ProtocolError
from harness.protocol.wire import messages as m


@mutant("death_spares_unstarted", "engine death fails only streams that had output")
class DeathSparesUnstarted(ReferenceFrontendCore):
    """Engine death fails only the streams that already had output (a port that fails
    streams from its output-handling path, which a stream without output never reached):
    a stream still waiting for its first token waits forever."""

    def mark_dead(self, reason: str) -> None:
        if self.dead is not None:
            return
        waiting = [rid for rid, state in self.requests.items()
                   if not state.handle.first_output.is_set()]
        held = {rid: self.requests.pop(rid) for rid in waiting}
        super().mark_dead(reason)
        self.requests.update(held)


@mutant("hist_connection_loss_not_death", "a lost engine connection is not engine "
        "death", source=VLLM + "pull/21728", history=True)
class ConnectionLossNotDeath(ReferenceFrontendCore):
    """vLLM PR #21728 ("[Bugfix] check health for engine core process exiting
    unexpectedly"): only an ENGINE_CORE_DEAD message counted as engine death; an engine
    process that went away without sending one (its connection lost) left the client
    serving, its requests and calls waiting."""

    def mark_dead(self, reason: str) -> None:
        if reason.startswith("engine connection lost"):
            if self.dead is None:
                registry.fired("hist_connection_loss_not_death")
            return
        super().mark_dead(reason)


@mutant("protocol_error_not_sticky", "undecodable message: streams fail, client serves on")
class ProtocolErrorNotSticky(ReferenceFrontendCore):
    """Fails the open streams on an undecodable message, then serves on."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        try:
            self.codec.decode_outputs(frames)
        except ProtocolError as exc:
            for rid in list(self.requests):
                self._finish(rid, Event.ENGINE_DEAD, "error", f"protocol error: {exc}")
            return []
        return super().on_output(frames)


@mutant("protocol_error_skipped", "an undecodable message skipped")
class ProtocolErrorSkipped(ReferenceFrontendCore):
    """Logs and skips an undecodable message, as if it were never sent."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        try:
            self.codec.decode_outputs(frames)
        except ProtocolError:
            return []
        return super().on_output(frames)


@mutant("death_not_recorded", "death fails in-flight work but later calls are accepted")
class DeathNotRecorded(ReferenceFrontendCore):
    """Fails in-flight work on death but never records it: later calls are accepted."""

    def mark_dead(self, reason: str) -> None:
        super().mark_dead(reason)
        self.dead = None


@mutant("engine_dead_ignored", "ENGINE_CORE_DEAD (and lost engines) ignored")
class EngineDeadIgnored(ReferenceFrontendCore):
    def mark_dead(self, reason: str) -> None:
        pass


@mutant("scheduler_stats_fatal", "scheduler stats on a message kill the client")
class SchedulerStatsFatal(ReferenceFrontendCore):
    """Chokes on scheduler stats (e.g. a strict decoder without the stats schema)."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        message = self.codec.decode_outputs(frames)
        if isinstance(message, m.EngineCoreOutputs) and message.scheduler_stats is not None:
            self.mark_dead("unexpected scheduler_stats")
            return []
        return super().on_output(frames)


register(Mutant("dead_leaves_calls_pending",
                "engine death does not fail pending utility calls",
                ReferenceFrontendCore,
                {"fail_calls_on_death": False}))


register(Mutant("first_output_deadline",
                "requests fail without output within 0.5 s",
                ReferenceFrontendCore,
                {"first_output_deadline": 0.5}))
