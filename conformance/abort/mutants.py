"""The abort area's mutants: reference frontends that each break one abort rule.

Each registers itself (harness/mutation/registry.py); the kill matrix and
`--frontend mutant:NAME` find it there.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from conformance.streaming.mutants import AddRewritten
from harness.frontends.api import FrontendError, StreamHandle
from harness.frontends.reference.core import (
    DuplicateRequestId,
    ReferenceFrontendCore,
    RequestState,
    ToEngine,
)
from harness.frontends.reference.frontend import ReferenceFrontend
from harness.mutation import registry
from harness.mutation.registry import VLLM, mutant
from harness.protocol.lifecycle import Event
from harness.protocol.wire import messages as m

SMALL_BATCH = 8


@mutant("abort_stop_token_finished", "requests finished by an engine STOP aborted anyway")
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


@mutant("abort_unstarted_at_first_engine", "requests without output yet aborted at engine 0")
class AbortUnstartedAtFirstEngine(ReferenceFrontendCore):
    """Learns a request's engine from its first output; before that, aborts at engine 0."""

    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[ToEngine]:
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


@mutant("abort_across_engines_one_frame", "one ABORT frame for all engines' ids")
class AbortAcrossEnginesOneFrame(ReferenceFrontendCore):
    """Coalesces a batch into ONE frame for all engines, sent to the first owner."""

    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[ToEngine]:
        ids = [rid for _rank, batch in sorted(per_engine.items()) for rid in batch]
        if not ids:
            return []
        return super().abort_frames({min(per_engine): ids})


@mutant("abort_batch_limit_loses_ids", "ids past 8 per drain pass forgotten")
class AbortBatchLimitLosesIds(ReferenceFrontendCore):
    """Drains at most 8 ids per pass and forgets the rest instead of keeping them queued."""

    def drain_drops(self) -> list[ToEngine]:
        self.pending_drops = self.pending_drops[:SMALL_BATCH]
        return super().drain_drops()


@mutant("abort_rerouted", "drops aborted at the engine the router picks now")
class AbortRerouted(ReferenceFrontendCore):
    """Sends a drop's ABORT to the engine the router would pick now, not to the owner."""

    def drain_ranks(self, rid: str) -> list[int]:
        live = rid in self.requests
        pick = self.route(None) if live else None  # picked while the request still counts
        ranks = super().drain_ranks(rid)
        return [pick] if pick is not None and ranks else ranks


@mutant("explicit_abort_uses_history",
        "explicit abort sends finished, dropped and aborted ids again")
class ExplicitAbortUsesHistory(ReferenceFrontendCore):
    """Explicit abort looks ids up in everything the frontend remembers, so finished,
    dropped and already-aborted ids are aborted (again)."""

    def explicit_abort_ranks(self, rid: str) -> list[int]:
        state = self.request(rid)
        if state is not None and not state.phase.live:
            return [state.rank]
        return super().explicit_abort_ranks(rid)


@mutant("abort_wrong_engine", "ABORT sent to the wrong engine")
class AbortWrongEngine(ReferenceFrontendCore):
    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[ToEngine]:
        ranks = sorted(self.engines)
        shifted = {ranks[(ranks.index(r) + 1) % len(ranks)]: ids for r, ids in per_engine.items()}
        return super().abort_frames(shifted)


@mutant("abort_one_frame_per_id", "one ABORT frame per id (no coalescing)")
class AbortOneFramePerId(ReferenceFrontendCore):
    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[ToEngine]:
        return [(self.engines[r].identity, self.codec.encode_abort([rid]))
                for r, ids in sorted(per_engine.items()) for rid in ids]


@mutant("empty_abort_frame", "an empty ABORT frame when nothing is live")
class EmptyAbortFrame(ReferenceFrontendCore):
    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[ToEngine]:
        sends = super().abort_frames(per_engine)
        return sends or [(self.engines[min(self.engines)].identity, self.codec.encode_abort([]))]


@mutant("duplicate_abort", "every ABORT frame sent twice")
class DuplicateAbort(ReferenceFrontendCore):
    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[ToEngine]:
        sends = super().abort_frames(per_engine)
        return sends + sends


@mutant("repeated_abort_id_fails", "an explicit abort naming an id twice fails, "
        "nothing aborted")
class RepeatedAbortIdFails(ReferenceFrontendCore):
    """An explicit abort that names one id twice fails before anything is sent (vLLM 0.33.0's
    OutputProcessor.abort_requests with internal ids: the repeat is removed from the
    external-id mapping a second time, ValueError), so every live id of the call runs on."""

    def abort(self, request_ids: Iterable[str]) -> list[ToEngine]:
        ids = list(request_ids)
        if len(set(ids)) < len(ids):
            raise FrontendError("list.remove(x): x not in list")
        return super().abort(ids)


@mutant("drop_finished_by_client_id", "dropping a finished stream aborts the request "
        "now using its client id")
class DropFinishedByClientId(ReferenceFrontend):
    """A dropped stream is aborted by its client id whether or not it already finished: once
    a new request reuses the id, dropping the old (finished) stream aborts the new one."""

    def drop(self, handles: Sequence[StreamHandle]) -> None:
        self.drop_requests([h.request_id for h in handles if h.request_id is not None])


@mutant("abort_matches_id_prefix", "an explicit abort also aborts live ids it is a "
        "prefix of")
class AbortMatchesIdPrefix(ReferenceFrontendCore):
    """An explicit abort takes each id as a prefix: every live request whose id starts with
    it is aborted too (a port matching a client id against suffixed engine-side ids)."""

    def abort(self, request_ids: Iterable[str]) -> list[ToEngine]:
        ids = list(request_ids)
        wider = [rid for given in ids for rid in self.requests if rid.startswith(given)]
        return super().abort([*ids, *wider])


@mutant("abort_stops_at_unknown_id", "explicit abort stops at the first unknown id")
class AbortStopsAtUnknownId(ReferenceFrontendCore):
    """Explicit abort stops at the first id it does not know (`break` for `continue`):
    live ids after a finished or unknown one are never aborted."""

    def abort(self, request_ids: Iterable[str]) -> list[ToEngine]:
        ids = list(dict.fromkeys(request_ids))
        known = []
        for rid in ids:
            if rid not in self.requests:
                break
            known.append(rid)
        return super().abort(known)


@mutant("abort_list_forwarded_whole", "explicit abort forwards unknown ids to an engine")
class AbortListForwardedWhole(ReferenceFrontendCore):
    """Forwards the ids it does not know along with the live ones, to the engine owning
    the first live id (a port that filters only for routing, not for the frame)."""

    def explicit_abort_batch(self, request_ids: Sequence[str]) -> dict[int, list[str]]:
        live = [rid for rid in request_ids if rid in self.requests]
        first_rank = self.requests[live[0]].rank if live else None
        per_engine = super().explicit_abort_batch(request_ids)
        if first_rank is not None:
            per_engine.setdefault(first_rank, []).extend(
                rid for rid in request_ids if rid not in live)
        return per_engine


@mutant("explicit_abort_no_reason", "explicitly aborted streams end without a finish "
        "reason")
class ExplicitAbortEndsWithoutReason(ReferenceFrontendCore):
    """Ends explicitly aborted streams with no finish reason (the port treats the abort as
    'the client knows already')."""

    def _finish(self, rid: str, event: Event, reason: str | None,
                error: str | None = None) -> None:
        state = self.requests.get(rid)
        if reason == "abort" and state is not None and not state.handle.dropped:
            reason = None
        super()._finish(rid, event, reason, error)


@mutant("aborts_batched_over_one_second", "dropped streams aborted after a 1 s "
        "batching window")
class AbortsBatchedOverOneSecond(ReferenceFrontendCore):
    """Dropped streams are aborted in batches collected over a 1 s window: each ABORT
    reaches its engine up to a second late (vLLM's clients send at once)."""

    window = 1.0

    def drain_drops(self) -> list[ToEngine]:
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


@mutant("hist_id_freed_before_abort", "a dropped stream's id is freed before its ABORT "
        "is sent; a reuse of the id is aborted instead", source=VLLM + "pull/24382", history=True)
class IdFreedBeforeAbort(ReferenceFrontendCore):
    """vLLM issue #23697 / PR #24382 ("[Bugfix] request_id abort-reuse race fix"; also PR
    #15326): the output processor freed a request id as soon as the request was aborted,
    before the ABORT reached EngineCore, so a new request reusing the id was accepted and
    its ADD overtook the ABORT, which then aborted the new request. Here a dropped stream's
    id is freed at drop time; the drain pass sends the ABORT by id afterwards."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.freed: dict[str, list[int]] = {}  # id -> engines its late ABORT goes to

    def queue_drop(self, request_ids: Iterable[str]) -> None:
        ids = list(request_ids)
        for rid in ids:
            state = self.requests.get(rid)
            if state is not None:
                state.handle.dropped = True
                self.freed[rid] = self.abort_ranks(state)
                self._finish(rid, Event.ABORT, "abort")  # the id is free from now on
        super().queue_drop(ids)

    def drain_ranks(self, rid: str) -> list[int]:
        ranks = self.freed.pop(rid, None)
        if ranks is None:
            return super().drain_ranks(rid)
        if rid in self.requests:
            registry.fired("hist_id_freed_before_abort")  # the ABORT now names the new request
        return ranks


@mutant("hist_abort_by_external_id", "engine-side ids suffixed, ABORTs sent with the "
        "client's id", source=VLLM + "pull/27987", history=True)
class AbortByExternalId(AddRewritten):
    """vLLM PR #27987 ("[Core] Add a random suffix to frontend-provided request IDs"; its
    review on abort_requests' internal vs external ids), PR #45137 ("[Rust Frontend] Add
    external->internal request-id map for abort()") and the downstream symptom in
    NovaSky-AI/SkyRL#1250: engine-side ids carry a random suffix, but the ABORT is sent
    with the external (client) id, which the engine does not hold: nothing is aborted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.external: dict[str, str] = {}  # engine-side id -> the client's id

    def assign_request_id(self, request_id: str | None) -> str:
        if request_id is not None and any(self.external.get(r) == request_id
                                          for r in self.requests):
            raise DuplicateRequestId(f"request id {request_id!r} is already in flight")
        base = super().assign_request_id(request_id)
        internal = f"{base}-{uuid.uuid4().hex[:8]}"
        self.external[internal] = base
        return internal

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        return msgspec.structs.replace(
            request, external_req_id=self.external.get(request.request_id))

    def session_request(self, rid: str, prompt: Sequence[int], sampling: m.SamplingParams,
                        *, resumable: bool) -> m.EngineCoreRequest:
        request = super().session_request(rid, prompt, sampling, resumable=resumable)
        return msgspec.structs.replace(request, external_req_id=self.external.get(rid, rid))

    def abort_frames(self, per_engine: dict[int, list[str]]) -> list[ToEngine]:
        external = {rank: [self.external.get(rid, rid) for rid in ids]
                    for rank, ids in per_engine.items()}
        if external != per_engine:
            registry.fired("hist_abort_by_external_id")
        return super().abort_frames(external)


@mutant("hist_abort_before_tracked_lost", "an explicit abort before the request's first "
        "output is lost", source=VLLM + "pull/47173", history=True)
class AbortBeforeTrackedLost(ReferenceFrontendCore):
    """vLLM PR #47173 (review of the Rust /abort_requests: "Llm::generate() adds the guard
    after self.client.call(...).await ... if /abort_requests arrives while a request is
    still waiting on that await ... [the abort] will leave that request running") and PR
    #57062 ("Abort partially-registered requests when add_request is cancelled"): the index
    an abort resolves ids in is filled later than the request is live at its engine. Here
    a request becomes abortable by id only once its first output arrived (the window
    widened from a send to the first output, so a client call can reach it); an explicit
    abort before that is dropped and the request runs on."""

    def explicit_abort_ranks(self, rid: str) -> list[int]:
        state = self.request(rid)
        if (state is not None and state.phase.live
                and not state.handle.first_output.is_set()):
            registry.fired("hist_abort_before_tracked_lost")
            return []
        return super().explicit_abort_ranks(rid)


@mutant("session_abort_owner_only", "a session's abort goes to its owner only")
class SessionAbortOwnerOnly(ReferenceFrontendCore):
    """A session is aborted at its owner only, like any request (no broadcast)."""

    def abort_ranks(self, state: RequestState) -> list[int]:
        return [state.rank]


@mutant("session_drop_left_to_engine", "a dropped session gets no ABORT at all")
class SessionDropLeftToEngine(ReferenceFrontendCore):
    """A dropped session gets no ABORT: the port leaves it to the engine to retire."""

    def abort_ranks(self, state: RequestState) -> list[int]:
        return [] if state.session is not None else [state.rank]


@mutant("duplicate_request_id_sent", "a live duplicate client id is sent to the engine")
class DuplicateIdNotChecked(ReferenceFrontendCore):
    """A client-chosen id is sent as is, live duplicate or not."""

    def assign_request_id(self, request_id: str | None) -> str:
        return super().assign_request_id(None) if request_id is None else request_id
