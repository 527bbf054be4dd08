"""Mutant cores for the DP, ready-sync and handshake cases: each breaks one rule the way a
port author plausibly would (an unchecked list index, a counter never released, a value
cached once). Registered in `mutants.py`'s dp section.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from msgspec import msgpack

from harness.frontends.api import GREEDY, FrontendError, Sampling, StartupError, StreamHandle
from harness.frontends.reference.core import EngineState, ReferenceFrontendCore, Send
from harness.frontends.reference.frontend import ReferenceFrontend
from harness.protocol.lifecycle import Event
from harness.protocol.transport.sockets import engine_identity
from harness.protocol.wire import messages as m


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


class RankWrapsModulo(ReferenceFrontendCore):
    """Any rank is wrapped modulo the engine count instead of being refused."""

    def route(self, data_parallel_rank: int | None) -> int:
        if data_parallel_rank is None:
            return super().route(None)
        ranks = sorted(self.engines)
        return ranks[data_parallel_rank % len(ranks)]


class RankUnchecked(ReferenceFrontendCore):
    """No range check: the ADD is addressed to the identity of a rank that does not exist,
    so the ROUTER drops it and the caller waits forever."""

    def add_request(self, prompt: Sequence[int], max_tokens: int,
                    **options: Any) -> tuple[StreamHandle, Send]:
        data_parallel_rank: int | None = options.get("data_parallel_rank")
        if data_parallel_rank is None or data_parallel_rank in self.engines:
            return super().add_request(prompt, max_tokens, **options)
        options["data_parallel_rank"] = None
        handle, (_identity, frames) = super().add_request(prompt, max_tokens, **options)
        return handle, (engine_identity(data_parallel_rank & 0xFFFF), frames)


class RoundRobinRouting(ReferenceFrontendCore):
    """Unpinned requests rotate over the engines, ignoring what is in flight."""

    def route(self, data_parallel_rank: int | None) -> int:
        if data_parallel_rank is not None:
            return super().route(data_parallel_rank)
        return next(self._rotation)


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


class PinnedNotCounted(ReferenceFrontendCore):
    """Requests pinned with data_parallel_rank bypass the in-flight bookkeeping."""

    def add_request(self, prompt: Sequence[int], max_tokens: int,
                    **options: Any) -> tuple[StreamHandle, Send]:
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


class InflightNeverReleased(ReferenceFrontendCore):
    """The in-flight count is bumped on ADD but never released when a request ends."""

    def _finish(self, rid: str, event: Event, reason: str | None,
                error: str | None = None) -> None:
        state = self.requests.get(rid)
        super()._finish(rid, event, reason, error)
        if state is not None:
            self.engines[state.rank].inflight += 1


class WaveNeverStamped(ReferenceFrontendCore):
    """Coordinator publications are read for load only; ADDs always carry wave 0."""

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        pass


class WaveFirstOnly(ReferenceFrontendCore):
    """The first published wave is cached and never updated."""

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        if not self.__dict__.get("wave_seen"):
            self.__dict__["wave_seen"] = True
            super().on_dp_stats(update)


class WaveFromWaveCompleteOnly(ReferenceFrontendCore):
    """Only a coordinator publication with engines running moves the wave."""

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        if update.engines_running:
            super().on_dp_stats(update)


class DpControlIgnored(ReferenceFrontendCore):
    """wave_complete / start_wave on the main output path are silently dropped."""

    def on_dp_control(self, message: m.EngineCoreOutputs) -> None:
        pass


class ReadyMaxModelLenLastWins(ReferenceFrontendCore):
    """max_model_len is taken from the last ready response received."""

    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        super().apply_ready(rank, ready)
        self.config.max_model_len = ready.max_model_len


class ReadyMaxModelLenFirstWins(ReferenceFrontendCore):
    """max_model_len is taken from the first ready response received."""

    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        first = self.config.max_model_len
        super().apply_ready(rank, ready)
        if first is not None:
            self.config.max_model_len = first


class ReadyGpuBlocksEngineZero(ReferenceFrontendCore):
    """num_gpu_blocks is engine 0's value times the engine count (assumes uniform ranks)."""

    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        super().apply_ready(rank, ready)
        first = self.engines[min(self.engines)].ready
        if first is not None:
            self.config.num_gpu_blocks = first.num_gpu_blocks * len(self.engines)


class IdentityByArrival(ReferenceFrontendCore):
    """Engines are matched by arrival, not by identity: an unknown identity is taken as the
    last engine still missing (and keeps that alias)."""

    def _alias(self, identity: bytes, missing: Callable[[EngineState], bool]) -> bytes:
        aliases: dict[bytes, bytes] = self.__dict__.setdefault("aliases", {})
        ident = bytes(identity)
        if ident in self._by_identity:
            return ident
        if ident not in aliases:
            pending = [e for _r, e in sorted(self.engines.items()) if missing(e)]
            if not pending:
                return ident
            aliases[ident] = pending[-1].identity
        return aliases[ident]

    def on_ready(self, identity: bytes, payload: bytes) -> None:
        super().on_ready(self._alias(identity, lambda e: not e.registered), payload)


class RankOffByOne(ReferenceFrontendCore):
    """Range check written as `rank < count - 1`: the last engine can never be pinned."""

    def route(self, data_parallel_rank: int | None) -> int:
        if data_parallel_rank is not None and data_parallel_rank >= max(self.engines):
            raise FrontendError(f"data_parallel_rank {data_parallel_rank} out of range")
        return super().route(data_parallel_rank)


class InitWithoutOutputs(ReferenceFrontendCore):
    """INIT advertises the input address only: engines cannot push any output."""

    def init_message(self, rank: int, inputs: Sequence[str], outputs: Sequence[str]) -> bytes:
        return super().init_message(rank, inputs, [])


class ServesBeforeHandshakeReady(ReferenceFrontendCore):
    """The handshake counts as done once every engine said HELLO; READY is not awaited."""

    @property
    def handshake_complete(self) -> bool:
        return self.hello_seen == set(self.engines)


class HelloIdentityUnchecked(IdentityByArrival):
    """Identities are opaque at HELLO too: engines are matched by arrival throughout."""

    def _handshake_engine(self, identity: bytes, stage: str) -> EngineState:
        alias = self._alias(identity, lambda e: e.rank not in self.hello_seen)
        return super()._handshake_engine(alias, stage)


class ReadySyncOnlyWithDp(ReferenceFrontendCore):
    """Ready responses are aggregated only for DP > 1; a single engine's is never applied."""

    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        if len(self.engines) > 1:
            super().apply_ready(rank, ready)


class IdentitiesFromZero(ReferenceFrontendCore):
    """Engine identities built as 0..count-1, ignoring the engine start index."""

    def __init__(self, ranks: Sequence[int], **kwargs: Any) -> None:
        super().__init__(list(range(len(ranks))), **kwargs)


class ReportedLoadIgnored(ReferenceFrontendCore):
    """Routing looks at this client's own in-flight count only."""

    def load_score(self, rank: int) -> int:
        return self.engines[rank].inflight


class ClientIndexOnAddOnly(ReferenceFrontendCore):
    """ADDs carry client_index 1 (a copy-pasted API-server index), utilities 0."""

    def add_request(self, prompt: Sequence[int], max_tokens: int,
                    **options: Any) -> tuple[StreamHandle, Send]:
        self.client_index = 1
        try:
            return super().add_request(prompt, max_tokens, **options)
        finally:
            self.client_index = 0


class ServesWithHelloQuorum(ReferenceFrontendCore):
    """Handshake mode counts the engines that said HELLO, not the engines configured."""

    @property
    def handshake_complete(self) -> bool:
        return bool(self.hello_seen) and self.handshake_ready_seen == self.hello_seen

    @property
    def registered(self) -> bool:
        if not self.hello_seen:
            return super().registered
        return all(self.engines[r].registered for r in self.hello_seen)


# ----------------- ready sync, routing and startup (the first mutants)


class BlockSizeIgnored(ReferenceFrontendCore):
    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        super().apply_ready(rank, ready)
        self.config.block_size = 16  # the frontend's own default, not the engine's


class BlockSizeLastWins(ReferenceFrontendCore):
    def check_block_sizes(self) -> None:
        pass


class MaxModelLenMax(ReferenceFrontendCore):
    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        previous = self.config.max_model_len
        super().apply_ready(rank, ready)
        self.config.max_model_len = max(previous or 0, ready.max_model_len)


class GpuBlocksLastWins(ReferenceFrontendCore):
    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        super().apply_ready(rank, ready)
        self.config.num_gpu_blocks = ready.num_gpu_blocks


class ExplicitRankIgnored(ReferenceFrontendCore):
    def route(self, data_parallel_rank: int | None) -> int:
        return super().route(None)


class AllToFirstEngine(ReferenceFrontendCore):
    def route(self, data_parallel_rank: int | None) -> int:
        return min(self.engines) if data_parallel_rank is None else data_parallel_rank


class EngineOneUnreachable(ReferenceFrontendCore):
    """Maps every engine's requests to the first engine's identity."""

    def add_request(self, prompt: Sequence[int], max_tokens: int, *,
                    data_parallel_rank: int | None = None,
                    stop: Sequence[str] | None = None, request_id: str | None = None,
                    params: Mapping[str, Any] | None = None,
                    sampling: Sampling = GREEDY) -> tuple[StreamHandle, Send]:
        handle, (_identity, frames) = super().add_request(
            prompt, max_tokens, data_parallel_rank=data_parallel_rank, stop=stop,
            request_id=request_id, params=params, sampling=sampling)
        return handle, (self.engines[min(self.engines)].identity, frames)


class ServesWithMissingEngines(ReferenceFrontendCore):
    @property
    def registered(self) -> bool:
        return any(e.registered for e in self.engines.values())


class ReadyForbidsUnknownKeys(ReferenceFrontendCore):
    def on_ready(self, identity: bytes, payload: bytes) -> None:
        import msgspec

        known = set(m.EngineCoreReadyResponse.__struct_fields__)
        try:
            keys = set(msgspec.msgpack.decode(payload)) if payload else set()
        except Exception:
            keys = set()
        if keys - known:
            raise StartupError(f"unknown ready keys {sorted(keys - known)}")
        super().on_ready(identity, payload)


class StartupErrorUnnamed(ReferenceFrontendCore):
    def registration_timeout(self, timeout: float) -> StartupError:
        return StartupError("timed out waiting for engines to start")


class StartupAcceptsAnything(ReferenceFrontendCore):
    """A ready frame it cannot use is accepted anyway (the engine counts as registered);
    one from an unknown identity is ignored instead of refused."""

    def on_ready(self, identity: bytes, payload: bytes) -> None:
        engine = self._by_identity.get(bytes(identity))
        if engine is None:
            return
        try:
            super().on_ready(identity, payload)
        except StartupError:
            if engine.registered:
                raise  # refused after registration (a block_size disagreement): as before
            engine.registered = True


class NilCountsSkipped(ReferenceFrontendCore):
    """A coordinator publication without counts (the wave-only update a 0.33.0 coordinator
    sends on every wave change) is skipped as malformed: its wave never reaches an ADD
    (a port whose stats struct has a non-optional counts list)."""

    def on_dp_stats(self, update: m.DPStatsUpdate) -> None:
        if update.counts is None:
            return
        super().on_dp_stats(update)
