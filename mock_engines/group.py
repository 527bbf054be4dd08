"""`MockEngine` (one rank on real sockets), `EngineGroup` (N ranks) and the mock DP coordinator.

The group is what tests and frontend drivers hold: it starts N engines against whatever
the frontend bound (or against its handshake socket), publishes DP stats like vLLM's
coordinator, merges the transcripts, and always cleans up (threads joined, sockets closed,
the ZMQ context terminated) within a bound.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Sequence
from types import TracebackType

import zmq

from harness.protocol.transport.sockets import make_socket
from harness.protocol.wire import WireCodec
from harness.protocol.wire import messages as m
from mock_engines.engine import MockEngineCore, scripted_load
from mock_engines.runner import Bootstrapped, Connection, EngineRunner, Handshake
from mock_engines.script import EngineScript
from mock_engines.transcript import MergedTranscript, Record, Transcript

COORDINATOR_RANK = -1


class MockEngine:
    """One scripted DP rank: its state machine, its socket thread and its transcript."""

    def __init__(self, rank: int, script: EngineScript, ctx: zmq.Context[zmq.Socket[bytes]],
                 *, codec: WireCodec, dp_size: int = 1) -> None:
        self.rank = rank
        self.script = script
        self.transcript = Transcript(codec=codec, retain=script.retain_transcript)
        self.core = MockEngineCore(rank, script, codec=codec, transcript=self.transcript,
                                   dp_size=dp_size)
        self._ctx = ctx
        self.runner: EngineRunner | None = None

    def start(self, connection: Connection) -> None:
        self.runner = EngineRunner(self.core, self._ctx, connection)
        self.runner.start()

    def load(self) -> tuple[int, int]:
        """(waiting, running) for the DP coordinator: the running engine thread's last
        count of live requests (only that thread touches the core) plus what the script adds."""
        waiting, running = scripted_load(self.script)  # a case may change it any time
        live = 0 if self.runner is None else self.runner.live_count
        return waiting, live + running

    def _runner(self) -> EngineRunner:
        if self.runner is None:
            raise RuntimeError(f"mock engine {self.rank} is not started")
        return self.runner

    # Faults, each recorded in the transcript.
    def send_dead(self) -> None:
        self._runner().send_dead()

    def send_garbage(self, frames: list[bytes], client_index: int = 0) -> None:
        self._runner().send_garbage(frames, client_index)

    def send_outputs(self, outputs: m.EngineCoreOutputs, client_index: int = 0) -> None:
        """Send one hand-built engine message (recorded as an output)."""
        self._runner().send_outputs(outputs, client_index)

    # The coordinator path (handshake mode, a frontend-owned coordinator named in INIT).
    def send_coordinator(self, outputs: m.EngineCoreOutputs) -> None:
        """One engine -> coordinator message, as vLLM's output thread sends client -1."""
        self._runner().send_coordinator(outputs)

    def send_coordinator_raw(self, frames: list[bytes]) -> None:
        """Raw frames on the coordinator path (undecodable bytes, ENGINE_CORE_DEAD)."""
        self._runner().send_coordinator_raw(frames)

    def coordinator_upstream(self, frame: bytes) -> None:
        """A non-subscription message up the engine's XSUB to the coordinator's XPUB."""
        self._runner().coordinator_upstream(frame)

    def coordinator_resubscribe(self) -> None:
        """Subscribe again, as an engine whose coordinator connection was re-established."""
        self._runner().coordinator_resubscribe()

    def start_wave(self, wave: int) -> None:
        """"I started wave `wave`" (an idle engine got a request, core.py:2374-2385)."""
        self.send_coordinator(m.EngineCoreOutputs(start_wave=wave))

    def wave_complete(self, wave: int) -> None:
        """"Wave `wave` finished, engines paused" (rank 0 after the all-reduce, :2519-2533)."""
        self.send_coordinator(m.EngineCoreOutputs(wave_complete=wave))

    def coordinator_stats(self, waiting: int, running: int, wave: int = 0) -> None:
        """A stats-only message (load for the coordinator; no wave control)."""
        runner = self._runner()

        def send() -> None:
            stats = {**self.core.full_stats(), "num_waiting_reqs": waiting,
                     "num_running_reqs": running, "current_wave": wave}
            runner.coordinator.send(m.EngineCoreOutputs(scheduler_stats=stats))
        runner.call(send)

    def stop_reading(self) -> None:
        self._runner().stop_reading()

    def resume_reading(self) -> None:
        self._runner().resume_reading()

    def close_sockets(self) -> None:
        self._runner().close_sockets()

    def exit(self) -> None:
        self._runner().exit()

    def stop(self, timeout: float = 5.0) -> None:
        if self.runner is not None:
            self.runner.stop(timeout)


class MockCoordinator:
    """The frontend-facing half of vLLM's DP coordinator: an XPUB publishing load stats.

    Publishes `[counts, wave, running]` with one `[waiting, running, 0.0]` triple per engine
    every `interval` seconds, and records what it publishes and the subscriptions it gets.
    """

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str,
                 engines: Sequence[MockEngine], *, codec: WireCodec,
                 interval: float = 0.1) -> None:
        self.address = address
        self.transcript = Transcript(codec=codec)
        self._ctx = ctx
        self._engines = engines
        self._codec = codec
        self._interval = interval
        self._stop = threading.Event()
        # Written by stop(): the publishing thread's poll wakes at once instead of finishing
        # its wait (up to 50 ms in every multi-engine case's teardown).
        self._wake_read, self._wake_write = os.pipe()
        self._sock: zmq.Socket[bytes] | None = None
        self.failure: BaseException | None = None
        self.wave = 0
        self.running: bool | None = None  # None: published as "any engine has live work"
        # (waiting, running) per engine published instead of the engines' live counts (a
        # stale snapshot): routing then rests on the frontend's own in-flight counts.
        self.counts_override: list[tuple[int, int]] | None = None
        # False: no regular publications (between two of vLLM's, or a coordinator whose
        # stats stopped): load then reaches a frontend only in the engines' scheduler_stats.
        self.publishing = True
        # Raw payloads published (once each, in order) before the next regular publication:
        # undecodable stats a frontend must survive.
        self.inject: list[bytes] = []
        self._thread = threading.Thread(target=self._run, name="mock-dp-coordinator",
                                        daemon=True)

    def start(self) -> None:
        """Bind here, in the caller's thread (binding never blocks), then hand the socket to
        the publishing thread: a driver on the event loop never waits on a thread."""
        sock = make_socket(self._ctx, zmq.XPUB)
        try:
            sock.bind(self.address)
        except zmq.ZMQError as exc:
            sock.close(0)
            self.failure = exc
            raise RuntimeError(f"mock DP coordinator could not bind {self.address}: "
                               f"{exc}") from exc
        self._sock = sock
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._wake_write >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_write, b"x")
        if self._thread.ident is not None:
            self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("mock DP coordinator did not stop in time")
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_read = self._wake_write = -1

    def _run(self) -> None:
        sock = self._sock  # owned by this thread from here on
        assert sock is not None
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        try:
            next_publish = time.monotonic()
            while not self._stop.is_set():
                wait_ms = max(0.0, (next_publish - time.monotonic()) * 1000)
                ready = dict(poller.poll(int(min(wait_ms, 50))))
                if self._stop.is_set():
                    break
                if sock in ready:
                    frame = sock.recv()
                    self.transcript.append(Record(time.monotonic(), COORDINATOR_RANK, "in",
                                                  "coordinator", (frame,), None, None,
                                                  "subscription"))
                while self.inject:
                    raw = self.inject.pop(0)
                    sock.send(raw)
                    self.transcript.append(Record(time.monotonic(), COORDINATOR_RANK, "out",
                                                  "coordinator", (raw,), None, None,
                                                  "injected"))
                if time.monotonic() >= next_publish:
                    if self.publishing:
                        self._publish(sock)
                    next_publish = time.monotonic() + self._interval
        except BaseException as exc:
            self.failure = exc
        finally:
            sock.close(0)

    def _publish(self, sock: zmq.Socket[bytes]) -> None:
        """One regular publication: the engines' live counts (or the override)."""
        live = (self.counts_override if self.counts_override is not None
                else [e.load() for e in self._engines])
        counts = [(w, r, 0.0) for w, r in live]
        running = any(r for _, r, _ in counts) if self.running is None else self.running
        update = m.DPStatsUpdate(counts, self.wave, running)
        payload = self._codec.encode_dp_stats(update)
        sock.send(payload)
        self.transcript.append(Record(time.monotonic(), COORDINATOR_RANK, "out",
                                      "coordinator", (payload,), update))


class EngineGroup:
    """N mock engines (DP ranks 0..N-1) plus, for DP, a mock coordinator."""

    def __init__(self, scripts: Sequence[EngineScript] | int, *, codec: WireCodec,
                 coordinator_address: str | None = None, rank_offset: int = 0) -> None:
        """`codec`: the protocol every engine speaks (`codec_for(profile)`: a vLLM
        release's array layouts, ready keys, sentinel), chosen by the run's settings."""
        if isinstance(scripts, int):
            scripts = [EngineScript() for _ in range(scripts)]
        if not scripts:
            raise ValueError("an engine group needs at least one engine")
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.codec = codec
        self.profile = codec.profile
        self.engines = [MockEngine(rank_offset + i, s, self.ctx, codec=codec,
                                   dp_size=len(scripts)) for i, s in enumerate(scripts)]
        self.coordinator = (MockCoordinator(self.ctx, coordinator_address, self.engines,
                                            codec=codec)
                            if coordinator_address else None)
        parts = [e.transcript for e in self.engines]
        if self.coordinator is not None:
            parts.append(self.coordinator.transcript)
        self.transcript = MergedTranscript(parts)
        self._started = False
        self._closed = False
        # Set by cases that need the frontend to own HELLO / INIT / READY (start_handshake);
        # a driver that cannot must refuse to start (UnsupportedOperation), never fall back.
        self.handshake = False
        # Set (with handshake) by cases that need the frontend to own a wave-coordinating DP
        # coordinator and name it in INIT; a driver that cannot run one refuses to start.
        self.coordinated = False

    def __len__(self) -> int:
        return len(self.engines)

    def __getitem__(self, index: int) -> MockEngine:
        return self.engines[index]

    @property
    def stats_address(self) -> str | None:
        return self.coordinator.address if self.coordinator else None

    # ------------------------------------------------------------------ start

    def start_coordinator(self) -> None:
        """Bind the coordinator's XPUB (frontends connect to it before engines register)."""
        if self.coordinator is not None and not self.coordinator._thread.is_alive():
            self.coordinator.start()

    def start_bootstrapped(self, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        """Connect every engine to addresses the frontend bound (one per client)."""
        self.start_coordinator()
        for engine in self.engines:
            engine.start(Bootstrapped(list(inputs), list(outputs)))
        self._started = True

    def start_handshake(self, address: str, *, local: bool = True, headless: bool = False,
                        timeout: float = 30.0) -> None:
        """Each engine does HELLO / INIT / READY against the frontend's handshake ROUTER."""
        self.start_coordinator()
        for engine in self.engines:
            engine.start(Handshake(address, local, headless, timeout))
        self._started = True

    def wait_registered(self, timeout: float) -> bool:
        """True once every engine that is scripted to register has sent its ready frame."""
        deadline = time.monotonic() + timeout
        for engine in self.engines:
            if not engine.script.register or engine.runner is None:
                continue
            if not engine.runner.registered.wait(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def failures(self) -> list[tuple[int, BaseException]]:
        """Harness-level failures of engine threads (e.g. a handshake that timed out)."""
        out = [(e.rank, e.runner.failure) for e in self.engines
               if e.runner is not None and e.runner.failure is not None]
        if self.coordinator is not None and self.coordinator.failure is not None:
            out.append((COORDINATOR_RANK, self.coordinator.failure))
        return out

    # ------------------------------------------------------------------ stop

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every thread, close every socket and terminate the context (bounded)."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for engine in self.engines:
            try:
                engine.stop(timeout)
            except TimeoutError as exc:
                errors.append(exc)
        if self.coordinator is not None and self.coordinator._thread.is_alive():
            try:
                self.coordinator.stop(timeout)
            except TimeoutError as exc:
                errors.append(exc)
        if not errors:
            self.ctx.term()
        if errors:
            raise TimeoutError("; ".join(str(e) for e in errors))

    def __enter__(self) -> EngineGroup:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


__all__ = ["COORDINATOR_RANK", "EngineGroup", "MockCoordinator", "MockEngine"]
