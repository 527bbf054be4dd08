"""Moved to `harness.frontends.subprocess.protocol`; this name stays for external imports."""

from harness.frontends.subprocess.protocol import (
    COMMANDS,
    EVENTS,
    MAX_LINE,
    PROTOCOL,
    DriverProtocolError,
    decode_line,
    encode_line,
)

__all__ = ["COMMANDS", "EVENTS", "MAX_LINE", "PROTOCOL", "DriverProtocolError", "decode_line",
           "encode_line"]
