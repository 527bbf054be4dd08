"""Handshake mode of the reference frontend: the HELLO / INIT / READY exchange.

When the frontend owns the handshake (vLLM's `launch_core_engines` side), each engine
sends HELLO on the handshake ROUTER, is answered with INIT (the addresses to connect to,
and the owned DP coordinator's when there is one) and later sends READY. These rules are
the `HandshakeRules` mixin of the reference core (core.py), one small method each, so a
mutant frontend overrides exactly one; the core provides the attributes below.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from harness.frontends.api import StartupError
from harness.protocol.wire import WireCodec
from harness.protocol.wire import messages as m

if TYPE_CHECKING:
    from harness.frontends.reference.state import EngineState

T = TypeVar("T")


class HandshakeRules:
    """Handshake-mode rules of `ReferenceFrontendCore` (which provides the attributes below)."""

    engines: dict[int, EngineState]
    codec: WireCodec
    # Handshake mode with an owned DP coordinator: its (input, output) addresses for INIT.
    coordinator_addresses: tuple[str, str] | None
    hello_seen: set[int]  # ranks that sent HELLO
    handshake_ready_seen: set[int]  # ... and READY

    def _known_engine(self, identity: bytes, stage: str) -> EngineState:
        raise NotImplementedError

    def _startup_decode(self, engine: EngineState, decode: Callable[[bytes], T],
                        payload: bytes, what: str) -> T:
        raise NotImplementedError

    def _handshake_engine(self, identity: bytes, stage: str) -> EngineState:
        return self._known_engine(identity, stage)

    def _handshake_status(self, engine: EngineState, payload: bytes) -> str:
        return self._startup_decode(engine, self.codec.decode_handshake_status, payload,
                                    "handshake message").status

    def on_handshake(self, identity: bytes, payload: bytes, inputs: Sequence[str],
                     outputs: Sequence[str]) -> bytes | None:
        """One message on the handshake ROUTER: HELLO is answered with INIT (the addresses
        to connect to; returned), READY is recorded. Anything out of order is refused."""
        engine = self._handshake_engine(identity, "handshake message")
        status = self._handshake_status(engine, payload)
        if status == "HELLO":
            if engine.rank in self.hello_seen:
                raise StartupError(f"engine {engine.rank} sent HELLO twice")
            self.hello_seen.add(engine.rank)
            return self.init_message(engine.rank, inputs, outputs)
        if engine.rank not in self.hello_seen or engine.rank in self.handshake_ready_seen:
            raise StartupError(f"engine {engine.rank} sent READY out of order")
        self.handshake_ready_seen.add(engine.rank)
        return None

    def init_message(self, rank: int, inputs: Sequence[str], outputs: Sequence[str]) -> bytes:
        addresses = m.EngineZmqAddresses(list(inputs), list(outputs))
        if self.coordinator_addresses is not None:  # utils.py:1272-1274
            addresses.coordinator_input, addresses.coordinator_output = \
                self.coordinator_addresses
        return self.codec.encode_init(m.EngineHandshakeMetadata(addresses, {}))

    @property
    def handshake_complete(self) -> bool:
        return self.handshake_ready_seen == set(self.engines)

    def handshake_timeout(self, timeout: float) -> StartupError:
        """Names the engines missing at the first stage that is incomplete."""
        for stage, seen in (("HELLO", self.hello_seen),
                            ("ready response", {r for r, e in self.engines.items()
                                                if e.registered}),
                            ("READY", self.handshake_ready_seen)):
            missing = sorted(set(self.engines) - seen)
            if missing:
                return StartupError(f"handshake: no {stage} from engines {missing} within "
                                    f"{timeout:.1f}s")
        return StartupError("handshake timed out")
