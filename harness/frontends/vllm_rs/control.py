"""Client of vllm-rs's gRPC Control service: what the frontend derived from the ready responses.

vLLM 0.33.0's `vllm-rs frontend` serves a gRPC Control service on a listener handed over with
`--grpc-listen-fd` (vLLM's own supervisor passes a TCP socket, `v1/utils.py:327-331`). Its
HTTP surface exposes neither block_size nor num_gpu_blocks; `GetServerInfo` does
(`ServerInfo` fields 6 and 7), so the driver reads them here.

The messages are built at run time from a hand-written descriptor (the protobuf runtime, no
protoc step): `proto/control.proto` is the same schema as text, with what was verified against
the 0.33.0 binary; tests/test_vllm_rs_control.py checks the two agree.

Calls use grpcio's blocking API in a worker thread: a channel is then not tied to one asyncio
event loop (each test runs its own), and every call carries a deadline.

What the rest of the Control service gives beyond HTTP (tried against 0.33.0 with mock
engines):

* `IsSleeping`: the same fan-out and consensus as `GET /is_sleeping` (disagreement is gRPC
  INTERNAL "returned inconsistent results across engines: [true, false]"). Nothing new.
* `GetWeightVersion`: a `get_weight_version` utility call to every engine, consensus result
  (INTERNAL "inconsistent results" when engines differ). HTTP has no route that returns the
  engines' answer, so this is a typed surface for utility-aggregation cases of that method.
* `Abort` (`AbortRequest.request_ids = 1`): takes the external ids (`cmpl-X`) like
  `POST /abort_requests`; an engine-facing id (`cmpl-X-<8 hex>`) and unknown ids abort
  nothing. One difference: an empty list aborts nothing here, while an empty list over HTTP
  aborts every request the frontend tracks (two live requests stayed live).
* `UpdateWeightVersion` (`weight_version = 1`): a `set_weight_version` utility call with
  args `[version]` to every engine, an empty response; one engine failing it fails the call.
* `PauseGeneration`: sends utility `pause_generation` with args `["abort", true]` to the
  engines (an empty request and one with field 1 = true sent the same args). HTTP `/pause`
  exists too; not used by any case yet.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any, TypeVar

# No stubs are installed for grpcio or protobuf (both typed as Any here).
import grpc  # type: ignore[import-untyped,unused-ignore]
from google.protobuf import (  # type: ignore[import-untyped,unused-ignore]
    descriptor_pb2,
    descriptor_pool,
    message_factory,
)
from google.protobuf.message import (  # type: ignore[import-untyped,unused-ignore]
    DecodeError,
    Message,
)

from harness.frontends.api import FrontendError
from harness.protocol.timing import DEFAULT, Timescale

CONTROL_TIMEOUT = 60.0  # per call, before scaling: longer than any case bound, so a frontend
# that hangs shows up as the case's TIMEOUT rather than as a driver-made error
SERVICE = "vllm.Control"
PROTO_FILE = "corewire/vllm_rs_control.proto"

_F = descriptor_pb2.FieldDescriptorProto
# (field name, number, type, proto3 `optional`) per message, in proto/control.proto's order.
FieldSpec = tuple[str, int, int, bool]
MESSAGES: dict[str, list[FieldSpec]] = {
    "GetServerInfoRequest": [],
    "ParallelismInfo": [],
    "ServerInfo": [
        ("version", 1, _F.TYPE_STRING, True),
        ("server_name", 2, _F.TYPE_STRING, True),
        ("model", 3, _F.TYPE_STRING, True),
        ("parallelism", 4, _F.TYPE_MESSAGE, False),
        ("max_model_len", 5, _F.TYPE_UINT64, True),
        ("kv_block_size", 6, _F.TYPE_UINT64, True),
        ("total_kv_blocks", 7, _F.TYPE_UINT64, True),
    ],
    "IsSleepingRequest": [],
    "IsSleepingResponse": [("is_sleeping", 1, _F.TYPE_BOOL, False)],
    "GetWeightVersionRequest": [],
    "GetWeightVersionResponse": [("weight_version", 1, _F.TYPE_STRING, False)],
    "UpdateWeightVersionRequest": [("weight_version", 1, _F.TYPE_STRING, False)],
    "UpdateWeightVersionResponse": [],
}
MESSAGE_FIELDS = {"parallelism": "ParallelismInfo"}  # message-typed fields -> their type
METHODS: dict[str, tuple[str, str]] = {  # rpc -> (request, response)
    "GetServerInfo": ("GetServerInfoRequest", "ServerInfo"),
    "IsSleeping": ("IsSleepingRequest", "IsSleepingResponse"),
    "GetWeightVersion": ("GetWeightVersionRequest", "GetWeightVersionResponse"),
    "UpdateWeightVersion": ("UpdateWeightVersionRequest", "UpdateWeightVersionResponse"),
}


def file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """The schema of proto/control.proto as a descriptor (proto3 optional = synthetic oneof)."""
    proto = descriptor_pb2.FileDescriptorProto(name=PROTO_FILE, package="vllm", syntax="proto3")
    for name, fields in MESSAGES.items():
        msg = proto.message_type.add(name=name)
        for field_name, number, kind, optional in fields:
            field = msg.field.add(name=field_name, number=number, type=kind,
                                  label=_F.LABEL_OPTIONAL, json_name=_camel(field_name))
            if kind == _F.TYPE_MESSAGE:
                field.type_name = f".vllm.{MESSAGE_FIELDS[field_name]}"
            if optional:
                field.proto3_optional = True
                field.oneof_index = len(msg.oneof_decl)
                msg.oneof_decl.add(name=f"_{field_name}")
    service = proto.service.add(name="Control")
    for rpc, (request, response) in METHODS.items():
        service.method.add(name=rpc, input_type=f".vllm.{request}",
                           output_type=f".vllm.{response}")
    return proto


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _message_classes() -> dict[str, type[Message]]:
    """One private pool: never clashes with protos another library registers as `vllm.*`."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_descriptor())
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"vllm.{name}"))
            for name in MESSAGES}


CLASSES = _message_classes()


class ControlError(FrontendError):
    """A Control call failed: the gRPC status (code name and details) says why."""

    def __init__(self, method: str, code: str, details: str) -> None:
        super().__init__(f"gRPC {SERVICE}/{method}: {code}: {details}")
        self.method = method
        self.code = code
        self.details = details


@dataclass(frozen=True)
class ServerInfo:
    """The fields of `ServerInfo` that follow the engines' ready responses (None: absent)."""

    version: str | None
    model: str | None
    max_model_len: int | None  # min over the engines
    kv_block_size: int | None  # the engines' block_size
    total_kv_blocks: int | None  # sum of the engines' num_gpu_blocks


M = TypeVar("M", bound=Message)


def _present(msg: Message, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


class ControlClient:
    """Bounded calls to `vllm.Control` at 127.0.0.1:port (plain text, no proxy)."""

    def __init__(self, port: int, host: str = "127.0.0.1",
                 timeout: float = CONTROL_TIMEOUT, *, timescale: Timescale = DEFAULT) -> None:
        self.target = f"{host}:{port}"
        self.timeout = timeout
        self.timescale = timescale
        self._channel: grpc.Channel | None = None
        self._lock = threading.Lock()

    def _get_channel(self) -> grpc.Channel:
        with self._lock:
            if self._channel is None:
                # grpc honours http_proxy / https_proxy: a loopback call must never take one.
                self._channel = grpc.insecure_channel(
                    self.target, options=[("grpc.enable_http_proxy", 0)])
            return self._channel

    def _blocking_call(self, method: str, request: Message, response: type[M]) -> M:
        call = self._get_channel().unary_unary(
            f"/{SERVICE}/{method}", request_serializer=_serialize,
            response_deserializer=response.FromString)
        try:
            answer = call(request, timeout=self.timescale.scaled(self.timeout))
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise ControlError(method, code.name if code else "UNKNOWN",
                               details or "") from exc
        if not isinstance(answer, response):
            raise ControlError(method, "BAD_ANSWER", f"unexpected answer {answer!r:.200}")
        return answer

    async def call(self, method: str, **fields: Any) -> Message:
        """Call `method` with a request of these fields; the decoded response message."""
        if method not in METHODS:
            raise ValueError(f"{method!r} is not a declared Control method")
        request, response = METHODS[method]
        try:
            return await asyncio.to_thread(self._blocking_call, method,
                                           CLASSES[request](**fields), CLASSES[response])
        except DecodeError as exc:
            raise ControlError(method, "BAD_ANSWER", f"undecodable response: {exc}") from exc

    async def server_info(self) -> ServerInfo:
        msg = await self.call("GetServerInfo")
        return ServerInfo(version=_present(msg, "version"), model=_present(msg, "model"),
                          max_model_len=_present(msg, "max_model_len"),
                          kv_block_size=_present(msg, "kv_block_size"),
                          total_kv_blocks=_present(msg, "total_kv_blocks"))

    async def is_sleeping(self) -> bool:
        answer = await self.call("IsSleeping")
        return bool(answer.is_sleeping)

    async def weight_version(self) -> str:
        answer = await self.call("GetWeightVersion")
        return str(answer.weight_version)

    async def update_weight_version(self, version: str) -> None:
        """`set_weight_version` on every engine (the frontend's Control route for it)."""
        await self.call("UpdateWeightVersion", weight_version=version)

    def close(self) -> None:
        with self._lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()


def _serialize(request: Message) -> bytes:
    return bytes(request.SerializeToString())


__all__ = ["CLASSES", "ControlClient", "ControlError", "ServerInfo", "file_descriptor"]
