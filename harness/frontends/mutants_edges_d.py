"""Mutant reference cores for the edge cases of group D (ADD fields, request-error
messages, routing slots of ended requests): one realistic port bug each, mirroring the
blind spot a mutmut survivor showed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from harness.frontends.api import GREEDY, Sampling, StreamHandle
from harness.frontends.reference.core import (
    PendingUtility,
    ReferenceFrontendCore,
    RequestState,
    Send,
)
from harness.protocol.lifecycle import Event
from harness.protocol.wire import ProtocolError
from harness.protocol.wire import messages as m
from harness.protocol.wire.codec import AddRequest

# ----------------------------------------------------------------- ADD fields


class AddRewritten(ReferenceFrontendCore):
    """Base: the ADD the reference builds, with one field changed by `rewrite`."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        raise NotImplementedError

    def register_request(self, prompt: Sequence[int], max_tokens: int, *,
                         data_parallel_rank: int | None = None,
                         stop: Sequence[str] | None = None, request_id: str | None = None,
                         params: Mapping[str, Any] | None = None, resumable: bool = False,
                         sampling: Sampling = GREEDY) -> tuple[StreamHandle, Send]:
        handle, (identity, frames) = super().register_request(
            prompt, max_tokens, data_parallel_rank=data_parallel_rank, stop=stop,
            request_id=request_id, params=params, resumable=resumable, sampling=sampling)
        decoded = self.codec.decode_engine_input(frames)
        assert isinstance(decoded, AddRequest)
        return handle, (identity, self.codec.encode_add(self.rewrite(decoded.request)))


class AddWithoutEos(AddRewritten):
    """The tokenizer's EOS id is never copied into SamplingParams: no _eos_token_id and
    no _all_stop_token_ids, so the engine cannot stop at end of sequence."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        assert request.sampling_params is not None
        sampling = msgspec.structs.replace(request.sampling_params, _eos_token_id=None,
                                           _all_stop_token_ids=set())
        return msgspec.structs.replace(request, sampling_params=sampling)


class AddDefaultTemperature(AddRewritten):
    """The client's temperature 0 is not copied: the struct default (1.0) goes out and
    the engine samples instead of decoding greedily."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        assert request.sampling_params is not None
        sampling = msgspec.structs.replace(request.sampling_params, temperature=1.0)
        return msgspec.structs.replace(request, sampling_params=sampling)


class AddWithoutExternalId(AddRewritten):
    """external_req_id is left unset: the engine never learns the user's request id."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        return msgspec.structs.replace(request, external_req_id=None)


class PinnedRankNotStamped(AddRewritten):
    """An explicit data_parallel_rank routes the request but is stripped from the ADD."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        return msgspec.structs.replace(request, data_parallel_rank=None)


# ----------------------------------------------------------------- request errors


class RequestErrorMessageDropped(ReferenceFrontendCore):
    """The RequestError payload of an ERROR output is ignored: the client gets a generic
    failure instead of the engine's message for the user."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        if output.error is not None:
            output = msgspec.structs.replace(output, error=None)
        super().on_request_output(output)


# ----------------------------------------------------------------- routing slots


class InflightResetWhenOneEnds(ReferenceFrontendCore):
    """The engine's in-flight count is reset to zero whenever one of its requests ends
    (a busy flag, not a count): its other running requests stop counting for routing."""

    def _finish(self, rid: str, event: Event, reason: str | None,
                error: str | None = None) -> None:
        state = self.requests.get(rid)
        super()._finish(rid, event, reason, error)
        if state is not None:
            self.engines[state.rank].inflight = 0


class AbortKeepsRoutingSlot(ReferenceFrontendCore):
    """An explicit abort ends the streams but never releases their routing slots."""

    def abort(self, request_ids: Iterable[str]) -> list[Send]:
        ids = list(request_ids)
        ranks = [self.requests[rid].rank for rid in dict.fromkeys(ids)
                 if rid in self.requests]
        sends = super().abort(ids)
        for rank in ranks:
            self.engines[rank].inflight += 1
        return sends


class StopEndKeepsRoutingSlot(ReferenceFrontendCore):
    """A stream the frontend ends at a stop string keeps its routing slot: only outputs
    the engine finishes release one."""

    def end_at_stop(self, state: RequestState, engine_finished: bool) -> None:
        super().end_at_stop(state, engine_finished)
        self.engines[state.rank].inflight += 1


class EngineAbortKeepsRoutingSlot(ReferenceFrontendCore):
    """A request the engine finishes with ABORT (or REPETITION) keeps its routing slot: only
    the finish kinds the port thought of (stop, length, error) release one."""

    def end_by_engine(self, state: RequestState, output: m.EngineCoreOutput) -> None:
        super().end_by_engine(state, output)
        if output.finish_reason in (m.FinishReason.ABORT, m.FinishReason.REPETITION):
            self.engines[state.rank].inflight += 1


# ----------------------------------------------------------------- pass-through, load


class EmbedsCopiedIntoExtraArgs(ReferenceFrontendCore):
    """Every generate() param except cache_salt is copied into extra_args, prompt_embeds
    included: the tensor travels twice, once as a list of floats in SamplingParams."""

    def pass_through(self, params: Mapping[str, Any] | None
                     ) -> tuple[dict[str, Any] | None, str | None]:
        fields = dict(params or {})
        cache_salt = fields.pop("cache_salt", None)
        return (fields or None), cache_salt


class LoadReportWaitingIgnored(ReferenceFrontendCore):
    """An engine's load is its running requests only: queued (waiting) ones are ignored."""

    def on_load_report(self, rank: int, waiting: int, running: int) -> None:
        super().on_load_report(rank, 0, running)


class SchedulerStatsNotRouted(ReferenceFrontendCore):
    """scheduler_stats on the output path are dropped (metrics only): routing sees load
    only from the coordinator's publications and its own in-flight counts."""

    def on_output(self, frames: Sequence[bytes]) -> list[PendingUtility]:
        try:
            message = self.codec.decode_outputs(frames)
        except ProtocolError:
            return super().on_output(frames)
        if isinstance(message, m.EngineCoreOutputs) and message.scheduler_stats is not None:
            frames = self.codec.encode_outputs(
                msgspec.structs.replace(message, scheduler_stats=None))
        return super().on_output(frames)


class AbortsBatchedOverOneSecond(ReferenceFrontendCore):
    """Dropped streams are aborted in batches collected over a 1 s window: each ABORT
    reaches its engine up to a second late (vLLM's clients send at once)."""

    window = 1.0

    def drain_drops(self) -> list[Send]:
        if not self.pending_drops:
            self._window_opened: float | None = None
            return super().drain_drops()
        opened = getattr(self, "_window_opened", None)
        if opened is None:
            self._window_opened = opened = time.monotonic()
        if time.monotonic() - opened < self.window:
            time.sleep(0.01)  # the drain loop comes straight back while ids are queued
            return []
        self._window_opened = None
        return super().drain_drops()


class HeldTextLostAtFinish(ReferenceFrontendCore):
    """Text held back for a stop string is discarded when the stream ends any other way
    than through a token (an engine ABORT or ERROR without tokens, an abort)."""

    def _finish(self, rid: str, event: Event, reason: str | None,
                error: str | None = None) -> None:
        state = self.requests.get(rid)
        if state is not None:
            state.held_text = ""
        super()._finish(rid, event, reason, error)



class LoadReportsOnlyRise(ReferenceFrontendCore):
    """A load report raises an engine's reported load but never lowers it (merged with
    max() instead of replaced): an engine that went idle still looks busy."""

    def on_load_report(self, rank: int, waiting: int, running: int) -> None:
        before = self.engines[rank].reported if rank in self.engines else 0
        super().on_load_report(rank, waiting, running)
        if rank in self.engines:
            self.engines[rank].reported = max(before, self.engines[rank].reported)
