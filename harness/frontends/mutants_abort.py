"""Abort mutants: realistic port bugs in abort routing, batching and bookkeeping.

Each overrides one rule of the reference core (registered in mutants.py's abort section)
so that the abort cases of conformance/test_abort*.py prove they can fail.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from harness.frontends.api import FrontendError, StreamHandle
from harness.frontends.reference.core import (
    MAX_ABORT_BATCH,
    ReferenceFrontendCore,
    RequestState,
    Send,
)
from harness.frontends.reference.frontend import ReferenceFrontend
from harness.protocol.lifecycle import Event
from harness.protocol.wire import messages as m

SMALL_BATCH = 8


class AbortStopTokenFinished(ReferenceFrontendCore):
    """Treats an engine-side STOP (EOS / stop token) like a frontend stop string: owes an
    ABORT for a request the engine already finished (one rule, at both places an engine's
    finish lands: the end of a request, and a session's segment boundary)."""

    def end_by_engine(self, state: RequestState, output: m.EngineCoreOutput) -> None:
        if output.finish_reason is m.FinishReason.STOP:
            self.end_at_stop(state, engine_finished=False)
            return
        super().end_by_engine(state, output)

    def segment_continues(self, state: RequestState, output: m.EngineCoreOutput) -> bool:
        goes_on = super().segment_continues(state, output)
        if goes_on and output.finish_reason is m.FinishReason.STOP:
            self.queue_drop([state.request_id])
        return goes_on


class AbortUnstartedAtFirstEngine(ReferenceFrontendCore):
    """Learns a request's engine from its first output; before that, aborts at engine 0."""

    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[Send]:
        regrouped: dict[int, list[str]] = {}
        first = min(self.engines)
        for rank, ids in per_engine.items():
            for rid in ids:
                started = rid in self.__dict__.get("started", set())
                regrouped.setdefault(rank if started else first, []).append(rid)
        return super().abort_frames(regrouped)

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        self.__dict__.setdefault("started", set()).add(output.request_id)
        super().on_request_output(output)


class AbortAcrossEnginesOneFrame(ReferenceFrontendCore):
    """Coalesces a batch into ONE frame for all engines, sent to the first owner."""

    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[Send]:
        ids = [rid for _rank, batch in sorted(per_engine.items()) for rid in batch]
        if not ids:
            return []
        return super().abort_frames({min(per_engine): ids})


class AbortBatchLimitLosesIds(ReferenceFrontendCore):
    """Drains at most 8 ids per pass and forgets the rest instead of keeping them queued."""

    def drain_drops(self) -> list[Send]:
        self.pending_drops = self.pending_drops[:SMALL_BATCH]
        return super().drain_drops()


class AbortRerouted(ReferenceFrontendCore):
    """Sends a drop's ABORT to the engine the router would pick now, not to the owner."""

    def drain_ranks(self, rid: str) -> list[int]:
        live = rid in self.requests
        pick = self.route(None) if live else None  # picked while the request still counts
        ranks = super().drain_ranks(rid)
        return [pick] if pick is not None and ranks else ranks


class ExplicitAbortUsesHistory(ReferenceFrontendCore):
    """Explicit abort looks ids up in everything the frontend remembers, so finished,
    dropped and already-aborted ids are aborted (again)."""

    def explicit_abort_ranks(self, rid: str) -> list[int]:
        state = self.request(rid)
        if state is not None and not state.phase.live:
            return [state.rank]
        return super().explicit_abort_ranks(rid)


# ----------------- abort routing and coalescing (the first mutants)


class AbortWrongEngine(ReferenceFrontendCore):
    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[Send]:
        ranks = sorted(self.engines)
        shifted = {ranks[(ranks.index(r) + 1) % len(ranks)]: ids for r, ids in per_engine.items()}
        return super().abort_frames(shifted)


class AbortOneFramePerId(ReferenceFrontendCore):
    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[Send]:
        return [(self.engines[r].identity, self.codec.encode_abort([rid]))
                for r, ids in sorted(per_engine.items()) for rid in ids]


class AbortFinishedIds(ReferenceFrontendCore):
    """Remembers ended requests (engine death included) and still aborts them when their
    stream is dropped, in a frame of their own after the drain pass's."""

    def drain_drops(self) -> list[Send]:
        late: dict[int, list[str]] = {}
        for rid in self.pending_drops[:MAX_ABORT_BATCH]:
            state = self.request(rid)
            if state is not None and not state.phase.live:
                late.setdefault(state.rank, []).append(rid)
        return super().drain_drops() + self.abort_frames(late)


class EmptyAbortFrame(ReferenceFrontendCore):
    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[Send]:
        sends = super().abort_frames(per_engine)
        return sends or [(self.engines[min(self.engines)].identity, self.codec.encode_abort([]))]


class DuplicateAbort(ReferenceFrontendCore):
    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[Send]:
        sends = super().abort_frames(per_engine)
        return sends + sends


class StopStringNotAborted(ReferenceFrontendCore):
    """A stop-string match ends the stream as if the engine had finished it: no ABORT."""

    def end_at_stop(self, state: RequestState, engine_finished: bool) -> None:
        self._finish(state.request_id, Event.FINAL_OUTPUT, "stop")


class RepeatedAbortIdFails(ReferenceFrontendCore):
    """An explicit abort that names one id twice fails before anything is sent (vLLM 0.33.0's
    OutputProcessor.abort_requests with internal ids: the repeat is removed from the
    external-id mapping a second time, ValueError), so every live id of the call runs on."""

    def abort(self, request_ids: Iterable[str]) -> list[Send]:
        ids = list(request_ids)
        if len(set(ids)) < len(ids):
            raise FrontendError("list.remove(x): x not in list")
        return super().abort(ids)


class DropFinishedByClientId(ReferenceFrontend):
    """A dropped stream is aborted by its client id whether or not it already finished: once
    a new request reuses the id, dropping the old (finished) stream aborts the new one."""

    def drop(self, handles: Sequence[StreamHandle]) -> None:
        self.drop_requests([h.request_id for h in handles if h.request_id is not None])


class AbortMatchesIdPrefix(ReferenceFrontendCore):
    """An explicit abort takes each id as a prefix: every live request whose id starts with
    it is aborted too (a port matching a client id against suffixed engine-side ids)."""

    def abort(self, request_ids: Iterable[str]) -> list[Send]:
        ids = list(request_ids)
        wider = [rid for given in ids for rid in self.requests if rid.startswith(given)]
        return super().abort([*ids, *wider])
