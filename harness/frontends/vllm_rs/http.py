"""The vllm-rs driver's HTTP client, on aiohttp: one `ClientSession` per started frontend.

The session is set up to behave like the plain client a conformance check needs:

* loopback only, never a proxy or credentials from the environment (`trust_env=False`);
* one connection per request (`force_close`, `Connection: close`): a dropped stream is its
  connection closed, and no pooled connection goes stale against vllm-rs's keep-alive;
* no connection limit: cases and the bench hold a thousand streams open at once;
* requests and bodies exactly as the driver builds them (JSON bodies, the path's query
  as encoded; no `Accept-Encoding`, no decompression), so SSE events arrive as the frontend
  flushes them;
* no aiohttp timeouts: callers bound each wait themselves (`asyncio.wait_for`, scaled), so
  a timeout means the same thing for every call.

Connection failures keep one vocabulary (`CONNECTION_ERRORS`, described by `describe`).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from yarl import URL

from harness.frontends.api import FrontendError

MAX_HEADER_BYTES = 64 * 1024  # the longest response header line or field we accept
HOST = "127.0.0.1"

# What a refused, reset or truncated exchange raises (aiohttp's, and the socket's own).
CONNECTION_ERRORS = (OSError, aiohttp.ClientError)


class HttpError(FrontendError):
    """A non-2xx answer from the frontend (status and body kept for the verdict)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


def describe(exc: BaseException) -> str:
    """A connection failure in the socket's own words (a refused connect is its OSError)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return str(exc.os_error)
    return str(exc) or type(exc).__name__


class RsHttpClient:
    """HTTP/1.1 to one vllm-rs port; `close()` (awaited) releases the session."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            headers={"Accept": "*/*", "Connection": "close"},
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
            auto_decompress=False,
            trust_env=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=None, sock_read=None,
                                          sock_connect=None),
            max_line_size=MAX_HEADER_BYTES,
            max_field_size=MAX_HEADER_BYTES,
        )

    def _url(self, path: str) -> URL:
        """`path` (query included) goes on the wire exactly as the driver built it."""
        return URL(f"http://{HOST}:{self.port}{path}", encoded=True)

    async def open(self, method: str, path: str, body: Any = None,
                   headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
        """Send one request and read the status line and headers; the body is the caller's
        to read and the response the caller's to close. A body is sent as JSON; a request
        without one carries no Content-Type (a route may read an optional JSON body)."""
        sent = dict(headers or {})
        data: bytes | None = None
        if body is not None:
            data = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        return await self._session.request(method, self._url(path), data=data, headers=sent)

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        """One non-streaming request: (status, whole body). Unbounded: callers bound it."""
        async with await self.open(method, path, body) as resp:
            return resp.status, await resp.read()

    async def close(self) -> None:
        await self._session.close()


__all__ = ["CONNECTION_ERRORS", "HOST", "HttpError", "MAX_HEADER_BYTES", "RsHttpClient",
           "describe"]
