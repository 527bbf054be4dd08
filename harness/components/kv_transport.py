"""`FakeTransport`: a NIXL-agent-shaped fake that injects the faults of the KV contract.

Why a fake: the KV-connector worker's failure contract (kv_contract.py) is about what the
worker does when NIXL fails, and real NIXL cannot be told to fail on cue. This fake has the
NIXL-agent surface a worker calls, the faults of vLLM's test-only `FailingNixlWrapper`, and
per-request scripts and release failures, and records every misuse it sees.
"""

from __future__ import annotations

import enum
import itertools
import threading
import time
from dataclasses import dataclass, field

import zmq


class Outcome(str, enum.Enum):
    """What one read attempt of a request does."""

    DONE = "DONE"  # check_xfer_state -> "DONE"
    ERR = "ERR"  # check_xfer_state -> "ERR" (vLLM: transfer_failed)
    RAISE = "RAISE"  # check_xfer_state raises (vLLM: transfer_exception)
    HOLD = "HOLD"  # "PROC" until resolve() decides
    SETUP_FAIL = "SETUP_FAIL"  # make_prepped_xfer raises (vLLM: transfer_setup_failed)


class TransportFault(RuntimeError):
    """A failure injected by the fake transport (or a misuse it detected)."""


AGENT_PREFIX = b"agent:"


@dataclass
class _Xfer:
    handle: int
    req_id: str
    outcome: Outcome
    released: bool = False


@dataclass
class _Calls:
    handshakes: list[tuple[str, int]] = field(default_factory=list)  # (engine, thread ident)
    release_attempts: dict[str, int] = field(default_factory=dict)
    misuse: list[str] = field(default_factory=list)


class FakeTransport:
    """NIXL agent stand-in with the faults of vLLM's `FailingNixlWrapper`.

    Global flags mirror `FailingNixlWrapper` (`fail_handshake`, `fail_transfer_setup`,
    `fail_transfer_state`, `fail_transfer_exception`, `fail_send_notif`) plus `fail_release`.
    Per-target scripts allow mixes: `fail_handshake_for(engine)`, `script(req, outcomes...)`
    (one per read attempt, in order; unscripted attempts are DONE), `fail_releases(req, n)`,
    and `resolve(req, outcome)` for HOLD transfers (sticky: later HOLD reads adopt it).

    A read is attributed to its request through `notif_msg`, which NIXL READs carry as
    b"<request id>:<consumers>". The handshake fault fires in whatever thread calls
    `add_remote_agent`, i.e. the worker's background handshake thread. Thread-safe.
    """

    def __init__(self, *, handshake_delay: float = 0.0) -> None:
        self.handshake_delay = handshake_delay
        self.fail_handshake = False
        self.fail_transfer_setup = False
        self.fail_transfer_state = False
        self.fail_transfer_exception = False
        self.fail_send_notif = False
        self.fail_release = False
        self._lock = threading.Lock()
        self._failing_engines: set[str] = set()
        self._scripts: dict[str, list[Outcome]] = {}
        self._attempts: dict[str, int] = {}
        self._release_failures: dict[str, int] = {}
        self._resolved: dict[str, Outcome] = {}
        self._xfers: dict[int, _Xfer] = {}
        self._ids = itertools.count(1)
        self._calls = _Calls()

    # -- scripting (harness side) --------------------------------------------------------------

    def fail_handshake_for(self, *engines: str) -> None:
        with self._lock:
            self._failing_engines.update(engines)

    def script(self, req_id: str, *outcomes: Outcome) -> None:
        with self._lock:
            self._scripts[req_id] = list(outcomes)

    def fail_releases(self, req_id: str, times: int) -> None:
        with self._lock:
            self._release_failures[req_id] = times

    def resolve(self, req_id: str, outcome: Outcome) -> None:
        """Decide the request's HOLD transfers (now and later ones) as DONE, ERR or RAISE."""
        if outcome in (Outcome.HOLD, Outcome.SETUP_FAIL):
            raise ValueError(f"cannot resolve a transfer as {outcome.value}")
        with self._lock:
            self._resolved[req_id] = outcome
            for x in self._xfers.values():
                if x.req_id == req_id and x.outcome is Outcome.HOLD:
                    x.outcome = outcome

    def heal(self) -> None:
        """Clear every fault (before shutdown, so teardown releases cleanly)."""
        with self._lock:
            self.fail_handshake = self.fail_transfer_setup = self.fail_release = False
            self.fail_transfer_state = self.fail_transfer_exception = False
            self.fail_send_notif = False
            self._failing_engines.clear()
            self._release_failures.clear()
            for x in self._xfers.values():
                if x.outcome is Outcome.HOLD:
                    x.outcome = Outcome.DONE

    # -- observation (harness side) ------------------------------------------------------------

    def outstanding(self, req_id: str | None = None) -> list[int]:
        """Handles created and not yet released (for one request, or all)."""
        with self._lock:
            return [x.handle for x in self._xfers.values()
                    if not x.released and (req_id is None or x.req_id == req_id)]

    def handles_of(self, req_id: str) -> list[int]:
        with self._lock:
            return [x.handle for x in self._xfers.values() if x.req_id == req_id]

    def handshake_threads(self, engine: str) -> list[int]:
        """Thread idents that called add_remote_agent for `engine`."""
        with self._lock:
            return [ident for eng, ident in self._calls.handshakes if eng == engine]

    def release_attempts(self, req_id: str) -> int:
        with self._lock:
            return self._calls.release_attempts.get(req_id, 0)

    def misuse(self) -> list[str]:
        """Protocol misuse seen (double release, use after release, unknown handle)."""
        with self._lock:
            return list(self._calls.misuse)

    # -- the NIXL-agent surface (worker side) ---------------------------------------------------

    def fetch_remote_metadata(self, engine_id: str) -> bytes:
        """The handshake's metadata round trip (vLLM: ZMQ GET_META), after `handshake_delay`."""
        if self.handshake_delay > 0:
            time.sleep(self.handshake_delay)
        return AGENT_PREFIX + engine_id.encode()

    def add_remote_agent(self, agent_metadata: bytes) -> str:
        engine = agent_metadata.removeprefix(AGENT_PREFIX).decode(errors="replace")
        with self._lock:
            self._calls.handshakes.append((engine, threading.get_ident()))
            failing = self.fail_handshake or engine in self._failing_engines
        if failing:  # FailingNixlWrapper raises zmq's timeout here
            raise zmq.Again(zmq.EAGAIN, "corewire: simulated handshake timeout")
        return f"remote-agent:{engine}"

    def remove_remote_agent(self, agent_name: str) -> None:
        return None

    def make_prepped_xfer(self, xfer_type: str, local_xfer_side_handle: int,
                          local_block_descs_ids: object, remote_xfer_side_handle: int,
                          remote_block_descs_ids: object, notif_msg: bytes | None = None,
                          **_: object) -> int:
        req_id = _request_of(notif_msg)
        with self._lock:
            attempt = self._attempts.get(req_id, 0)
            self._attempts[req_id] = attempt + 1
            plan = self._scripts.get(req_id, [])
            outcome = plan[attempt] if attempt < len(plan) else Outcome.DONE
            if self.fail_transfer_setup or outcome is Outcome.SETUP_FAIL:
                raise TransportFault("BAD STATUS (corewire: simulated transfer setup failure)")
            if outcome is Outcome.HOLD and req_id in self._resolved:
                outcome = self._resolved[req_id]
            handle = next(self._ids)
            self._xfers[handle] = _Xfer(handle, req_id, outcome)
            return handle

    def transfer(self, handle: int, *_: object, **__: object) -> str:
        with self._lock:
            self._known(handle, "transfer")
        return "PROC"

    def check_xfer_state(self, handle: int) -> str:
        with self._lock:
            x = self._known(handle, "check_xfer_state")
            if self.fail_transfer_exception or x.outcome is Outcome.RAISE:
                raise TransportFault("corewire: simulated check_xfer_state exception")
            if self.fail_transfer_state or x.outcome is Outcome.ERR:
                return "ERR"
            return "PROC" if x.outcome is Outcome.HOLD else "DONE"

    def release_xfer_handle(self, handle: int) -> None:
        with self._lock:
            x = self._known(handle, "release_xfer_handle")
            attempts = self._calls.release_attempts
            attempts[x.req_id] = attempts.get(x.req_id, 0) + 1
            left = self._release_failures.get(x.req_id, 0)
            if self.fail_release or left > 0:
                self._release_failures[x.req_id] = max(left - 1, 0)
                raise TransportFault("corewire: simulated release failure")
            x.released = True

    def get_xfer_telemetry(self, handle: int) -> None:
        return None

    def send_notif(self, agent_name: str, notif_msg: bytes) -> None:
        if self.fail_send_notif:
            raise TransportFault("corewire: simulated send_notif failure")

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        return {}

    def _known(self, handle: int, op: str) -> _Xfer:
        x = self._xfers.get(handle)
        if x is None:
            self._calls.misuse.append(f"{op} on unknown handle {handle}")
            raise TransportFault(f"unknown handle {handle}")
        if x.released:
            self._calls.misuse.append(f"{op} on released handle {handle} ({x.req_id})")
            raise TransportFault(f"handle {handle} already released")
        return x


def _request_of(notif_msg: bytes | None) -> str:
    if not notif_msg:
        return ""
    return notif_msg.decode(errors="replace").rsplit(":", 1)[0]


def notif_for(req_id: str, consumers: int = 1) -> bytes:
    """The READ notification a worker tags each read with (how the transport attributes it)."""
    return f"{req_id}:{consumers}".encode()


__all__ = ["AGENT_PREFIX", "FakeTransport", "Outcome", "TransportFault", "notif_for"]
