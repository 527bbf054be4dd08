"""One completion of the vllm-rs driver: `POST /v1/completions` read into its StreamHandle.

Streamed, the answer is SSE: `data: {chunk}` lines whose `choices[0]` carry `token_ids`,
`text` and at the end `finish_reason`; an engine-side request error arrives as a
`data: {"error": {...}}` event. Not streamed, it is one JSON completion of the same shape.
A stream that breaks, or ends without a finish, ends its handle with an error, unless the
driver closed it on purpose (a drop, shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from harness.frontends.api import StreamHandle
from harness.frontends.vllm_rs.http import CONNECTION_ERRORS
from harness.protocol.vocab import SPECIAL

_TOKEN_WORD = re.compile(r"^t(\d+)$")
_WORD_IDS = {text: tid for tid, text in SPECIAL.items()}


def token_ids_from_text(text: str) -> list[int]:
    """Fallback when a chunk carries no token ids: the fixture vocabulary maps "tN" <-> N."""
    ids: list[int] = []
    for word in text.split():
        match = _TOKEN_WORD.match(word)
        if match:
            ids.append(int(match.group(1)))
        elif word in _WORD_IDS:
            ids.append(_WORD_IDS[word])
    return ids


@dataclass
class CompletionStream:
    """One completion: its handle, its HTTP response and the task reading it. `issued` is
    the driver's set of external ids, to which the ids the frontend reports are added."""

    handle: StreamHandle
    external_id: str
    issued: set[str] = field(default_factory=set)
    response: aiohttp.ClientResponse | None = None
    task: asyncio.Task[None] | None = None
    closed: bool = False

    def cut(self) -> None:
        """End the connection now, in this call: the FIN leaves at once and the transport is
        aborted (no flush). Dropping many streams cuts them all back to back, so the frontend
        sees them go at the same moment; closing through aiohttp alone would leave each
        socket's close to a later callback, spread out by the readers it wakes and by its
        connection_lost work."""
        connection = None if self.response is None else self.response.connection
        transport = None if connection is None else connection.transport
        if transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        transport.abort()

    def close(self) -> None:
        """Close the connection at once (for drops this is the client going away); once."""
        if self.response is not None and not self.closed:
            self.closed = True
            self.cut()
            self.response.close()

    async def read(self, stream: bool) -> None:
        """Fill the handle from the SSE events (or the one JSON body when not streaming)."""
        handle, resp = self.handle, self.response
        assert resp is not None
        try:
            if resp.status != 200:
                text = (await resp.read()).decode("utf-8", "replace")
                handle.finish("error", f"HTTP {resp.status}: {text[:500]}")
                return
            if not stream:
                self._apply(json.loads(await resp.read()))
            else:
                buf = b""
                async for part in resp.content.iter_any():
                    buf += part
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        self._sse_line(line.rstrip(b"\r"))
                        if handle.ended:
                            return
            if not handle.ended:
                handle.finish("error", "stream ended without a final chunk")
        except asyncio.CancelledError:
            raise
        except (*CONNECTION_ERRORS, ValueError) as exc:
            if not self.closed:
                handle.finish("error", f"stream broke before its final chunk: "
                                       f"{type(exc).__name__}: {exc}")
        finally:
            self.close()

    def _sse_line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return  # blank separators, comments, keep-alives
        data = line[5:].strip()
        if data == b"[DONE]":
            if not self.handle.ended:
                self.handle.finish("error", "[DONE] without a finish_reason")
            return
        self._apply(json.loads(data))

    def _apply(self, event: Any) -> None:
        """One completion chunk (or a whole non-streamed completion) into the handle."""
        handle = self.handle
        if not isinstance(event, dict):
            handle.finish("error", f"unexpected event {event!r:.200}")
            return
        if "error" in event:
            err = event["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            handle.finish("error", str(message))
            return
        if isinstance(event.get("id"), str):
            self.issued.add(event["id"])
        for choice in event.get("choices") or []:
            text = choice.get("text") or ""
            ids = choice.get("token_ids")
            tokens = list(ids) if isinstance(ids, list) else token_ids_from_text(text)
            if tokens or text:
                handle.add_tokens(tokens, text)
            reason = choice.get("finish_reason")
            if reason is not None:
                handle.finish(str(reason))


__all__ = ["CompletionStream", "token_ids_from_text"]
