"""The vllm-rs driver's HTTP/1.1 client: one connection per request (`Connection: close`),
chunked or sized bodies, no dependency; a dropped stream is simply its socket being closed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from harness.frontends.driver import FrontendError

MAX_HEADER_BYTES = 64 * 1024



class HttpError(FrontendError):
    """A non-2xx answer from the frontend (status and body kept for the verdict)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


@dataclass
class HttpResponse:
    status: int
    headers: dict[str, str]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    async def body_parts(self) -> AsyncIterator[bytes]:
        """The body as it arrives: de-chunked, or sized, or until EOF."""
        if self.chunked:
            while True:
                line = await self.reader.readline()
                if not line:
                    raise ConnectionError("connection closed inside a chunked body")
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    await self.reader.readline()  # the (empty) trailer section
                    return
                data = await self.reader.readexactly(size + 2)
                yield data[:-2]
        elif "content-length" in self.headers:
            remaining = int(self.headers["content-length"])
            while remaining > 0:
                data = await self.reader.read(min(remaining, 65536))
                if not data:
                    raise ConnectionError("connection closed inside a sized body")
                remaining -= len(data)
                yield data
        else:
            while data := await self.reader.read(65536):
                yield data

    async def read_body(self) -> bytes:
        return b"".join([part async for part in self.body_parts()])

    def close(self) -> None:
        """Close at once (no flush, no await): for drops this is the client going away."""
        self.writer.transport.abort()


async def http_request(port: int, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None) -> HttpResponse:
    """Send one request on a fresh connection and read the status line and headers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    try:
        payload = b"" if body is None else json.dumps(body).encode()
        lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}",
                 "Connection: close", "Accept: */*", f"Content-Length: {len(payload)}"]
        if body is not None:
            lines.append("Content-Type: application/json")
        lines.extend(f"{k}: {v}" for k, v in (headers or {}).items())
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > MAX_HEADER_BYTES:
            raise ConnectionError("response header too large")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise ConnectionError(f"bad status line {status_line!r}")
        parsed: dict[str, str] = {}
        for line in header_lines:
            if ":" in line:
                key, value = line.split(":", 1)
                parsed[key.strip().lower()] = value.strip()
        return HttpResponse(int(parts[1]), parsed, reader, writer)
    except BaseException:
        writer.transport.abort()
        raise


__all__ = ["HttpError", "MAX_HEADER_BYTES", "HttpResponse", "http_request"]
