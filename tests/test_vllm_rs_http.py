"""The vllm-rs driver's HTTP client (aiohttp) and SSE reader against a scripted loopback
server: what goes on the wire, how a stream ends or breaks, and that nothing leaks."""

from __future__ import annotations

import asyncio
import gc
import json
import warnings
from collections.abc import Awaitable, Callable

import pytest

from harness.frontends.api import FrontendError, StreamHandle
from harness.frontends.vllm_rs import driver as vllm_rs
from harness.frontends.vllm_rs.driver import VllmRsDriver
from harness.frontends.vllm_rs.http import CONNECTION_ERRORS, RsHttpClient, describe
from harness.frontends.vllm_rs.stream import CompletionStream

Reply = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(tokens: list[int], finish: str | None = None) -> bytes:
    choice = {"text": " ".join(f"t{t}" for t in tokens), "token_ids": tokens,
              "finish_reason": finish}
    return b"data: " + json.dumps({"id": "cmpl-x", "choices": [choice]}).encode() + b"\n\n"


async def _serve(reply: Reply, seen: list[bytes]) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        seen.append(head + (await reader.readexactly(length) if length else b""))
        await reply(reader, writer)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _json_reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                 b"content-length: 2\r\n\r\n{}")
    await writer.drain()


def test_requests_go_out_as_built_and_never_through_a_proxy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # discard port: a proxy would fail
    seen: list[bytes] = []

    async def main() -> None:
        server, port = await _serve(_json_reply, seen)
        client = RsHttpClient(port)
        try:
            assert await client.call("GET", "/is_sleeping") == (200, b"{}")
            assert await client.call("POST", "/wake_up?tags=a+b&tags=%2Cx") == (200, b"{}")
            resp = await client.open("POST", "/v1/completions", {"prompt": [1, 2]},
                                     {"X-Request-Id": "r1"})
            assert (resp.status, await resp.read()) == (200, b"{}")
            resp.close()
        finally:
            await client.close()
            server.close()

    asyncio.run(main())
    get, bare_post, post = seen
    assert get.startswith(b"GET /is_sleeping HTTP/1.1\r\n")
    assert b"POST /wake_up?tags=a+b&tags=%2Cx HTTP/1.1\r\n" in bare_post
    assert b"Content-Type" not in get and b"Content-Type" not in bare_post
    for request in seen:
        assert b"Connection: close\r\n" in request and b"Accept-Encoding" not in request
    assert b"X-Request-Id: r1\r\n" in post and b"Content-Type: application/json\r\n" in post
    assert post.endswith(b'\r\n\r\n{"prompt": [1, 2]}')


def _read(reply: Reply, stream: bool = True) -> StreamHandle:
    """One completion read into a handle by CompletionStream."""
    handle = StreamHandle([1])

    async def main() -> None:
        server, port = await _serve(reply, [])
        client = RsHttpClient(port)
        try:
            entry = CompletionStream(handle, "cmpl-x")
            entry.response = await client.open("POST", "/v1/completions", {})
            await asyncio.wait_for(entry.read(stream), 10)
            assert entry.closed and "cmpl-x" in entry.issued
        finally:
            await client.close()
            server.close()

    asyncio.run(main())
    return handle


def test_sse_events_split_anywhere_still_parse() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = _event([100, 101]) + b": keep-alive\n\n" + _event([102], "length")
        writer.write(SSE_HEAD)
        for i in range(0, len(body), 7):  # lines cut across chunks and writes
            writer.write(_chunk(body[i:i + 7]))
            await writer.drain()
            await asyncio.sleep(0)
        writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    handle = _read(reply)
    assert (handle.tokens, handle.finish_reason, handle.error) == ([100, 101, 102], "length",
                                                                  None)
    assert handle.text == "t100 t101t102"


def test_a_truncated_stream_breaks_with_an_error() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + _chunk(_event([100])) + b"40\r\ndata: {")  # then EOF
        await writer.drain()

    handle = _read(reply)
    assert handle.tokens == [100] and handle.finish_reason == "error"
    assert handle.error is not None
    assert handle.error.startswith("stream broke before its final chunk: ")


def test_a_stream_ending_without_a_finish_is_an_error() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + _chunk(_event([100])) + b"0\r\n\r\n")
        await writer.drain()

    handle = _read(reply)
    assert (handle.finish_reason, handle.error) == ("error", "stream ended without a final chunk")


def test_a_refused_connection_is_a_connection_error_in_the_socket_s_words() -> None:
    async def main() -> str:
        server, port = await _serve(_json_reply, [])
        server.close()
        await server.wait_closed()
        client = RsHttpClient(port)
        try:
            await client.call("GET", "/is_sleeping")
        except CONNECTION_ERRORS as exc:
            return describe(exc)
        finally:
            await client.close()
        raise AssertionError("no connection error")

    assert "Connect call failed" in asyncio.run(main())


def test_more_streams_than_aiohttp_s_default_pool_open_at_once_and_nothing_leaks() -> None:
    """aiohttp allows 100 connections per session by default; cases hold 1,100 streams."""
    release = asyncio.Event()

    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD)
        await writer.drain()
        await release.wait()

    async def main() -> None:
        server, port = await _serve(reply, [])
        client = RsHttpClient(port)
        try:
            opened = await asyncio.wait_for(asyncio.gather(
                *[client.open("POST", "/v1/completions", {}) for _ in range(150)]), 20)
            assert all(resp.status == 200 for resp in opened)
            for resp in opened:
                resp.close()
        finally:
            release.set()
            await client.close()
            server.close()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(main())
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


def _silent_driver(port: int) -> VllmRsDriver:
    """A driver whose 'frontend' is a loopback server that never answers (nothing started)."""
    driver = VllmRsDriver()
    driver.process.port = port
    driver._http = RsHttpClient(port)
    return driver


def test_driver_bounds_every_wait_and_keeps_its_typed_errors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No response head: generate() ends the handle, a utility call is a FrontendError; a
    refused connection reads the same as with any client."""
    monkeypatch.setattr(vllm_rs, "HTTP_TIMEOUT", 0.2)
    monkeypatch.setattr(vllm_rs, "model_dir", lambda: "/model")
    hang = asyncio.Event()

    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await hang.wait()

    async def main() -> None:
        server, port = await _serve(reply, [])
        driver = _silent_driver(port)
        try:
            handle = await asyncio.wait_for(driver.generate([1], 4), 10)
            assert handle.finish_reason == "error" and handle.error is not None
            assert handle.error.startswith("connection to vllm-rs failed: no response head")
            with pytest.raises(FrontendError, match="GET /is_sleeping: connection failed"):
                await asyncio.wait_for(driver.is_sleeping(), 10)
        finally:
            hang.set()
            await driver.shutdown()
            server.close()
            await server.wait_closed()
        refused = _silent_driver(port)
        try:
            handle = await refused.generate([1], 4)
            assert handle.error is not None and "Connect call failed" in handle.error
            with pytest.raises(FrontendError, match="connection failed: .*Connect call failed"):
                await refused.is_sleeping()
        finally:
            await refused.shutdown()

    asyncio.run(main())


def test_drop_cuts_every_connection_and_ends_handles_as_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A dropped stream is its connection gone: the server reads EOF on every one."""
    monkeypatch.setattr(vllm_rs, "model_dir", lambda: "/model")
    eofs: list[bool] = []

    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + _chunk(_event([100])))
        await writer.drain()
        eofs.append(await asyncio.wait_for(reader.read(1), 10) == b"")

    async def main() -> None:
        server, port = await _serve(reply, [])
        driver = _silent_driver(port)
        try:
            handles = [await driver.generate([1], 50) for _ in range(5)]
            for handle in handles:
                await handle.wait_first(10)
            await driver.drop(handles)
            assert all(h.dropped and h.finish_reason == "abort" for h in handles)
            deadline = asyncio.get_running_loop().time() + 10
            while len(eofs) < 5 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
        finally:
            await driver.shutdown()
            server.close()

    asyncio.run(main())
    assert eofs == [True] * 5
