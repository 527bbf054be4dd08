"""The dp area's mutants: reference frontends that each break one dp rule.

Each registers itself (harness/mutation/registry.py); the kill matrix and
`--frontend mutant:NAME` find it there. The sections follow the area's case files: each
names the file whose cases catch its mutants. Most break the reference core
(`ReferenceFrontendCore`) or its DP coordinator (`coordinator_class`); a few the I/O layer
(`ReferenceFrontend`). The `hist_*` ones are bug classes from vLLM's history
(docs/mutation-history.md), each beside the rule it breaks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
from msgspec import msgpack

from conformance.streaming.mutants import AddRewritten
from harness.frontends.api import GREEDY, FrontendError, Sampling, StreamHandle
from harness.frontends.reference.coordinator import (
    READY,
    SUBSCRIBE_ALL,
    TRANSITIONS,
    CoordinatorCore,
    CoordinatorError,
    Effect,
    LoadReport,
    Publish,
    Signal,
    Transition,
    WaveState,
)
from harness.frontends.reference.core import (
    PendingUtility,
    ReferenceFrontendCore,
    RequestState,
    ToEngine,
)
from harness.frontends.reference.frontend import ReferenceFrontend
from harness.mutation import registry
from harness.mutation.registry import VLLM, Mutant, mutant, register
from harness.protocol.lifecycle import Event
from harness.protocol.transport.sockets import engine_identity
from harness.protocol.wire import ProtocolError
from harness.protocol.wire import messages as m
from harness.protocol.wire.codec import AddRequest

# ---------------------------------------------------------------- coordinator waves
# Wave control in the frontend-owned DP coordinator (test_coordinator_waves.py; its INIT
# addresses: conformance/handshake/test_init.py).

class _ExcludeNoneCoordinator(CoordinatorCore):
    def start_dp_wave(self, wave: int, sender: int | None) -> Publish:
        return super().start_dp_wave(wave, None)


@mutant("coordinator_start_wave_wakes_everyone", "START_DP_WAVE published with exclude "
        "None instead of the sender's index")
class StartWaveWakesEveryone(ReferenceFrontendCore):
    """START_DP_WAVE is published without the sender's index (exclude None)."""

    coordinator_class = _ExcludeNoneCoordinator


class _ExcludeRankZeroCoordinator(CoordinatorCore):
    def start_dp_wave(self, wave: int, sender: int | None) -> Publish:
        return super().start_dp_wave(wave, 0)


@mutant("coordinator_exclude_rank_zero", "START_DP_WAVE always excludes rank 0")
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


@mutant("coordinator_duplicate_start_wave", "a start_wave for the running wave is "
        "rebroadcast again")
class DuplicateStartWaveRebroadcast(ReferenceFrontendCore):
    """Every start_wave is rebroadcast, even for the wave already running."""

    coordinator_class = _UnguardedStartCoordinator


class _WaveNotAdvancedCoordinator(CoordinatorCore):
    transitions = _replace(Signal.WAVE_COMPLETE,
                           target=lambda s, w: WaveState(w, False))


@mutant("coordinator_wave_not_advanced", "wave_complete(w) leaves the wave at w")
class WaveCompleteNotAdvanced(ReferenceFrontendCore):
    """wave_complete(w) pauses the engines but leaves the wave at w (no +1)."""

    coordinator_class = _WaveNotAdvancedCoordinator


class _UnguardedCompleteCoordinator(CoordinatorCore):
    transitions = _replace(Signal.WAVE_COMPLETE, guard=lambda s, w: True)


@mutant("coordinator_stale_wave_complete_rewinds", "a stale wave_complete(w) moves the "
        "wave back to w + 1")
class StaleWaveCompleteRewinds(ReferenceFrontendCore):
    """Every wave_complete(w) moves the wave to w + 1, a stale one too (the wave rewinds)."""

    coordinator_class = _UnguardedCompleteCoordinator


class _StatsFatalCoordinator(CoordinatorCore):
    def on_stats(self, rank: int, stats: object) -> list[Effect]:
        raise CoordinatorError(f"engine {rank}: coordinator message without wave control")


@mutant("coordinator_stats_only_fatal", "a stats-only coordinator message kills the "
        "coordinator")
class StatsOnlyFatal(ReferenceFrontendCore):
    """Every coordinator message must carry start_wave / wave_complete; stats-only kills it."""

    coordinator_class = _StatsFatalCoordinator


class _FrontendWakesCoordinator(CoordinatorCore):
    def on_frontend_request(self, rank: int) -> list[Effect]:
        if self.state.engines_running:
            return []
        return [self.start_dp_wave(self.state.current_wave, rank)]


@mutant("coordinator_frontend_starts_wave", "a request sent while paused makes the "
        "coordinator publish START_DP_WAVE")
class FrontendStartsWave(ReferenceFrontendCore):
    """A request sent while paused makes the coordinator publish START_DP_WAVE itself
    (vLLM's earlier FIRST_REQ behaviour, which 0.33.0 dropped: coordinator.py:43-46)."""

    coordinator_class = _FrontendWakesCoordinator


@mutant("coordinator_init_without_addresses", "INIT leaves out the coordinator's "
        "addresses")
class InitWithoutCoordinator(ReferenceFrontendCore):
    """INIT carries only the input/output addresses; the coordinator's are left out."""

    def init_message(self, rank: int, inputs: Sequence[str], outputs: Sequence[str]) -> bytes:
        saved, self.coordinator_addresses = self.coordinator_addresses, None
        try:
            return super().init_message(rank, inputs, outputs)
        finally:
            self.coordinator_addresses = saved


def _start_wave_rewinds() -> tuple[Transition, ...]:
    """The reference's transitions with START_WAVE applied whenever the engines are paused,
    whatever its wave (a stale one too)."""
    out = []
    for t in TRANSITIONS:
        if t.signal is Signal.START_WAVE:
            t = Transition(t.signal,
                           lambda s, w: w > s.current_wave or not s.engines_running,
                           lambda s, w: WaveState(w, True), True,
                           "start_wave(w) applied whenever paused (a stale w rewinds)")
        out.append(t)
    return tuple(out)


class _RewindingCoordinator(CoordinatorCore):
    transitions = _start_wave_rewinds()

    def apply(self, signal: Signal, wave: int, sender: int) -> list[Effect]:
        if (signal is Signal.START_WAVE and wave < self.state.current_wave
                and not self.state.engines_running):
            registry.fired("hist_stale_start_wave_rewinds")
        return super().apply(signal, wave, sender)


@mutant("hist_stale_start_wave_rewinds", "a stale start_wave while paused rewinds the "
        "coordinator's wave", source=VLLM + "pull/46833", history=True)
class StaleStartWaveRewinds(ReferenceFrontendCore):
    """vLLM PR #46833 ("[Rust Frontend] Start current wave for a stale DP FirstRequest"):
    the in-process DP coordinator applied a stale start request for wave W unconditionally
    after WaveComplete(W) had moved current_wave to W + 1, "rewinding current_wave back to
    W and broadcasting a superseded wave". Here the frontend-owned coordinator takes an
    engine's stale start_wave(W) while paused: current_wave rewinds to W, START_DP_WAVE(W)
    is published and later ADDs carry W."""

    coordinator_class = _RewindingCoordinator

# ---------------------------------------------------------------- coordinator sockets
# What the coordinator takes from the engines: load, miswired traffic, subscriptions
# (test_coordinator.py).

class _LoadIgnoringCoordinator(CoordinatorCore):
    def on_stats(self, rank: int, stats: object) -> list[Effect]:
        return []  # stats-only messages accepted, their counts never reach routing


@mutant("coordinator_load_ignored", "stats-only messages on the coordinator path carry "
        "no load to routing")
class CoordinatorLoadIgnored(ReferenceFrontendCore):
    """The coordinator accepts stats-only messages but keeps no load from them (what
    vllm-rs's in-process coordinator does; Python routes by those counts)."""

    coordinator_class = _LoadIgnoringCoordinator


class _RunningOnlyCoordinator(CoordinatorCore):
    def on_stats(self, rank: int, stats: object) -> list[Effect]:
        return [LoadReport(r.rank, 0, r.running) for r in super().on_stats(rank, stats)
                if isinstance(r, LoadReport)]


@mutant("coordinator_waiting_ignored", "only running requests count as load on the "
        "coordinator path")
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


@mutant("coordinator_miswiring_tolerated", "request outputs / utility replies / finished "
        "ids on the coordinator path are dropped")
class CoordinatorMiswiringTolerated(ReferenceFrontendCore):
    """Request outputs, utility replies and finished ids on the coordinator path are
    dropped instead of failing the client closed."""

    coordinator_class = _TolerantCoordinator


class _LenientCoordinator(CoordinatorCore):
    """Skips an engine message it cannot use, as the stats reader skips an undecodable
    publication."""

    def on_engine_output(self, frames: Sequence[bytes]) -> list[Effect]:
        try:
            return super().on_engine_output(frames)
        except CoordinatorError:
            return []


@mutant("coordinator_path_misuse_ignored", "request outputs or utility replies on the "
        "coordinator path are dropped; the client serves on")
class CoordinatorPathMisuseIgnored(ReferenceFrontendCore):
    """The frontend's DP coordinator drops request outputs / utility replies that a
    miswired engine sends on the coordinator path, and the client serves on."""

    coordinator_class = _LenientCoordinator


class _CauseDroppingCoordinator(CoordinatorCore):
    def on_engine_output(self, frames: Sequence[bytes]) -> list[Effect]:
        try:
            return super().on_engine_output(frames)
        except CoordinatorError:
            raise CoordinatorError("coordinator failure") from None


@mutant("coordinator_error_without_cause", "a coordinator-path failure names neither "
        "the engine nor what it sent")
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


@mutant("coordinator_ready_one_early", "READY published one subscription early")
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


@mutant("coordinator_late_subscription_ignored", "a re-subscribing engine gets no READY")
class CoordinatorLateSubscriptionIgnored(ReferenceFrontendCore):
    """READY is published once at startup; an engine that subscribes again gets none."""

    coordinator_class = _OnceOnlyGateCoordinator

# ---------------------------------------------------------------- pinned routing
# Requests pinned with data_parallel_rank (test_routing_pinned.py).

@mutant("rank_indexes_engine_list", "data_parallel_rank used as a list index (-1 = last)")
class RankIndexesEngineList(ReferenceFrontendCore):
    """`engines[rank]` on the sorted list: -1 silently means the last engine."""

    def route(self, data_parallel_rank: int | None) -> int:
        if data_parallel_rank is None:
            return super().route(None)
        ranks = sorted(self.engines)
        try:
            return ranks[data_parallel_rank]
        except IndexError:
            raise FrontendError(f"data_parallel_rank {data_parallel_rank} out of range"
                                ) from None


@mutant("rank_wraps_modulo", "data_parallel_rank wrapped modulo the engine count")
class RankWrapsModulo(ReferenceFrontendCore):
    """Any rank is wrapped modulo the engine count instead of being refused."""

    def route(self, data_parallel_rank: int | None) -> int:
        if data_parallel_rank is None:
            return super().route(None)
        ranks = sorted(self.engines)
        return ranks[data_parallel_rank % len(ranks)]


@mutant("rank_unchecked", "out-of-range data_parallel_rank sent to a missing identity")
class RankUnchecked(ReferenceFrontendCore):
    """No range check: the ADD is addressed to the identity of a rank that does not exist,
    so the ROUTER drops it and the caller waits forever."""

    def add_request(self, prompt: Sequence[int], max_tokens: int,
                    **options: Any) -> tuple[StreamHandle, ToEngine]:
        data_parallel_rank: int | None = options.get("data_parallel_rank")
        if data_parallel_rank is None or data_parallel_rank in self.engines:
            return super().add_request(prompt, max_tokens, **options)
        options["data_parallel_rank"] = None
        handle, (_identity, frames) = super().add_request(prompt, max_tokens, **options)
        return handle, (engine_identity(data_parallel_rank & 0xFFFF), frames)


@mutant("rank_off_by_one", "the last engine's rank refused (off-by-one range check)")
class RankOffByOne(ReferenceFrontendCore):
    """Range check written as `rank < count - 1`: the last engine can never be pinned."""

    def route(self, data_parallel_rank: int | None) -> int:
        if data_parallel_rank is not None and data_parallel_rank >= max(self.engines):
            raise FrontendError(f"data_parallel_rank {data_parallel_rank} out of range")
        return super().route(data_parallel_rank)


@mutant("identities_from_zero", "engine identities 0..n-1, start index ignored")
class IdentitiesFromZero(ReferenceFrontendCore):
    """Engine identities built as 0..count-1, ignoring the engine start index."""

    def __init__(self, ranks: Sequence[int], **kwargs: Any) -> None:
        super().__init__(list(range(len(ranks))), **kwargs)


@mutant("explicit_rank_ignored", "data_parallel_rank not honoured")
class ExplicitRankIgnored(ReferenceFrontendCore):
    def route(self, data_parallel_rank: int | None) -> int:
        return super().route(None)


@mutant("engine_one_unreachable", "every request sent to the first engine's identity")
class EngineOneUnreachable(ReferenceFrontendCore):
    """Maps every engine's requests to the first engine's identity."""

    def add_request(self, prompt: Sequence[int], max_tokens: int, *,
                    data_parallel_rank: int | None = None,
                    stop: Sequence[str] | None = None, request_id: str | None = None,
                    params: Mapping[str, Any] | None = None,
                    sampling: Sampling = GREEDY) -> tuple[StreamHandle, ToEngine]:
        handle, (_identity, frames) = super().add_request(
            prompt, max_tokens, data_parallel_rank=data_parallel_rank, stop=stop,
            request_id=request_id, params=params, sampling=sampling)
        return handle, (self.engines[min(self.engines)].identity, frames)


@mutant("rank_refusal_unexplained", "an out-of-range data_parallel_rank is refused "
        "without naming it")
class RankRefusalUnexplained(ReferenceFrontendCore):
    """An out-of-range data_parallel_rank is refused without saying which rank."""

    def route(self, data_parallel_rank: int | None) -> int:
        try:
            return super().route(data_parallel_rank)
        except FrontendError:
            raise FrontendError("invalid data_parallel_rank") from None


@mutant("pinned_rank_not_stamped", "a pinned ADD does not carry its data_parallel_rank")
class PinnedRankNotStamped(AddRewritten):
    """An explicit data_parallel_rank routes the request but is stripped from the ADD."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        return msgspec.structs.replace(request, data_parallel_rank=None)


@mutant("hist_rank_checked_against_count", "a pinned rank is checked against the engine "
        "count and addressed as a global index", source=VLLM + "pull/51178", history=True)
class RankCheckedAgainstCount(ReferenceFrontendCore):
    """vLLM PR #51178 ("[Rust Frontend][gRPC] Add explicit data-parallel rank routing";
    InvalidDataParallelRank "rank {rank} is out of range for {num_engines} engine(s)" became
    "not connected to this frontend; connected ranks", reviewed as "something missed when
    adding hybrid/external DPLB"): a pinned rank is checked against the engine count and
    sent to EngineId::from_engine_index(rank). With engines [2, 3] (start index 2) a pin to
    rank 2 is refused and a pin to rank 0 goes to an identity no engine has."""

    def register_request(self, prompt: Sequence[int], max_tokens: int, *,
                         data_parallel_rank: int | None = None,
                         stop: Sequence[str] | None = None, request_id: str | None = None,
                         params: Mapping[str, Any] | None = None, resumable: bool = False,
                         sampling: Sampling = GREEDY) -> tuple[StreamHandle, ToEngine]:
        rank = data_parallel_rank
        options: dict[str, Any] = {"stop": stop, "request_id": request_id,
                                   "params": params, "resumable": resumable,
                                   "sampling": sampling}
        if rank is None or (rank in self.engines and rank < len(self.engines)):
            return super().register_request(prompt, max_tokens,
                                             data_parallel_rank=rank, **options)
        if not 0 <= rank < len(self.engines):
            if rank in self.engines:
                registry.fired("hist_rank_checked_against_count")  # a connected engine refused
            raise FrontendError(f"data parallel rank {rank} is out of range for "
                                f"{len(self.engines)} engine(s)")
        registry.fired("hist_rank_checked_against_count")  # in range, but not an engine of ours
        self._check_alive()
        handle, (_identity, frames) = super().register_request(
            prompt, max_tokens, data_parallel_rank=None, **options)
        decoded = self.codec.decode_engine_input(frames)
        assert isinstance(decoded, AddRequest)
        request = msgspec.structs.replace(decoded.request, data_parallel_rank=rank)
        return handle, (engine_identity(rank), self.codec.encode_add(request))

# ---------------------------------------------------------------- in-flight routing
# Unpinned requests by the frontend's own in-flight count (test_routing_inflight.py).

@mutant("round_robin_routing", "unpinned requests rotate, ignoring in-flight load")
class RoundRobinRouting(ReferenceFrontendCore):
    """Unpinned requests rotate over the engines, ignoring what is in flight."""

    def route(self, data_parallel_rank: int | None) -> int:
        if data_parallel_rank is not None:
            return super().route(data_parallel_rank)
        return next(self._rotation)


@mutant("all_to_first_engine", "no load balancing: everything to engine 0")
class AllToFirstEngine(ReferenceFrontendCore):
    def route(self, data_parallel_rank: int | None) -> int:
        return min(self.engines) if data_parallel_rank is None else data_parallel_rank


@mutant("snapshot_resets_inflight", "a coordinator publication resets the in-flight "
        "counts, ties to the lowest rank")
class SnapshotResetsInflight(ReferenceFrontendCore):
    """Routing scores each engine by the coordinator's last counts plus the requests sent
    since (every publication resets them) and breaks ties by lowest rank: a stale all-idle
    snapshot mid-burst piles the rest of the burst onto the first engines."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.since_snapshot: dict[int, int] = {}

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        super().on_dp_stats(update)
        self.since_snapshot = {}

    def route(self, data_parallel_rank: int | None) -> int:
        if data_parallel_rank is not None:
            return super().route(data_parallel_rank)
        rank = min(self.engines, key=lambda r: (
            self.engines[r].reported + self.since_snapshot.get(r, 0), r))
        self.since_snapshot[rank] = self.since_snapshot.get(rank, 0) + 1
        return rank


@mutant("pinned_not_counted", "pinned requests not counted as in flight")
class PinnedNotCounted(ReferenceFrontendCore):
    """Requests pinned with data_parallel_rank bypass the in-flight bookkeeping."""

    def add_request(self, prompt: Sequence[int], max_tokens: int,
                    **options: Any) -> tuple[StreamHandle, ToEngine]:
        handle, send = super().add_request(prompt, max_tokens, **options)
        data_parallel_rank: int | None = options.get("data_parallel_rank")
        if data_parallel_rank is not None:
            self.engines[data_parallel_rank].inflight -= 1
            self.__dict__.setdefault("pinned", set()).add(handle.request_id)
        return handle, send

    def _finish(self, rid: str, event: Event, reason: str | None,
                error: str | None = None) -> None:
        state = self.requests.get(rid)
        super()._finish(rid, event, reason, error)
        if state is not None and rid in self.__dict__.get("pinned", set()):
            self.engines[state.rank].inflight += 1  # it was never counted


@mutant("inflight_never_released", "in-flight count not released when a request ends")
class InflightNeverReleased(ReferenceFrontendCore):
    """The in-flight count is bumped on ADD but never released when a request ends."""

    def _finish(self, rid: str, event: Event, reason: str | None,
                error: str | None = None) -> None:
        state = self.requests.get(rid)
        super()._finish(rid, event, reason, error)
        if state is not None:
            self.engines[state.rank].inflight += 1


@mutant("inflight_reset_when_one_ends", "an engine's in-flight count reset when one of "
        "its requests ends")
class InflightResetWhenOneEnds(ReferenceFrontendCore):
    """The engine's in-flight count is reset to zero whenever one of its requests ends
    (a busy flag, not a count): its other running requests stop counting for routing."""

    def _finish(self, rid: str, event: Event, reason: str | None,
                error: str | None = None) -> None:
        state = self.requests.get(rid)
        super()._finish(rid, event, reason, error)
        if state is not None:
            self.engines[state.rank].inflight = 0


@mutant("abort_keeps_routing_slot", "explicitly aborted requests keep counting for "
        "routing")
class AbortKeepsRoutingSlot(ReferenceFrontendCore):
    """An explicit abort ends the streams but never releases their routing slots."""

    def abort(self, request_ids: Iterable[str]) -> list[ToEngine]:
        ids = list(request_ids)
        ranks = [self.requests[rid].rank for rid in dict.fromkeys(ids)
                 if rid in self.requests]
        sends = super().abort(ids)
        for rank in ranks:
            self.engines[rank].inflight += 1
        return sends


@mutant("stop_end_keeps_routing_slot", "requests ended at a stop string keep counting "
        "for routing")
class StopEndKeepsRoutingSlot(ReferenceFrontendCore):
    """A stream the frontend ends at a stop string keeps its routing slot: only outputs
    the engine finishes release one."""

    def end_at_stop(self, state: RequestState, engine_finished: bool) -> None:
        super().end_at_stop(state, engine_finished)
        self.engines[state.rank].inflight += 1


@mutant("engine_abort_keeps_routing_slot", "requests the engine ends with ABORT or "
        "REPETITION keep their routing slots")
class EngineAbortKeepsRoutingSlot(ReferenceFrontendCore):
    """A request the engine finishes with ABORT (or REPETITION) keeps its routing slot: only
    the finish kinds the port thought of (stop, length, error) release one."""

    def end_by_engine(self, state: RequestState, output: m.EngineCoreOutput) -> None:
        super().end_by_engine(state, output)
        if output.finish_reason in (m.FinishReason.ABORT, m.FinishReason.REPETITION):
            self.engines[state.rank].inflight += 1


@mutant("hist_lb_fixed_tie_break", "load ties always go to the lowest rank (no "
        "rotating scan start)", source=VLLM + "pull/47420", history=True)
class FixedTieBreak(ReferenceFrontendCore):
    """vLLM PR #47420 ("[Core][DP] Rotate load-balancer tie-break to avoid systematic engine
    bias"): the least-loaded scan started at a fixed index with a strict `<`, so every tie
    (equal load, e.g. an idle group between requests) went to the same engine."""

    def route(self, data_parallel_rank: int | None) -> int:
        if data_parallel_rank is not None:
            return super().route(data_parallel_rank)
        would = super().route(None)  # the reference's choice (it also turns the rotation)
        chosen = min(self.engines, key=lambda r: (self.load_score(r), r))
        if chosen != would:
            registry.fired("hist_lb_fixed_tie_break")
        return chosen


@mutant("hist_lb_first_engine_until_stats", "unpinned requests all go to the first "
        "engine until the first load report arrives", source=VLLM + "pull/22910", history=True)
class FirstEngineUntilStats(ReferenceFrontendCore):
    """vLLM PR #22910 ("[BugFix] Fix initial DP request load imbalance"): DPLBAsyncMPClient
    sent every unpinned request to the first rank until the first stats update arrived
    from the DP coordinator, so a burst right after startup piled onto engine 0."""

    stats_seen = False

    def on_load_report(self, rank: int, waiting: int, running: int) -> None:
        self.stats_seen = True
        super().on_load_report(rank, waiting, running)

    def route(self, data_parallel_rank: int | None) -> int:
        if data_parallel_rank is not None or self.stats_seen:
            return super().route(data_parallel_rank)
        would = super().route(None)
        first = min(self.engines)
        if would != first:
            registry.fired("hist_lb_first_engine_until_stats")
        return first

# ---------------------------------------------------------------- reported load
# Routing by the load the engines report (test_routing_reported.py).

@mutant("reported_load_ignored", "engines' reported load ignored by routing")
class ReportedLoadIgnored(ReferenceFrontendCore):
    """Routing looks at this client's own in-flight count only."""

    def load_score(self, rank: int) -> int:
        return self.engines[rank].inflight


@mutant("load_report_waiting_ignored", "waiting requests in load reports ignored")
class LoadReportWaitingIgnored(ReferenceFrontendCore):
    """An engine's load is its running requests only: queued (waiting) ones are ignored."""

    def on_load_report(self, rank: int, waiting: int, running: int) -> None:
        super().on_load_report(rank, 0, running)


@mutant("scheduler_stats_not_routed", "scheduler_stats never count for routing")
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


@mutant("load_reports_only_rise", "load reports never lower an engine's load")
class LoadReportsOnlyRise(ReferenceFrontendCore):
    """A load report raises an engine's reported load but never lowers it (merged with
    max() instead of replaced): an engine that went idle still looks busy."""

    def on_load_report(self, rank: int, waiting: int, running: int) -> None:
        before = self.engines[rank].reported if rank in self.engines else 0
        super().on_load_report(rank, waiting, running)
        if rank in self.engines:
            self.engines[rank].reported = max(before, self.engines[rank].reported)


@mutant("coordinator_counts_ignored", "the coordinator's load counts are ignored "
        "(scheduler_stats only)")
class CoordinatorCountsIgnored(ReferenceFrontendCore):
    """The coordinator's publications update the wave only; load comes from
    scheduler_stats alone."""

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        self.current_wave = update.current_wave


@mutant("first_publication_kept", "load counts from the first coordinator publication "
        "only")
class FirstPublicationKept(ReferenceFrontendCore):
    """Load counts are taken from the first publication only (cached, never refreshed)."""

    _counts_seen = False

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        if self._counts_seen and update.counts:
            self.current_wave = update.current_wave
            return
        self._counts_seen = self._counts_seen or bool(update.counts)
        super().on_dp_stats(update)

# ---------------------------------------------------------------- waves
# The wave on ADDs, and DP control on the main output path (test_waves.py).

@mutant("wave_never_stamped", "ADDs always carry current_wave 0")
class WaveNeverStamped(ReferenceFrontendCore):
    """Coordinator publications are read for load only; ADDs always carry wave 0."""

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        pass


@mutant("wave_first_only", "the first published wave is cached forever")
class WaveFirstOnly(ReferenceFrontendCore):
    """The first published wave is cached and never updated."""

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        if not self.__dict__.get("wave_seen"):
            self.__dict__["wave_seen"] = True
            super().on_dp_stats(update)


@mutant("wave_only_while_running", "the wave moves only while engines run")
class WaveFromWaveCompleteOnly(ReferenceFrontendCore):
    """Only a coordinator publication with engines running moves the wave."""

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        if update.engines_running:
            super().on_dp_stats(update)


@mutant("nil_counts_skipped", "a wave-only coordinator publication (counts nil) skipped")
class NilCountsSkipped(ReferenceFrontendCore):
    """A coordinator publication without counts (the wave-only update a 0.33.0 coordinator
    sends on every wave change) is skipped as malformed: its wave never reaches an ADD
    (a port whose stats struct has a non-optional counts list)."""

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        if update.counts is None:
            return
        super().on_dp_stats(update)


@mutant("legacy_wakeup_sent", "a FIRST_REQ wake-up sent to the DP coordinator with "
        "each request")
class LegacyWakeupFrontend(ReferenceFrontend):
    """What clients before the engines woke each other did: every request also goes to the
    DP coordinator as `("FIRST_REQ", rank)` (a 0.33.0 coordinator logs it as unexpected)."""

    async def generate(self, prompt: Sequence[int], max_tokens: int, **options: Any
                       ) -> StreamHandle:
        handle = await super().generate(prompt, max_tokens, **options)
        state = self.core.requests.get(handle.request_id or "")
        if self._stats is not None and state is not None:
            await self._stats.send(msgpack.encode(("FIRST_REQ", state.rank)))
        return handle


@mutant("dp_control_ignored", "DP control on the main output path ignored")
class DpControlIgnored(ReferenceFrontendCore):
    """wave_complete / start_wave on the main output path are silently dropped."""

    def on_dp_control(self, message: m.EngineCoreOutputs) -> None:
        pass


@mutant("dp_control_unexplained", "DP control on the main output path fails the client "
        "with no cause")
class DpControlUnexplained(ReferenceFrontendCore):
    """DP control on the main output path fails the client closed without saying why."""

    def on_dp_control(self, message: m.EngineCoreOutputs) -> None:
        self.mark_dead("engine failure")

# ---------------------------------------------------------------- the client
# One client over every engine: each engine's outputs, death with a reason
# (test_client.py).

@mutant("first_engine_outputs_only", "outputs of engines other than the first ignored")
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


@mutant("death_error_text_dropped", "engine death ends streams with no error text")
class DeathErrorTextDropped(ReferenceFrontendCore):
    """Engine death ends the open streams with a bare "error" finish: the why is lost."""

    def mark_dead(self, reason: str) -> None:
        if self.dead is None:
            for rid in list(self.requests):
                self._finish(rid, Event.ENGINE_DEAD, "error")
        super().mark_dead(reason)


@mutant("death_cause_not_recorded", "every failure recorded as a generic engine death "
        "(an undecodable frame or a lost connection is not named)")
class DeathCauseNotRecorded(ReferenceFrontendCore):
    """Every failure is recorded as the same generic death: an undecodable frame or a lost
    connection reads like ENGINE_CORE_DEAD (the reason string is dropped)."""

    def mark_dead(self, reason: str) -> None:
        super().mark_dead("engine core died")

# ---------------------------------------------------------------- utilities
# Utility calls aggregated over the engines (test_utilities.py).

@mutant("sleeping_first_engine", "is_sleeping taken from the first engine only")
class SleepingFirstEngine(ReferenceFrontendCore):
    def aggregate_is_sleeping(self, values: list[Any]) -> bool:
        return bool(values[0])


@mutant("reset_always_false", "reset_prefix_cache always false")
class ResetAlwaysFalse(ReferenceFrontendCore):
    def aggregate_reset_prefix_cache(self, values: list[Any]) -> bool:
        return False


register(Mutant("utility_unbounded",
                "no bound on a missing utility reply",
                ReferenceFrontendCore,
                {"utility_timeout": math.inf}))
