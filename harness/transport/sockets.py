"""Socket construction with the options vLLM 0.33.0 uses, so mocks behave like real peers."""

from __future__ import annotations

import zmq

_HWM_RECV = {zmq.PULL, zmq.DEALER, zmq.ROUTER}
_HWM_SEND = {zmq.PUSH, zmq.DEALER, zmq.ROUTER}


def make_socket(ctx: zmq.Context[zmq.Socket[bytes]], kind: int, *, identity: bytes | None = None,
                linger: int = 0) -> zmq.Socket[bytes]:
    """A socket with unlimited HWMs where vLLM sets them, and a short linger for clean exits."""
    sock = ctx.socket(kind)
    if kind in _HWM_RECV:
        sock.setsockopt(zmq.RCVHWM, 0)
    if kind in _HWM_SEND:
        sock.setsockopt(zmq.SNDHWM, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    if kind == zmq.XPUB:
        sock.setsockopt(zmq.XPUB_VERBOSE, 1)
    sock.setsockopt(zmq.LINGER, linger)
    return sock


def engine_identity(rank: int) -> bytes:
    """A DP rank as the 2-byte little-endian ZMQ identity engines use."""
    return rank.to_bytes(2, "little")
