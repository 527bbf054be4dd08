"""The subprocess driver protocol, shared by both ends: JSON lines over stdin/stdout.

Specified in docs/driver-protocol.md (with a JSON schema in docs/driver-protocol.schema.json).
The harness writes one command per line to the driver's stdin; the driver writes replies
(matched by `id`) and stream events to stdout, one JSON object per line, and logs only to
stderr. `PROTOCOL` names the protocol and never changes (first-release programs compare it);
`VERSION` is the newest version corewire speaks, negotiated in `init` (`version`).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from harness.artefacts.vllm_dist import VllmArtifactError, tiny_model_dir
from harness.frontends.api import DriverFault
from harness.protocol.vocab import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    MAX_POSITION_EMBEDDINGS,
    SPECIAL,
    TEXT_TEMPLATE,
    VOCAB_SIZE,
)

PROTOCOL = "corewire-driver/1"
# 1: the first release. 2: `init` carries `model` (the facts a correct ADD needs) and
# `generate` / `open_session` carry `sampling` (Capability.SAMPLING).
VERSION = 2
MAX_LINE = 1 << 20  # a line longer than this is a protocol violation

COMMANDS = ("init", "wait_ready", "generate", "open_session", "continue_session",
            "close_session", "drop", "abort", "is_sleeping", "reset_prefix_cache", "utility",
            "cancel", "observed_config", "shutdown")
EVENTS = ("output", "finished")


class DriverProtocolError(DriverFault):
    """The driver program broke the protocol (bad JSON, unknown reply id, stray text)."""


def answered_version(reply: dict[str, Any], offered: int = VERSION) -> int:
    """The version a program speaks, from its reply to `init`: no `version` key is a
    program of the first release (1); anything but an integer from 1 to `offered` breaks
    the protocol."""
    if "version" not in reply:
        return 1
    version = reply["version"]
    if type(version) is not int or not 1 <= version <= offered:
        raise DriverProtocolError(f"init reply: `version` must be an integer from 1 to "
                                  f"{offered} (the version offered), got {version!r}")
    return version


def model_facts() -> dict[str, Any]:
    """What a version-2 program is told about the model behind the mock engines (init's
    `model`): what an honest port needs to build a correct ADD and to render text without a
    tokenizer. The numbers are fixtures/tiny-model's (tests/test_driver_protocol_v2.py
    checks they agree with its config). `path` is left out where the fixture is absent."""
    facts: dict[str, Any] = {
        "eos_token_id": EOS_TOKEN_ID,
        "bos_token_id": BOS_TOKEN_ID,
        "special_token_ids": sorted(SPECIAL),
        "vocab_size": VOCAB_SIZE,
        # The model's own context length; the engines' ready responses may serve less, and
        # their minimum is the limit a frontend reports (handshake.ready.*).
        "max_model_len": MAX_POSITION_EMBEDDINGS,
        "token_text": TEXT_TEMPLATE,
    }
    with contextlib.suppress(VllmArtifactError):  # config.json and tokenizer.json, for a
        facts["path"] = str(tiny_model_dir())  # port that loads a real tokenizer
    return facts


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
