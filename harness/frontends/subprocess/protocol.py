"""The subprocess driver protocol, shared by both ends: JSON lines over stdin/stdout.

Specified in docs/driver-protocol.md (with a JSON schema in docs/driver-protocol.schema.json).
The harness writes one command per line to the driver's stdin; the driver writes replies
(matched by `id`) and stream events to stdout, one JSON object per line, and logs only to
stderr. Version: PROTOCOL.
"""

from __future__ import annotations

import json
from typing import Any

from harness.frontends.driver import DriverFault

PROTOCOL = "corewire-driver/1"
MAX_LINE = 1 << 20  # a line longer than this is a protocol violation

COMMANDS = ("init", "wait_ready", "generate", "open_session", "continue_session",
            "close_session", "drop", "abort", "is_sleeping", "reset_prefix_cache", "utility",
            "cancel", "observed_config", "shutdown")
EVENTS = ("output", "finished")


class DriverProtocolError(DriverFault):
    """The driver program broke the protocol (bad JSON, unknown reply id, stray text)."""


def encode_line(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def decode_line(line: bytes) -> dict[str, Any]:
    """Parse one stdout line; anything but a JSON object is a DriverProtocolError."""
    if len(line) > MAX_LINE:
        raise DriverProtocolError(f"line of {len(line)} bytes exceeds {MAX_LINE}")
    try:
        message = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DriverProtocolError(f"not JSON: {line[:200]!r} ({exc})") from None
    if not isinstance(message, dict):
        raise DriverProtocolError(f"not a JSON object: {line[:200]!r}")
    if "id" not in message and message.get("event") not in EVENTS:
        raise DriverProtocolError(f"neither a reply (id) nor a known event: {line[:200]!r}")
    return message
