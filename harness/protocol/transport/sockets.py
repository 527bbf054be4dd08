"""Socket construction with the options vLLM 0.33.0 uses, so mocks behave like real peers."""

from __future__ import annotations

from collections.abc import Iterator

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


def identity_rank(identity: bytes) -> int:
    """The DP rank an engine's ZMQ identity names (the inverse of `engine_identity`)."""
    return int.from_bytes(identity, "little")


def drain(sock: zmq.Socket[bytes], limit: int) -> Iterator[list[bytes]]:
    """The messages waiting on `sock`, at most `limit` (never blocks): a socket thread reads
    a bounded batch per wake, so one busy peer cannot starve its other sockets."""
    for _ in range(limit):
        try:
            yield sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
