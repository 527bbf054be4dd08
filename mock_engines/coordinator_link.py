"""The engine side of a frontend-owned DP coordinator (handshake mode, addresses from INIT).

vLLM 0.33.0 engines (`v1/engine/core.py`): the input thread connects an XSUB to
`coordinator_input`, sends the subscription `b"\\x01"` and waits for the coordinator's
`b"READY"` before the engine's handshake READY (:1279-1289, :1956-1985); the coordinator then
publishes `[START_DP_WAVE, msgpack((wave, exclude_engine_index))]` there (coordinator.py:
447-456). The output thread PUSHes `EngineCoreOutputs` for client index -1 (start_wave,
wave_complete, scheduler stats) to `coordinator_output` (:2065-2090), stamped with the
engine index. Everything the link sees or sends is recorded on the "coordinator" channel.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import zmq

from harness.protocol.transport.sockets import engine_identity, make_socket
from harness.protocol.wire import ProtocolError
from harness.protocol.wire import messages as m
from mock_engines.engine import MockEngineCore
from mock_engines.transcript import Record

READY = b"READY"
SUBSCRIBE_ALL = b"\x01"


class CoordinatorNotReady(TimeoutError):
    """The coordinator never answered the engine's subscription with READY (bounded)."""


class CoordinatorLink:
    """XSUB (coordinator -> engine) and PUSH (engine -> coordinator) of one engine.

    Used only on the engine thread; inert when INIT carried no coordinator addresses.
    """

    def __init__(self, core: MockEngineCore) -> None:
        self.core = core
        self.sub: zmq.Socket[bytes] | None = None
        self.push: zmq.Socket[bytes] | None = None
        self.ready = False

    def connect(self, ctx: zmq.Context[zmq.Socket[bytes]],
                addresses: m.EngineZmqAddresses) -> None:
        """Connect to what INIT named; subscribe to everything, as vLLM's engines do."""
        rank = self.core.rank
        alias = self.core.script.register_as
        if addresses.coordinator_input is not None:
            self.sub = make_socket(ctx, zmq.XSUB,
                                   identity=engine_identity(rank if alias is None else alias))
            self.sub.connect(addresses.coordinator_input)
            delay = self.core.script.coordinator_subscribe_delay
            if delay > 0:  # a slow engine: its subscription reaches the coordinator late
                time.sleep(delay)
            self.subscribe()
        if addresses.coordinator_output is not None:
            self.push = make_socket(ctx, zmq.PUSH, linger=1000)
            self.push.connect(addresses.coordinator_output)

    def subscribe(self) -> None:
        """Send the subscription `b"\\x01"` (again: an engine whose XSUB reconnected)."""
        assert self.sub is not None
        sent_at = time.monotonic()  # before the send: a reply can be recorded first
        self.sub.send(SUBSCRIBE_ALL)
        self._record("out", (SUBSCRIBE_ALL,), None, "subscription", at=sent_at)

    def send_upstream(self, frame: bytes) -> None:
        """Send an arbitrary upstream frame on the XSUB (not a subscription: a misbehaving
        engine; vLLM's coordinator sees it on its engine-facing XPUB)."""
        assert self.sub is not None
        self.sub.send(frame)
        self._record("out", (frame,), None, "upstream message")

    def wait_ready(self, timeout: float, stopping: Callable[[], bool]) -> bool:
        """Block until the coordinator's READY (no coordinator: at once). False if the
        engine was stopped meanwhile; CoordinatorNotReady past `timeout`."""
        if self.sub is None:
            return True
        deadline = time.monotonic() + timeout
        while not stopping():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CoordinatorNotReady(f"engine {self.core.rank}: no READY from the DP "
                                          f"coordinator within {timeout}s")
            if self.sub.poll(int(min(remaining, 0.1) * 1000)):
                frames = tuple(self.sub.recv_multipart())
                if frames == (READY,):
                    self.ready = True
                    self._record("in", frames, None, "READY")
                    return True
                self._on_message(frames)  # recorded; real engines assert READY comes first
        return False

    def drain(self) -> None:
        """Read every pending coordinator publication (engine thread, non-blocking)."""
        assert self.sub is not None
        while True:
            try:
                frames = tuple(self.sub.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if frames == (READY,):  # re-sent on a late subscription (coordinator.py:360)
                self._record("in", frames, None, "READY")
                continue
            self._on_message(frames)

    def _on_message(self, frames: tuple[bytes, ...]) -> None:
        try:
            message = self.core.codec.decode_engine_input(list(frames))
        except ProtocolError as exc:
            self._record("in", frames, None, "undecodable", exc)
            return
        note = "START_DP_WAVE" if isinstance(message, m.StartDPWave) else "unexpected"
        self._record("in", frames, message, note)

    def send(self, outputs: m.EngineCoreOutputs) -> None:
        """PUSH one message to the coordinator, stamped with this engine's index."""
        outputs.engine_index = self.core.rank
        frames = tuple(self.core.codec.encode_outputs(outputs))
        if self.push is None:
            self._record("out", frames, outputs, "dropped: INIT named no coordinator")
            return
        self.push.send_multipart(list(frames))
        self._record("out", frames, outputs, "to coordinator")

    def send_raw(self, frames: list[bytes]) -> None:
        """PUSH raw frames to the coordinator (undecodable bytes, ENGINE_CORE_DEAD...)."""
        if self.push is None:
            self._record("out", tuple(frames), None, "dropped: INIT named no coordinator")
            return
        self.push.send_multipart(frames)
        self._record("out", tuple(frames), None, "raw to coordinator")

    def _record(self, direction: str, frames: tuple[bytes, ...], message: object, note: str,
                error: ProtocolError | None = None, at: float | None = None) -> None:
        self.core.transcript.append(Record(time.monotonic() if at is None else at,
                                           self.core.rank,
                                           "in" if direction == "in" else "out",
                                           "coordinator", frames, message, error, note))

    def close(self) -> None:
        for sock in (self.sub, self.push):
            if sock is not None:
                sock.close(linger=0)
        self.sub = self.push = None
