"""The zmq context guard against pyzmq itself: it reads pyzmq's private `Context._sockets`
to see which sockets a context still has open. These tests pin that: a pyzmq release that
renames or drops it makes them fail here, instead of silently blinding the guard to leaked
shadow contexts (vLLM's asyncio client makes its sockets through one)."""

from __future__ import annotations

from pathlib import Path

import zmq
import zmq.asyncio

from harness.hygiene import zmq_guard


def test_pyzmq_still_tracks_a_contexts_open_sockets() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    try:
        assert sock in zmq_guard._open_sockets(ctx)
        sock.close(linger=0)
        assert zmq_guard._open_sockets(ctx) == []
    finally:
        sock.close(linger=0)
        ctx.term()


def test_a_shadow_context_left_with_an_open_socket_is_found_and_closed(tmp_path: Path) -> None:
    """A shadow owns nothing but its sockets: open sockets are the only sign it leaked."""
    since = zmq_guard.mark()
    owner: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    shadow = zmq.asyncio.Context.shadow(owner)
    sock = shadow.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, -1)
    sock.connect(f"ipc://{tmp_path}/nobody")
    try:
        notes, owners = zmq_guard.close_leaked(since, spare=[owner])
        assert sock.closed
        shadow_notes = [n for n in notes if n.startswith("shadow zmq context made at")]
        assert len(shadow_notes) == 1, notes
        assert "tests/test_zmq_guard.py" in shadow_notes[0], shadow_notes
        assert "1 open socket(s)" in shadow_notes[0], shadow_notes
        assert owners == []  # a shadow is never terminated: its owner is someone else's
    finally:
        sock.close(linger=0)
        owner.term()


def test_a_shadow_context_whose_sockets_are_closed_is_not_reported() -> None:
    since = zmq_guard.mark()
    owner: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    shadow = zmq.asyncio.Context.shadow(owner)
    shadow.socket(zmq.PUSH).close(linger=0)
    try:
        notes, owners = zmq_guard.close_leaked(since, spare=[owner])
        assert [n for n in notes if "shadow" in n] == [] and owners == []
    finally:
        owner.term()
