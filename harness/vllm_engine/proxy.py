"""`RecordingProxy`: a man in the middle between any frontend and real engines.

Real engines cannot record what they receive, so the proxy does: it binds the endpoints the
engines connect to (a ROUTER for their input DEALERs, a PULL for their output PUSHes, and
optionally a ROUTER for their handshake DEALERs), connects to the frontend exactly as an
engine would (a DEALER whose identity is the engine's, a PUSH), forwards every frame both
ways unchanged, and records each one in a `Transcript`, decoded with the harness codec. A
malformed frame is recorded with its `ProtocolError` and still forwarded: the proxy never
filters what the peers under test say to each other. So every transcript query written
for mock engines (`adds()`, `abort_frames()`, `utility_calls()`, ...) applies to real ones.

Fidelity of the path itself:

* Per direction the proxy forwards from one socket to one socket, so ZMQ order is kept.
* The frontend-side DEALER is connected when the engine's ready frame arrives, which is when
  a direct engine would have connected.
* When an engine's connection to the proxy drops (the engine died or closed its sockets),
  the proxy closes that client's frontend-side sockets, so the frontend sees the
  disconnect it would have seen from a direct connection.
* Handshake mode: HELLO and READY are relayed as sent; the frontend's INIT is relayed with
  only `addresses.inputs` / `addresses.outputs` rewritten to the proxy's endpoints (every
  other key, known or not, kept as sent).

The proxy can also inject the faults conformance cases ask engines for (ENGINE_CORE_DEAD,
garbage frames, stopping to read, closing sockets); each is recorded on the "fault"
channel and says that the proxy, not the real engine, produced it.

One thread owns every socket; other threads talk to it through a `Mailbox`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

from harness.protocol.transport.endpoints import PrivateIpcDir
from harness.protocol.transport.sockets import drain, identity_rank, make_socket
from harness.protocol.wire import EngineDead, ProtocolError, WireCodec
from mock_engines.mailbox import Mailbox
from mock_engines.transcript import Record, Transcript

_MAX_POLL_MS = 200  # the longest the thread sleeps without checking its stop flag
_DRAIN_BATCH = 256  # messages taken from one socket per wake
NO_RANK = -1  # an output the proxy cannot attribute (several engines, undecodable frame)


class ProxyError(RuntimeError):
    """The proxy could not set itself up (bind/connect) or its thread failed."""


@dataclass
class _Client:
    """One frontend client (client_index): its frontend addresses and both socket sides."""

    index: int
    frontend_input: str
    frontend_output: str
    engine_input: str
    engine_output: str
    eng_in: zmq.Socket[bytes] | None = None  # ROUTER, engines' input DEALERs connect
    eng_out: zmq.Socket[bytes] | None = None  # PULL, engines' output PUSHes connect
    fe_out: zmq.Socket[bytes] | None = None  # PUSH to the frontend's PULL
    fe_in: dict[bytes, zmq.Socket[bytes]] = field(default_factory=dict)  # per engine identity
    monitors: list[zmq.Socket[bytes]] = field(default_factory=list)
    mirrored_disconnect: bool = False


class RecordingProxy:
    """Forward and record every frame between one frontend and its engines."""

    def __init__(self, ranks: Sequence[int], *, codec: WireCodec,
                 transcript: Transcript | None = None,
                 ipc: PrivateIpcDir | None = None) -> None:
        if not ranks:
            raise ValueError("a proxy needs at least one engine rank")
        self.ranks = list(ranks)
        self.codec = codec
        self.transcript = transcript if transcript is not None else Transcript(codec=codec)
        self.failure: BaseException | None = None
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._own_ipc = ipc is None
        self._ipc = ipc if ipc is not None else PrivateIpcDir("cw-proxy-")
        self._clients: list[_Client] = []
        self._registered = {r: threading.Event() for r in self.ranks}
        self._ready_seen: dict[int, set[int]] = {r: set() for r in self.ranks}
        self._handshake_done = {r: threading.Event() for r in self.ranks}
        self._frontend_handshake: str | None = None
        self.engine_handshake: str | None = None
        self._eng_hs: zmq.Socket[bytes] | None = None
        self._fe_hs: dict[bytes, zmq.Socket[bytes]] = {}
        self._reading = True
        self._stop = False
        self._started = False
        self._sockets_changed = True
        self._handlers: dict[Any, Callable[[], None]] = {}
        self._mailbox = Mailbox()
        self._setup_done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="recording-proxy", daemon=True)

    # ------------------------------------------------------------------ start

    @property
    def engine_inputs(self) -> list[str]:
        """Where engines connect their input DEALERs (one per frontend client)."""
        return [c.engine_input for c in self._clients]

    @property
    def engine_outputs(self) -> list[str]:
        """Where engines connect their output PUSHes (one per frontend client)."""
        return [c.engine_output for c in self._clients]

    def start_bootstrapped(self, inputs: Sequence[str], outputs: Sequence[str],
                           timeout: float = 5.0) -> tuple[list[str], list[str]]:
        """Bind the engine side for the frontend's bound addresses; returns (inputs, outputs)
        for the engines. Returns once everything is bound (bounded by `timeout`)."""
        if len(inputs) != len(outputs) or not inputs:
            raise ValueError("need one output address per input address, at least one")
        self._clients = [self._new_client(i, a, b) for i, (a, b) in
                         enumerate(zip(inputs, outputs, strict=True))]
        self._start(timeout)
        return self.engine_inputs, self.engine_outputs

    def start_handshake(self, frontend_handshake: str, timeout: float = 5.0) -> str:
        """Bind a handshake ROUTER for the engines; returns its address. The data sockets
        are bound when the frontend's INIT names its addresses."""
        self._frontend_handshake = frontend_handshake
        self.engine_handshake = self._ipc.address("px-hs")
        self._start(timeout)
        return self.engine_handshake

    def _new_client(self, index: int, frontend_input: str, frontend_output: str) -> _Client:
        return _Client(index, frontend_input, frontend_output,
                       self._ipc.address(f"px-in{index}"), self._ipc.address(f"px-out{index}"))

    def _start(self, timeout: float) -> None:
        if self._started:
            raise RuntimeError("a proxy starts once")
        self._started = True
        self._thread.start()
        if not self._setup_done.wait(timeout):
            raise ProxyError(f"proxy did not bind its endpoints within {timeout:.1f}s")
        if self.failure is not None:
            raise ProxyError(f"proxy setup failed: {self.failure}") from self.failure

    def wait_registered(self, timeout: float, ranks: Sequence[int] | None = None) -> bool:
        """True once each engine's ready frame went through on every client input."""
        deadline = time.monotonic() + timeout
        for rank in self.ranks if ranks is None else ranks:
            if not self._registered[rank].wait(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def registered(self, rank: int) -> bool:
        return self._registered[rank].is_set()

    def handshake_done(self, rank: int) -> bool:
        """Whether the engine's handshake READY was relayed to the frontend."""
        return self._handshake_done[rank].is_set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------ stop

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread, close every socket, terminate the context (bounded)."""
        if self._started:
            self._stop = True
            self._mailbox.stop_owner(self._thread, timeout, "recording proxy")
        self._mailbox.close()
        self.ctx.term()
        if self._own_ipc:
            self._ipc.cleanup()

    # ------------------------------------------------------------------ faults

    def inject_dead(self) -> None:
        """Send ENGINE_CORE_DEAD to every frontend client (the real engine keeps running)."""
        def act() -> None:
            frames = self.codec.encode_engine_dead()
            for client in self._clients:
                self._send_frontend_output(client, frames)
            self._fault("proxy-injected ENGINE_CORE_DEAD on every output (the real engine "
                        "keeps running)", frames)
        self.call(act)

    def inject_garbage(self, frames: Sequence[bytes], client_index: int = 0) -> None:
        """Send `frames` on the frontend output of `client_index`, as if from the engine."""
        raw = [bytes(f) for f in frames]

        def act() -> None:
            if 0 <= client_index < len(self._clients):
                self._send_frontend_output(self._clients[client_index], raw)
                self._fault(f"proxy-injected garbage frame to client {client_index}", raw)
            else:
                self._fault(f"garbage for unknown client {client_index}: dropped", raw)
        self.call(act)

    def stop_reading(self) -> None:
        """Stop forwarding frontend -> engine (frames queue up, as an engine not reading)."""
        self.call(lambda: self._set_reading(False, "proxy stopped reading frontend input"))

    def resume_reading(self) -> None:
        self.call(lambda: self._set_reading(True, "proxy resumed reading frontend input"))

    def close_frontend_sockets(self) -> None:
        """Close every frontend-facing socket, as an engine closing its sockets would."""
        def act() -> None:
            for client in self._clients:
                self._close_frontend_side(client)
            self._fault("proxy closed its frontend-facing sockets")
        self.call(act)

    def call(self, command: Callable[[], None]) -> None:
        """Run `command` on the proxy thread (the only thread that touches its sockets)."""
        self._mailbox.put(command)

    # ------------------------------------------------------------------ thread

    def _run(self) -> None:
        try:
            try:
                self._setup()
            finally:
                self._setup_done.set()
            self._loop()
        except BaseException as exc:  # kept for failures(); never kills the harness
            self.failure = exc
        finally:
            self._close_all()

    def _setup(self) -> None:
        for client in self._clients:
            self._bind_client(client)
        if self.engine_handshake is not None:
            self._eng_hs = make_socket(self.ctx, zmq.ROUTER)
            self._eng_hs.bind(self.engine_handshake)
            self._handlers[self._eng_hs] = self._on_engine_handshake
            self._sockets_changed = True

    def _bind_client(self, client: _Client) -> None:
        client.eng_in = make_socket(self.ctx, zmq.ROUTER)
        client.eng_in.bind(client.engine_input)
        client.eng_out = make_socket(self.ctx, zmq.PULL)
        client.eng_out.bind(client.engine_output)
        client.fe_out = make_socket(self.ctx, zmq.PUSH, linger=1000)
        client.fe_out.connect(client.frontend_output)
        for sock in (client.eng_in, client.eng_out):
            monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            client.monitors.append(monitor)
            self._handlers[monitor] = self._monitor_handler(client, monitor)
        self._handlers[client.eng_in] = lambda: self._on_engine_input(client)
        self._handlers[client.eng_out] = lambda: self._on_engine_output(client)
        self._sockets_changed = True

    def _loop(self) -> None:
        poller = zmq.Poller()
        while not self._stop:
            if self._sockets_changed:
                poller = self._make_poller()
            events = dict(poller.poll(_MAX_POLL_MS))
            if self._mailbox.fd in events:
                self._mailbox.run_pending()
                if self._stop:
                    break
            for sock in events:
                handler = self._handlers.get(sock)
                if handler is not None:
                    handler()

    def _make_poller(self) -> zmq.Poller:
        self._sockets_changed = False
        poller = zmq.Poller()
        poller.register(self._mailbox.fd, zmq.POLLIN)
        frontend_inputs = {s for c in self._clients for s in c.fe_in.values()}
        for sock in self._handlers:
            if sock in frontend_inputs and not self._reading:
                continue  # not reading: queued input must not wake (and spin) the loop
            poller.register(sock, zmq.POLLIN)
        return poller

    # ----------------------------------------------------- engine -> frontend

    def _on_engine_input(self, client: _Client) -> None:
        """Engine DEALER -> proxy ROUTER: the ready frame (first), then anything else."""
        assert client.eng_in is not None
        for identity, *frames in drain(client.eng_in, _DRAIN_BATCH):
            now = time.monotonic()
            rank = identity_rank(identity)
            dealer = client.fe_in.get(identity)
            if client.mirrored_disconnect:
                self._record(Record(now, rank, "out", "input", tuple(frames), None, None,
                                    "engine frame after its disconnect: not forwarded"))
            elif dealer is None:
                self._record_ready(now, rank, frames)
                dealer = self._connect_frontend_input(client, identity)
                dealer.send_multipart(frames)
                self._note_ready(rank, client.index)
            else:
                self._record(Record(now, rank, "out", "input", tuple(frames), None, None,
                                    "unexpected engine frame on the input socket"))
                dealer.send_multipart(frames)

    def _record_ready(self, now: float, rank: int, frames: list[bytes]) -> None:
        message: Any = None
        error: ProtocolError | None = None
        if len(frames) != 1:
            error = ProtocolError("ready_payload", f"ready message must be one frame, got "
                                  f"{len(frames)}", frames)
        else:
            try:
                message = self.codec.decode_ready(frames[0])
            except ProtocolError as exc:
                error = exc
        self._record(Record(now, rank, "out", "ready", tuple(frames), message, error,
                            "ready response"))

    def _note_ready(self, rank: int, client_index: int) -> None:
        seen = self._ready_seen.setdefault(rank, set())
        seen.add(client_index)
        event = self._registered.get(rank)
        if event is not None and len(seen) >= len(self._clients):
            event.set()

    def _connect_frontend_input(self, client: _Client, identity: bytes) -> zmq.Socket[bytes]:
        dealer = make_socket(self.ctx, zmq.DEALER, identity=identity)
        dealer.connect(client.frontend_input)
        client.fe_in[identity] = dealer
        self._handlers[dealer] = lambda: self._on_frontend_input(client, identity, dealer)
        self._sockets_changed = True
        return dealer

    def _on_engine_output(self, client: _Client) -> None:
        """Engine PUSH -> proxy PULL -> frontend PULL: outputs, utility replies, DEAD."""
        assert client.eng_out is not None
        for frames in drain(client.eng_out, _DRAIN_BATCH):
            now = time.monotonic()
            message, error = self._decode(self.codec.decode_outputs, frames)
            if message is not None and not isinstance(message, EngineDead):
                rank = message.engine_index
            else:
                rank = self.ranks[0] if len(self.ranks) == 1 else NO_RANK
            note = "ENGINE_CORE_DEAD" if isinstance(message, EngineDead) else ""
            self._record(Record(now, rank, "out", "output", tuple(frames), message, error,
                                note))
            self._send_frontend_output(client, frames)

    def _send_frontend_output(self, client: _Client, frames: Sequence[bytes]) -> None:
        if client.fe_out is not None:
            client.fe_out.send_multipart(list(frames))

    # ----------------------------------------------------- frontend -> engine

    def _on_frontend_input(self, client: _Client, identity: bytes,
                           dealer: zmq.Socket[bytes]) -> None:
        """Frontend ROUTER -> proxy DEALER -> engine DEALER (through the proxy ROUTER)."""
        if not self._reading or client.eng_in is None:
            return
        rank = identity_rank(identity)
        for frames in drain(dealer, _DRAIN_BATCH):
            now = time.monotonic()
            message, error = self._decode(self.codec.decode_engine_input, frames)
            self._record(Record(now, rank, "in", "input", tuple(frames), message, error))
            client.eng_in.send_multipart([identity, *frames])

    # ----------------------------------------------------------- handshake

    def _on_engine_handshake(self) -> None:
        """Engine HELLO / READY -> frontend handshake ROUTER (one DEALER per engine)."""
        assert self._eng_hs is not None and self._frontend_handshake is not None
        for identity, *frames in drain(self._eng_hs, _DRAIN_BATCH):
            now = time.monotonic()
            rank = identity_rank(identity)
            message, error = self._decode(self.codec.decode_handshake_status, frames[-1])
            status = getattr(message, "status", "?")
            self._record(Record(now, rank, "out", "handshake", tuple(frames), message, error,
                                status))
            dealer = self._fe_hs.get(identity)
            if dealer is None:
                dealer = make_socket(self.ctx, zmq.DEALER, identity=identity, linger=1000)
                dealer.connect(self._frontend_handshake)
                self._fe_hs[identity] = dealer
                self._handlers[dealer] = functools.partial(self._on_init, identity, dealer)
                self._sockets_changed = True
            dealer.send_multipart(frames)
            if status == "READY" and rank in self._handshake_done:
                self._handshake_done[rank].set()

    def _on_init(self, identity: bytes, dealer: zmq.Socket[bytes]) -> None:
        """Frontend INIT -> engine, with the data addresses pointed at the proxy."""
        assert self._eng_hs is not None
        rank = identity_rank(identity)
        for frames in drain(dealer, _DRAIN_BATCH):
            now = time.monotonic()
            message, error = self._decode(self.codec.decode_init, frames[-1])
            self._record(Record(now, rank, "in", "handshake", tuple(frames), message, error,
                                "INIT"))
            forwarded = list(frames)
            if message is not None:
                forwarded[-1] = self._rewrite_init(frames[-1], message.addresses.inputs,
                                                   message.addresses.outputs)
            self._eng_hs.send_multipart([identity, *forwarded])

    def _rewrite_init(self, payload: bytes, inputs: list[str], outputs: list[str]) -> bytes:
        """Bind the proxy's data endpoints for the frontend's, and point the INIT at them."""
        if not self._clients:
            self._clients = [self._new_client(i, a, b) for i, (a, b) in
                             enumerate(zip(inputs, outputs, strict=False))]
            for client in self._clients:
                self._bind_client(client)
        raw = msgspec.msgpack.decode(payload)
        raw["addresses"]["inputs"] = self.engine_inputs
        raw["addresses"]["outputs"] = self.engine_outputs
        return msgspec.msgpack.encode(raw)

    # ------------------------------------------------------------ disconnects

    def _monitor_handler(self, client: _Client, monitor: zmq.Socket[bytes]
                         ) -> Callable[[], None]:
        def handle() -> None:
            with contextlib.suppress(zmq.Again):
                while True:
                    event = monitor.recv_multipart(zmq.NOBLOCK)
                    if (int.from_bytes(event[0][:2], "little") == zmq.EVENT_DISCONNECTED
                            and not client.mirrored_disconnect):
                        client.mirrored_disconnect = True
                        self._close_frontend_side(client)
                        self._fault(f"engine connection to the proxy dropped (client "
                                    f"{client.index}); frontend-side sockets closed to "
                                    f"mirror it")
        return handle

    def _close_frontend_side(self, client: _Client) -> None:
        for identity, dealer in list(client.fe_in.items()):
            self._handlers.pop(dealer, None)
            dealer.close(linger=0)
            del client.fe_in[identity]
        if client.fe_out is not None:
            client.fe_out.close(linger=0)
            client.fe_out = None
        self._sockets_changed = True

    # ------------------------------------------------------------------ misc

    def _set_reading(self, value: bool, note: str) -> None:
        self._reading = value
        self._sockets_changed = True
        self._fault(note)

    def _fault(self, note: str, frames: Sequence[bytes] = ()) -> None:
        rank = self.ranks[0] if len(self.ranks) == 1 else NO_RANK
        self._record(Record(time.monotonic(), rank, "out", "fault", tuple(frames), None, None,
                            note))

    def _record(self, record: Record) -> None:
        self.transcript.append(record)

    @staticmethod
    def _decode(decode: Callable[[Any], Any], payload: Any) -> tuple[Any, ProtocolError | None]:
        """(message, None) or (None, error): the proxy records bad frames and forwards them."""
        try:
            return decode(payload), None
        except ProtocolError as exc:
            return None, exc

    def _close_all(self) -> None:
        for client in self._clients:
            for sock in (client.eng_in, client.eng_out):
                if sock is not None:
                    with contextlib.suppress(zmq.ZMQError):
                        sock.disable_monitor()
            for monitor in client.monitors:
                monitor.close(linger=0)
            client.monitors.clear()
            self._close_frontend_side(client)
            for sock in (client.eng_in, client.eng_out):
                if sock is not None:
                    sock.close(linger=0)
            client.eng_in = client.eng_out = None
        for sock in [*self._fe_hs.values(), self._eng_hs]:
            if sock is not None:
                sock.close(linger=0)
        self._fe_hs.clear()
        self._eng_hs = None
        self._handlers.clear()


__all__ = ["NO_RANK", "ProxyError", "RecordingProxy"]
