"""The one error type the wire layer raises.

Anything malformed that crosses the link -- from a frontend under test or from an engine --
becomes a `ProtocolError` carrying the offending frames, so callers can record it in a
transcript and keep serving instead of crashing.
"""

from __future__ import annotations

from collections.abc import Sequence


class ProtocolError(Exception):
    """A frame sequence that does not follow the protocol profile.

    `kind` is a short stable tag (for grouping and tests); `frames` are the raw frames as
    received, kept so reports can show them in hex.
    """

    def __init__(
        self, kind: str, detail: str,
        frames: Sequence[bytes | bytearray | memoryview] = ()
    ) -> None:
        self.kind = kind
        self.detail = detail
        self.frames: tuple[bytes, ...] = tuple(bytes(f) for f in frames)
        super().__init__(f"{kind}: {detail}")

    def frames_hex(self, limit: int = 256) -> list[str]:
        """Frames as hex strings, each cut to `limit` bytes, for reports."""
        out = []
        for frame in self.frames:
            text = frame[:limit].hex()
            out.append(text + ("..." if len(frame) > limit else ""))
        return out
