"""Abort mutants: realistic port bugs in abort routing, batching and bookkeeping.

Each overrides one rule of the reference core (registered in mutants.py's abort section)
so that the abort cases of conformance/test_abort*.py prove they can fail.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from harness.frontends.driver import StreamHandle
from harness.frontends.reference.core import ReferenceFrontendCore, Send
from harness.wire import messages as m

SMALL_BATCH = 8


class AbortStopTokenFinished(ReferenceFrontendCore):
    """Treats an engine-side STOP (EOS / stop token) like a frontend stop string: owes an
    ABORT for a request the engine already finished."""

    def on_request_output(self, output: m.EngineCoreOutput) -> None:
        state = self.requests.get(output.request_id)
        super().on_request_output(output)
        if state is not None and output.finish_reason is m.FinishReason.STOP:
            self.stop_aborts[output.request_id] = state.rank
            self.pending_drops.append(output.request_id)


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

    def drain_drops(self) -> list[Send]:
        rerouted: dict[str, int] = {}
        for rid in self.pending_drops:
            state = self.requests.get(rid)
            if state is not None:
                rerouted[rid] = self.route(None)
        sends = super().drain_drops()
        per_engine: dict[int, list[str]] = {}
        for rid, rank in rerouted.items():
            per_engine.setdefault(rank, []).append(rid)
        return super().abort_frames(per_engine) if rerouted else sends


class ExplicitAbortUsesHistory(ReferenceFrontendCore):
    """Explicit abort looks ids up in a history of every request ever sent, so finished,
    dropped and already-aborted ids are aborted (again)."""

    def add_request(self, prompt: Sequence[int], max_tokens: int, *,
                    data_parallel_rank: int | None = None,
                    stop: Sequence[str] | None = None, request_id: str | None = None,
                    params: Mapping[str, Any] | None = None) -> tuple[StreamHandle, Send]:
        handle, send = super().add_request(prompt, max_tokens,
                                           data_parallel_rank=data_parallel_rank, stop=stop,
                                           request_id=request_id, params=params)
        rid = handle.request_id
        if rid is not None:
            self.__dict__.setdefault("history", {})[rid] = self.requests[rid].rank
        return handle, send

    def abort(self, request_ids: Iterable[str]) -> list[Send]:
        self._check_alive()
        history: dict[str, int] = self.__dict__.get("history", {})
        per_engine: dict[int, list[str]] = {}
        for rid in dict.fromkeys(request_ids):
            if rid in history:
                per_engine.setdefault(history[rid], []).append(rid)
                if rid in self.requests:
                    self._finish(rid, "abort")
        return self.abort_frames(per_engine)
