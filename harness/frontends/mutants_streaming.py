"""Mutant reference cores for the streaming and failure cases: one realistic port bug each.

Each overrides one rule of output handling the way a port author plausibly gets it wrong:
reading only part of a message, mapping a finish reason from the wrong field, checking
stop strings per chunk, trusting `finished_requests` in the wrong order, or surviving a
broken output stream instead of failing for good.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from harness.frontends.reference.core import PendingUtility, ReferenceFrontendCore, RequestState
from harness.protocol.lifecycle import Event
from harness.protocol.wire import ProtocolError
from harness.protocol.wire import messages as m

F = m.FinishReason


# ----------------------------------------------------------------- finish kinds


class FinalTokensDropped(ReferenceFrontendCore):
    """Ends the stream on a final output before appending the tokens it carries."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finished and output.new_token_ids:
            output.new_token_ids = []
        super().on_request_output(output)


class EngineAbortIgnored(ReferenceFrontendCore):
    """Treats FinishReason.ABORT as 'the client aborted, nothing to do': stream stays open."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is F.ABORT:
            output.finish_reason = None
        super().on_request_output(output)


class ErrorWithoutPayloadIsAbort(ReferenceFrontendCore):
    """Reports ERROR as an error only when a RequestError payload comes with it."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is F.ERROR and output.error is None:
            output.finish_reason = F.ABORT
        super().on_request_output(output)


class EosReportedAsLength(ReferenceFrontendCore):
    """Maps STOP to 'stop' only when a stop_reason is set (EOS has none)."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is F.STOP and output.stop_reason is None:
            output.finish_reason = F.LENGTH
        super().on_request_output(output)


class StopTokenHidden(ReferenceFrontendCore):
    """Drops the matched stop token id from the stream (vLLM keeps it in token_ids)."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is F.STOP and isinstance(output.stop_reason, int):
            output.new_token_ids = [t for t in output.new_token_ids if t != output.stop_reason]
        super().on_request_output(output)


class FirstEngineOutputsOnly(ReferenceFrontendCore):
    """A single-engine port: messages from any engine but the first are ignored."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        try:
            message = self.codec.decode_outputs(frames)
        except ProtocolError:
            return super().on_output(frames)
        if (isinstance(message, m.EngineCoreOutputs) and message.utility_output is None
                and message.engine_index != min(self.engines)):
            return []
        return super().on_output(frames)


# ----------------------------------------------------------------- stop strings


class StopStringPerChunk(ReferenceFrontendCore):
    """Looks for stop strings in each output's own text only, never across chunks."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        state = self.requests.get(output.request_id)
        if state is not None:
            self.__dict__["chunk_start"] = len(state.handle.text) + len(state.held_text)
        super().on_request_output(output)

    def find_stop(self, text: str, stop: str, floor: int = 0) -> int:
        start: int = self.__dict__.get("chunk_start", 0)
        return text.find(stop, max(start, floor - len(stop) + 1))


class StopTokensNotTrimmed(ReferenceFrontendCore):
    """Cuts the text at a stop string but still delivers the rest of the chunk's tokens."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        state = self.requests.get(output.request_id)
        self.__dict__["chunk"] = list(output.new_token_ids)
        self.__dict__["before"] = len(state.handle.tokens) if state is not None else 0
        super().on_request_output(output)

    def end_at_stop(self, state: RequestState, engine_finished: bool) -> None:
        chunk: list[int] = self.__dict__.get("chunk", [])
        delivered = len(state.handle.tokens) - self.__dict__.get("before", 0)
        state.handle.tokens.extend(chunk[delivered:])
        super().end_at_stop(state, engine_finished)


class StopUncheckedOnFinalOutput(ReferenceFrontendCore):
    """Skips the stop-string check on an output that finishes the request anyway."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        state = self.requests.get(output.request_id)
        if state is not None and output.finished and state.stop:
            state.stop = ()
        super().on_request_output(output)


class StopUncheckedOnFirstOutput(ReferenceFrontendCore):
    """Checks stop strings only once the stream already has output (first one skipped)."""

    def stop_position(self, state: RequestState) -> int:
        if state.handle.chunks == 0:
            return -1
        return super().stop_position(state)


# ----------------------------------------------------------------- output shapes


class UnknownIdEndsBatch(ReferenceFrontendCore):
    """Stops reading a batched message at the first output for an unknown id."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        try:
            message = self.codec.decode_outputs(frames)
        except ProtocolError:
            return super().on_output(frames)
        if isinstance(message, m.EngineCoreOutputs) and message.utility_output is None:
            for i, output in enumerate(message.outputs):
                if output.request_id not in self.requests:
                    message.outputs = message.outputs[:i]
                    frames = self.codec.encode_outputs(message)
                    break
        return super().on_output(frames)


class LateOutputsAppended(ReferenceFrontendCore):
    """Keeps ended streams routable: tokens of a repeated final output are appended again."""

    def on_ended_output(self, output: m.EngineCoreOutput) -> None:
        state = self.request(output.request_id)
        if state is not None:
            state.handle.tokens.extend(output.new_token_ids)
        super().on_ended_output(output)


class EmptyOutputsSkipped(ReferenceFrontendCore):
    """Skips outputs without new tokens, final ones included."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.new_token_ids:
            super().on_request_output(output)


class FinishedRequestsIgnored(ReferenceFrontendCore):
    """Never reads finished_requests: a request retired without a final output hangs."""

    def on_finished_requests(self, request_ids: Iterable[str]) -> None:
        pass


class FinishedRequestsBeforeOutputs(ReferenceFrontendCore):
    """Applies finished_requests before the outputs of the same message."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        try:
            message = self.codec.decode_outputs(frames)
        except ProtocolError:
            return super().on_output(frames)
        if isinstance(message, m.EngineCoreOutputs) and message.finished_requests:
            self.on_finished_requests(message.finished_requests)
        return super().on_output(frames)


class AuxFramesDropped(ReferenceFrontendCore):
    """Reads only the first frame of each message (aux frames never reach the decoder)."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        return super().on_output(list(frames)[:1])


class StatsOnlyIsProtocolError(ReferenceFrontendCore):
    """Takes a message without outputs for a utility reply, so stats-only ones are fatal."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        try:
            message = self.codec.decode_outputs(frames)
        except ProtocolError:
            return super().on_output(frames)
        if (isinstance(message, m.EngineCoreOutputs) and not message.outputs
                and message.utility_output is None and not message.finished_requests):
            self.mark_dead("message without outputs has no utility reply")
            return []
        return super().on_output(frames)


# ----------------------------------------------------------------- sticky failure


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


class ProtocolErrorSkipped(ReferenceFrontendCore):
    """Logs and skips an undecodable message, as if it were never sent."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        try:
            self.codec.decode_outputs(frames)
        except ProtocolError:
            return []
        return super().on_output(frames)


class DeathNotRecorded(ReferenceFrontendCore):
    """Fails in-flight work on death but never records it: later calls are accepted."""

    def mark_dead(self, reason: str) -> None:
        super().mark_dead(reason)
        self.dead = None


# ----------------- outputs and death (the first mutants)


class EngineDeadIgnored(ReferenceFrontendCore):
    def mark_dead(self, reason: str) -> None:
        pass


class ErrorKillsAllStreams(ReferenceFrontendCore):
    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is m.FinishReason.ERROR:
            for rid in list(self.requests):
                self._finish(rid, Event.FINAL_OUTPUT, "error", "request failed")
            return
        super().on_request_output(output)


class UnknownOutputFatal(ReferenceFrontendCore):
    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.request_id not in self.requests:
            self.mark_dead(f"output for unknown request {output.request_id}")
            return
        super().on_request_output(output)


class TokensReordered(ReferenceFrontendCore):
    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        output.new_token_ids.reverse()
        super().on_request_output(output)


class FinishReasonsConflated(ReferenceFrontendCore):
    """Reports every non-error finish as 'length'."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is not None and output.finish_reason is not m.FinishReason.ERROR:
            output.finish_reason = m.FinishReason.LENGTH
        super().on_request_output(output)


class ErrorAfterTokensIsSuccess(ReferenceFrontendCore):
    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        state = self.requests.get(output.request_id)
        if (state is not None and state.handle.tokens
                and output.finish_reason is m.FinishReason.ERROR):
            output.finish_reason = m.FinishReason.LENGTH
        super().on_request_output(output)


class FirstOutputOnly(ReferenceFrontendCore):
    """Reads only the first request output of each engine message."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        message = self.codec.decode_outputs(frames)
        if isinstance(message, m.EngineCoreOutputs) and len(message.outputs) > 1:
            message.outputs = message.outputs[:1]
            frames = self.codec.encode_outputs(message)
        return super().on_output(frames)


class EmptyDeltaFinishes(ReferenceFrontendCore):
    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if not output.new_token_ids and output.finish_reason is None:
            output.finish_reason = m.FinishReason.LENGTH
        super().on_request_output(output)


class LengthReportedAsStop(ReferenceFrontendCore):
    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is m.FinishReason.LENGTH:
            output.finish_reason = m.FinishReason.STOP
        super().on_request_output(output)


class NoText(ReferenceFrontendCore):
    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        state = self.requests.get(output.request_id)
        super().on_request_output(output)
        if state is not None:
            state.handle.text = ""


class SchedulerStatsFatal(ReferenceFrontendCore):
    """Chokes on scheduler stats (e.g. a strict decoder without the stats schema)."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        message = self.codec.decode_outputs(frames)
        if isinstance(message, m.EngineCoreOutputs) and message.scheduler_stats is not None:
            self.mark_dead("unexpected scheduler_stats")
            return []
        return super().on_output(frames)


class RetiredRequestDropped(ReferenceFrontendCore):
    """A request the engine retired without a final output is handled like a client drop:
    its stream is closed and an ABORT goes out for an id the engine no longer has."""

    def retired_without_output(self, rid: str) -> None:
        self.queue_drop([rid])


class OutputIdMatchedByPrefix(ReferenceFrontendCore):
    """An output's request id is matched loosely (the first live request whose id starts
    with it, or that it starts with): outputs of an unrelated id reach a live stream."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.request_id not in self.requests:
            for rid in self.requests:
                if rid.startswith(output.request_id) or output.request_id.startswith(rid):
                    output = msgspec.structs.replace(output, request_id=rid)
                    break
        super().on_request_output(output)
