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
        message = json.loads(line, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError: JSONDecodeError, an integer over the digit limit, NaN / Infinity;
        # RecursionError: nesting deeper than the decoder's stack.
        raise DriverProtocolError(f"not JSON: {line[:200]!r} "
                                  f"({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(message, dict):
        raise DriverProtocolError(f"not a JSON object: {line[:200]!r}")
    if "id" in message:
        if type(message["id"]) is not int:
            raise DriverProtocolError(f"a reply id must be an integer: {line[:200]!r}")
    elif message.get("event") not in EVENTS:
        raise DriverProtocolError(f"neither a reply (id) nor a known event: {line[:200]!r}")
    else:
        problem = _event_problem(message)
        if problem:
            raise DriverProtocolError(f"{problem}: {line[:200]!r}")
    return message


def _no_constant(name: str) -> Any:
    """NaN and Infinity are not JSON (RFC 8259); Python's decoder would take them."""
    raise ValueError(f"{name} is not a JSON value")


def _event_problem(message: dict[str, Any]) -> str | None:
    """What is wrong with the shape of a stream event (docs/driver-protocol.schema.json)."""
    if not isinstance(message.get("stream"), (str, int)) or isinstance(message["stream"], bool):
        return "an event's `stream` must be a string or an integer"
    if message["event"] == "output":
        tokens = message.get("tokens", [])
        if not isinstance(tokens, list) or any(type(t) is not int for t in tokens):
            return "an output event's `tokens` must be a list of integers"
        if not isinstance(message.get("text", ""), str):
            return "an output event's `text` must be a string"
        return None
    for key in ("finish_reason", "error"):
        if message.get(key) is not None and not isinstance(message[key], str):
            return f"a finished event's `{key}` must be a string or null"
    return None
