"""The handshake port the harness hands a frontend is held until the frontend binds it.

The race it closes (the vllm-py handshake TIMEOUT flake): the drivers used to pick a port
that was free a moment ago (bind to 0, close) and tell both the frontend (which binds it
later) and the mock engines (which start connecting at once). Any port-0 bind in between,
in any process (another xdist worker's frontend or its DP coordinator), may be handed the
same port; the engines' HELLO then goes to that stranger, and the stranger's own engines,
sharing identities 0, 1 with ours, are refused by its ROUTER: a HELLO with no INIT.
"""

from __future__ import annotations

import socket

import pytest
import zmq

from harness.protocol.transport.endpoints import ReservedTcpPort

HOST = "127.0.0.1"


def _port_zero_binds(count: int) -> set[int]:
    ports = set()
    for _ in range(count):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            ports.add(int(sock.getsockname()[1]))
    return ports


def test_a_freed_port_goes_to_a_stranger_and_the_engines_hello_with_it() -> None:
    """What the old `free_tcp_port` allowed: the port is free again the moment it is
    returned, a stranger that binds it first receives the engine's HELLO, and the frontend
    that was promised the port cannot have it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port = int(probe.getsockname()[1])
    ctx = zmq.Context()
    try:
        stranger = ctx.socket(zmq.ROUTER)
        stranger.bind(f"tcp://{HOST}:{port}")  # what a port-0 bind may be handed meanwhile
        engine = ctx.socket(zmq.DEALER)
        engine.setsockopt(zmq.IDENTITY, b"\x00\x00")
        engine.connect(f"tcp://{HOST}:{port}")
        engine.send(b"HELLO")
        assert stranger.poll(5000) and stranger.recv_multipart() == [b"\x00\x00", b"HELLO"]
        owner = ctx.socket(zmq.ROUTER)
        with pytest.raises(zmq.ZMQError):
            owner.bind(f"tcp://{HOST}:{port}")
    finally:
        ctx.destroy(linger=0)


def test_a_reserved_port_is_handed_to_no_port_zero_bind() -> None:
    with ReservedTcpPort(HOST) as reserved:
        assert reserved.port in ReservedTcpPort.live
        assert reserved.port not in _port_zero_binds(3000)
        ctx = zmq.Context()
        try:
            for _ in range(300):  # ZMQ's own port-0 binds set SO_REUSEADDR, as vLLM's do
                sock = ctx.socket(zmq.PULL)
                sock.bind(f"tcp://{HOST}:0")
                assert not sock.last_endpoint.decode().endswith(f":{reserved.port}")
                sock.close(linger=0)
        finally:
            ctx.destroy(linger=0)
    assert reserved.port not in ReservedTcpPort.live


def test_the_owner_binds_a_reserved_port_and_gets_the_hello_sent_before_it_listened() -> None:
    """The engines connect at once and retry; the frontend (ZMQ, SO_REUSEADDR) binds the
    held port later and receives what they queued."""
    reserved = ReservedTcpPort(HOST)
    ctx = zmq.Context()
    try:
        engine = ctx.socket(zmq.DEALER)
        engine.setsockopt(zmq.IDENTITY, b"\x01\x00")
        engine.setsockopt(zmq.RECONNECT_IVL, 20)
        engine.connect(f"tcp://{HOST}:{reserved.port}")
        engine.send(b"HELLO")
        owner = ctx.socket(zmq.ROUTER)
        owner.bind(f"tcp://{HOST}:{reserved.port}")
        assert owner.poll(5000) and owner.recv_multipart() == [b"\x01\x00", b"HELLO"]
    finally:
        reserved.release()
        reserved.release()  # idempotent
        ctx.destroy(linger=0)
