"""The handshake area's mutants: reference frontends that each break one handshake rule.

Each registers itself (harness/mutation/registry.py); the kill matrix and
`--frontend mutant:NAME` find it there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from harness.frontends.api import StartupError
from harness.frontends.reference.core import (
    EngineState,
    ReferenceFrontendCore,
)
from harness.mutation.registry import mutant
from harness.protocol.timing import scaled
from harness.protocol.wire import ProtocolError, WireCodec
from harness.protocol.wire import messages as m


@mutant("init_names_absent_coordinator", "INIT names coordinator addresses though the "
        "frontend runs no coordinator")
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


@mutant("max_model_len_last_wins", "max_model_len from the last ready response")
class ReadyMaxModelLenLastWins(ReferenceFrontendCore):
    """max_model_len is taken from the last ready response received."""

    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        super().apply_ready(rank, ready)
        self.config.max_model_len = ready.max_model_len


@mutant("max_model_len_first_wins", "max_model_len from the first ready response")
class ReadyMaxModelLenFirstWins(ReferenceFrontendCore):
    """max_model_len is taken from the first ready response received."""

    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        first = self.config.max_model_len
        super().apply_ready(rank, ready)
        if first is not None:
            self.config.max_model_len = first


@mutant("gpu_blocks_engine_zero_times_n", "num_gpu_blocks = engine 0's value x count")
class ReadyGpuBlocksEngineZero(ReferenceFrontendCore):
    """num_gpu_blocks is engine 0's value times the engine count (assumes uniform ranks)."""

    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        super().apply_ready(rank, ready)
        first = self.engines[min(self.engines)].ready
        if first is not None:
            self.config.num_gpu_blocks = first.num_gpu_blocks * len(self.engines)


@mutant("identity_by_arrival", "ready frames matched to engines by arrival order")
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


@mutant("init_without_outputs", "INIT carries no output address")
class InitWithoutOutputs(ReferenceFrontendCore):
    """INIT advertises the input address only: engines cannot push any output."""

    def init_message(self, rank: int, inputs: Sequence[str], outputs: Sequence[str]) -> bytes:
        return super().init_message(rank, inputs, [])


@mutant("serves_before_handshake_ready", "READY of the handshake not awaited")
class ServesBeforeHandshakeReady(ReferenceFrontendCore):
    """The handshake counts as done once every engine said HELLO; READY is not awaited."""

    @property
    def handshake_complete(self) -> bool:
        return self.hello_seen == set(self.engines)


@mutant("hello_identity_unchecked", "engines matched by arrival at HELLO and registration")
class HelloIdentityUnchecked(IdentityByArrival):
    """Identities are opaque at HELLO too: engines are matched by arrival throughout."""

    def _handshake_engine(self, identity: bytes, stage: str) -> EngineState:
        alias = self._alias(identity, lambda e: e.rank not in self.hello_seen)
        return super()._handshake_engine(alias, stage)


@mutant("ready_sync_only_with_dp", "a single engine's ready response not applied")
class ReadySyncOnlyWithDp(ReferenceFrontendCore):
    """Ready responses are aggregated only for DP > 1; a single engine's is never applied."""

    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        if len(self.engines) > 1:
            super().apply_ready(rank, ready)


@mutant("serves_with_hello_quorum", "handshake counts engines that said HELLO only")
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


@mutant("block_size_ignored", "block_size from the ready response ignored")
class BlockSizeIgnored(ReferenceFrontendCore):
    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        super().apply_ready(rank, ready)
        self.config.block_size = 16  # the frontend's own default, not the engine's


@mutant("block_size_last_wins", "disagreeing block_size not detected (last wins)")
class BlockSizeLastWins(ReferenceFrontendCore):
    def check_block_sizes(self) -> None:
        pass


@mutant("max_model_len_max", "max_model_len = max instead of min")
class MaxModelLenMax(ReferenceFrontendCore):
    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        previous = self.config.max_model_len
        super().apply_ready(rank, ready)
        self.config.max_model_len = max(previous or 0, ready.max_model_len)


@mutant("gpu_blocks_last_wins", "num_gpu_blocks last-wins instead of summed")
class GpuBlocksLastWins(ReferenceFrontendCore):
    def apply_ready(self, rank: int, ready: m.EngineCoreReadyResponse) -> None:
        super().apply_ready(rank, ready)
        self.config.num_gpu_blocks = ready.num_gpu_blocks


@mutant("serves_with_missing_engines", "serves before every engine registered")
class ServesWithMissingEngines(ReferenceFrontendCore):
    @property
    def registered(self) -> bool:
        return any(e.registered for e in self.engines.values())


@mutant("ready_forbids_unknown_keys", "ready responses with unknown keys rejected")
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


@mutant("startup_error_unnamed", "startup timeout error does not name the engine")
class StartupErrorUnnamed(ReferenceFrontendCore):
    def registration_timeout(self, timeout: float) -> StartupError:
        return StartupError("timed out waiting for engines to start")


@mutant("startup_accepts_anything", "malformed ready frames accepted")
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


@mutant("hello_twice_answered", "a repeated HELLO gets a second INIT")
class HelloTwiceAnswered(ReferenceFrontendCore):
    """A repeated HELLO is answered with another INIT instead of refused (the engine's
    state is not tracked per stage)."""

    def on_handshake(self, identity: bytes, payload: bytes, inputs: Sequence[str],
                     outputs: Sequence[str]) -> bytes | None:
        engine = self._handshake_engine(identity, "handshake message")
        if self._handshake_status(engine, payload) == "HELLO":
            self.hello_seen.add(engine.rank)
            return self.init_message(engine.rank, inputs, outputs)
        return super().on_handshake(identity, payload, inputs, outputs)


@mutant("ready_order_unchecked", "READY accepted before HELLO or twice")
class ReadyOrderUnchecked(ReferenceFrontendCore):
    """READY is recorded whenever it comes: before the engine's HELLO, or twice."""

    def on_handshake(self, identity: bytes, payload: bytes, inputs: Sequence[str],
                     outputs: Sequence[str]) -> bytes | None:
        engine = self._handshake_engine(identity, "handshake message")
        if self._handshake_status(engine, payload) == "READY":
            self.handshake_ready_seen.add(engine.rank)
            return None
        return super().on_handshake(identity, payload, inputs, outputs)


@mutant("undecodable_handshake_skipped", "an undecodable handshake message is dropped, "
        "startup waits for the bound")
class UndecodableHandshakeSkipped(ReferenceFrontendCore):
    """An undecodable handshake message is dropped and the frontend waits for a valid one
    (startup then fails only at the bound, for the wrong reason)."""

    def on_handshake(self, identity: bytes, payload: bytes, inputs: Sequence[str],
                     outputs: Sequence[str]) -> bytes | None:
        try:
            self.codec.decode_handshake_status(payload)
        except ProtocolError:
            return None
        return super().on_handshake(identity, payload, inputs, outputs)


@mutant("unexpected_identity_vague", "the unexpected-identity error names no identity")
class UnexpectedIdentityVague(ReferenceFrontendCore):
    """A handshake message from an unknown identity is refused without saying which."""

    def _handshake_engine(self, identity: bytes, stage: str) -> EngineState:
        if bytes(identity) not in self._by_identity:
            raise StartupError("handshake message from an unexpected engine")
        return super()._handshake_engine(identity, stage)


@mutant("handshake_timeout_unnamed", "a handshake timeout names no engine or stage")
class HandshakeTimeoutUnnamed(ReferenceFrontendCore):
    """A handshake timeout says only that it timed out: no engine, no stage."""

    def handshake_timeout(self, timeout: float) -> StartupError:
        return StartupError(f"handshake timed out after {timeout:.1f}s")


@mutant("block_size_disagreement_unexplained", "a block_size disagreement is refused "
        "without the values")
class BlockSizeDisagreementUnexplained(ReferenceFrontendCore):
    """Refuses engines that disagree on block_size without showing the values."""

    def check_block_sizes(self) -> None:
        if len(set(self._block_sizes.values())) > 1:
            raise StartupError("engines disagree on block_size")


@mutant("registration_refusals_unnamed", "an unusable or repeated registration is "
        "refused without naming the engine")
class RegistrationRefusalsUnnamed(ReferenceFrontendCore):
    """Any unusable registration is refused with one generic text: which engine sent it
    (and what was wrong with it) is lost."""

    def on_ready(self, identity: bytes, payload: bytes) -> None:
        try:
            super().on_ready(identity, payload)
        except StartupError:
            raise StartupError("an engine sent an unusable registration") from None


@mutant("ready_bound_hard_coded", "registrations accepted only within a fixed 4.5 s, "
        "not the configured startup bound")
class ReadyBoundHardCoded(ReferenceFrontendCore):
    """Ignores the configured startup bound: a registration is accepted only within a fixed
    4.5 s (scaled) of the frontend's creation, a constant where the configured ready
    timeout belongs."""

    HARD_BOUND = 4.5

    def __init__(self, ranks: Sequence[int], *, codec: WireCodec) -> None:
        super().__init__(ranks, codec=codec)
        self.created = time.monotonic()

    def on_ready(self, identity: bytes, payload: bytes) -> None:
        if time.monotonic() - self.created > scaled(self.HARD_BOUND):
            raise self.registration_timeout(scaled(self.HARD_BOUND))
        super().on_ready(identity, payload)
