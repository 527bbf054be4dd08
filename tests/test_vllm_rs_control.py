"""The gRPC Control client of the vllm-rs driver, without vLLM: schema and error paths.

An in-process grpcio server stands in for vllm-rs (over a real loopback TCP socket); the
real binary is exercised in tests/vllm_lane/test_vllm_rs_smoke.py.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped,unused-ignore]
import pytest

from harness.frontends.api import FrontendError
from harness.frontends.vllm_rs.control import (
    CLASSES,
    METHODS,
    ControlClient,
    ControlError,
    file_descriptor,
)
from tests.timescale import TIMESCALE, scaled

PROTO = Path(__file__).resolve().parents[1] / "harness/frontends/vllm_rs/proto/control.proto"
_TYPES = {"string": 9, "uint64": 4, "bool": 8}  # FieldDescriptorProto.Type numbers
Handler = Callable[[Any, Any], Any]


def _parse_proto(text: str) -> tuple[dict[str, list[tuple[str, int, str, bool]]],
                                     dict[str, tuple[str, str]]]:
    """The proto3 subset control.proto uses: messages of scalar/message fields, one service."""
    text = re.sub(r"//[^\n]*", "", text)
    messages = {}
    for name, body in re.findall(r"message\s+(\w+)\s*\{([^}]*)\}", text):
        messages[name] = [(fname, int(num), ftype, bool(opt)) for opt, ftype, fname, num
                          in re.findall(r"(optional\s+)?(\w+)\s+(\w+)\s*=\s*(\d+)\s*;", body)]
    rpcs = {name: (req, resp) for name, req, resp in
            re.findall(r"rpc\s+(\w+)\s*\(\s*(\w+)\s*\)\s*returns\s*\(\s*(\w+)\s*\)", text)}
    return messages, rpcs


def test_proto_file_and_runtime_descriptor_agree() -> None:
    messages, rpcs = _parse_proto(PROTO.read_text())
    desc = file_descriptor()
    assert desc.package == "vllm" and rpcs == METHODS
    assert [m.name for m in desc.message_type] == list(messages)
    for msg in desc.message_type:
        got = [(f.name, f.number, f.type, f.proto3_optional) for f in msg.field]
        want = [(name, num, _TYPES.get(ftype, 11), opt)
                for name, num, ftype, opt in messages[msg.name]]
        assert got == want, msg.name
    assert [(m.name, m.input_type, m.output_type) for m in desc.service[0].method] == [
        (rpc, f".vllm.{req}", f".vllm.{resp}") for rpc, (req, resp) in rpcs.items()]


def test_server_info_wire_bytes_decode_as_observed_from_vllm_rs() -> None:
    """The exact GetServerInfo answer vllm-rs 0.33.0 gave for engines (1000, 900) x
    (100, 250 blocks) x block_size 32, undeclared fields included (kept as unknown)."""
    raw = bytes.fromhex("0a06302e33332e301204766c6c6d1a066d6f636b2d30220c080110011802280130013802"
                        "288407302038de024080024880105a006205302e362e307010")
    msg = CLASSES["ServerInfo"].FromString(raw)
    assert (msg.version, msg.server_name, msg.model) == ("0.33.0", "vllm", "mock-0")
    assert (msg.max_model_len, msg.kv_block_size, msg.total_kv_blocks) == (900, 32, 350)
    assert msg.SerializeToString() == raw  # unknown fields 8, 9, 11, 12, 14 survive


@pytest.fixture()
def serve() -> Iterator[Callable[[dict[str, Handler]], ControlClient]]:
    """Start a fake Control server with the given handlers; the client points at it."""
    servers: list[Any] = []
    clients: list[ControlClient] = []

    def start(handlers: dict[str, Handler], timeout: float = 5.0) -> ControlClient:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        table = {}
        for method, fn in handlers.items():
            request, response = METHODS[method]
            table[method] = grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=CLASSES[request].FromString,
                response_serializer=lambda m: m if isinstance(m, bytes) else
                m.SerializeToString())
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "vllm.Control", table),))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        client = ControlClient(port, timeout=timeout, timescale=TIMESCALE)
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.close()
    for server in servers:
        server.stop(None).wait(5)


def test_server_info_fields_and_absent_ones(serve: Any) -> None:
    full = serve({"GetServerInfo": lambda req, ctx: CLASSES["ServerInfo"](
        version="0.33.0", max_model_len=900, kv_block_size=32, total_kv_blocks=350)})
    info = asyncio.run(full.server_info())
    assert (info.max_model_len, info.kv_block_size, info.total_kv_blocks) == (900, 32, 350)
    bare = serve({"GetServerInfo": lambda req, ctx: CLASSES["ServerInfo"](version="x")})
    info = asyncio.run(bare.server_info())
    assert (info.max_model_len, info.kv_block_size, info.total_kv_blocks) == (None,) * 3
    zero = serve({"GetServerInfo": lambda req, ctx: CLASSES["ServerInfo"](kv_block_size=0)})
    assert asyncio.run(zero.server_info()).kv_block_size == 0  # stated, not absent


def test_utilities_and_status_errors(serve: Any) -> None:
    def inconsistent(req: Any, ctx: Any) -> Any:
        ctx.abort(grpc.StatusCode.INTERNAL, "returned inconsistent results across engines")

    client = serve({"IsSleeping": lambda req, ctx: CLASSES["IsSleepingResponse"](),
                    "GetWeightVersion": inconsistent})
    assert asyncio.run(client.is_sleeping()) is False  # proto3: an empty answer is false
    with pytest.raises(ControlError, match="INTERNAL: returned inconsistent") as err:
        asyncio.run(client.weight_version())
    assert isinstance(err.value, FrontendError)
    assert (err.value.method, err.value.code) == ("GetWeightVersion", "INTERNAL")
    with pytest.raises(ControlError, match="UNIMPLEMENTED"):
        asyncio.run(client.server_info())  # this fake serves no GetServerInfo


def test_undecodable_answer_is_a_typed_error(serve: Any) -> None:
    client = serve({"GetServerInfo": lambda req, ctx: b"\xff\xff\xff"})
    with pytest.raises(ControlError, match="GetServerInfo"):
        asyncio.run(client.server_info())


def test_calls_are_bounded(serve: Any) -> None:
    release = threading.Event()

    def stall(req: Any, ctx: Any) -> Any:
        release.wait(scaled(5.0))
        return CLASSES["IsSleepingResponse"]()

    client = serve({"IsSleeping": stall}, timeout=0.3)  # scaled by the client
    began = time.monotonic()
    try:
        with pytest.raises(ControlError, match="DEADLINE_EXCEEDED"):
            asyncio.run(client.is_sleeping())
        assert time.monotonic() - began < scaled(2.0)
    finally:
        release.set()


def test_nothing_listening_is_unavailable() -> None:
    import socket

    with socket.socket() as sock:  # a port that was free a moment ago
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = ControlClient(port, timeout=5.0)
    try:
        with pytest.raises(ControlError, match="UNAVAILABLE"):
            asyncio.run(client.server_info())
    finally:
        client.close()


def test_unknown_method_is_refused_before_any_call() -> None:
    client = ControlClient(1)
    with pytest.raises(ValueError, match="not a declared Control method"):
        asyncio.run(client.call("Abort"))
