"""Pure codec: multipart frames <-> typed messages, for one protocol profile.

No sockets here. Encoders return the frame list to send; decoders take the frame list as
received and return a typed message or raise `ProtocolError` -- never anything else -- so
a malformed frame from a peer under test becomes a recorded finding, not a crash.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from harness.protocol.wire import messages as m
from harness.protocol.wire.errors import ProtocolError
from harness.protocol.wire.layout import ReleaseLayout
from harness.protocol.wire.profiles import VLLM_0_33, ProtocolProfile

Frame = bytes | bytearray | memoryview
Frames = Sequence[Frame]
T = TypeVar("T")
_Dec = msgspec.msgpack.Decoder


@dataclass(frozen=True)
class AddRequest:
    request: m.EngineCoreRequest


@dataclass(frozen=True)
class AbortRequests:
    request_ids: list[str]


@dataclass(frozen=True)
class EngineDead:
    """The ENGINE_CORE_DEAD sentinel frame."""


EngineInput = AddRequest | AbortRequests | m.UtilityRequest | m.StartDPWave
EngineOutput = m.EngineCoreOutputs | EngineDead


class WireCodec:
    """Encoders and decoders bound to one `ProtocolProfile`.

    The profile decides the bytes both ways: a profile whose layouts equal our structs
    encodes and decodes them directly; any other goes through its `ReleaseLayout`, so an
    engine speaking vllm-0.22.1 writes 13-element outputs and reads 20-element requests.

    Thread-safe: the only per-call state (aux frames of large arrays) lives in a
    thread-local, so engines running in threads may share one instance.
    """

    def __init__(self, profile: ProtocolProfile = VLLM_0_33) -> None:
        self.profile = profile
        self._local = threading.local()
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        hooks: dict[str, Any] = {"dec_hook": self._dec_hook, "ext_hook": self._ext_hook}
        self._release: ReleaseLayout | None = None
        request_t: type[Any] = profile.request_type
        outputs_t: type[Any] = profile.outputs_type
        ready_t: type[Any] = profile.ready_type
        if not profile.is_canonical:
            self._release = ReleaseLayout(profile)
            request_t = self._release.request_struct
            outputs_t = self._release.outputs_struct
            ready_t = self._release.ready_struct
        self._dec_request: _Dec[Any] = _Dec(request_t, **hooks)
        self._dec_outputs: _Dec[Any] = _Dec(outputs_t, **hooks)
        self._dec_ready: _Dec[Any] = _Dec(ready_t, **hooks)
        self._dec_abort: _Dec[list[str]] = _Dec(list[str], **hooks)
        self._dec_utility: _Dec[m.UtilityRequest] = _Dec(m.UtilityRequest, **hooks)
        self._dec_wave: _Dec[m.StartDPWave] = _Dec(m.StartDPWave, **hooks)
        self._dec_ready_hs: _Dec[m.HandshakeReady] = _Dec(m.HandshakeReady, **hooks)
        self._dec_init: _Dec[m.EngineHandshakeMetadata] = _Dec(m.EngineHandshakeMetadata,
                                                             **hooks)
        self._dec_stats: _Dec[m.DPStatsUpdate] = _Dec(m.DPStatsUpdate, **hooks)

    # ------------------------------------------------------------------ hooks

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, m.WireArray):
            shape = list(obj.shape)
            if len(obj.data) < self.profile.zero_copy_threshold:
                return [obj.dtype, shape, msgspec.msgpack.Ext(self.profile.raw_view_ext_code,
                                                              obj.data)]
            aux: list[bytes] = self._local.aux
            aux.append(obj.data)
            return [obj.dtype, shape, len(aux)]  # index 0 is the main frame
        raise NotImplementedError(f"cannot encode {type(obj).__name__} on the wire")

    def _dec_hook(self, typ: type, obj: Any) -> Any:
        if typ is m.WireArray:
            if not (isinstance(obj, list) and len(obj) == 3):
                raise ValueError("array must be [dtype, shape, data]")
            dtype, shape, data = obj
            if not isinstance(dtype, str) or not isinstance(shape, list):
                raise ValueError("array dtype must be str and shape a list")
            if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                       for d in shape):
                raise ValueError("array shape must be non-negative ints")
            if isinstance(data, int) and not isinstance(data, bool):
                frames: Frames = self._local.frames
                if not 0 < data < len(frames):
                    raise ValueError(f"aux frame index {data} out of range "
                                     f"(message has {len(frames)} frames)")
                data = bytes(frames[data])
            elif not isinstance(data, bytes):
                raise ValueError("array data must be ext(3) bytes or an aux frame index")
            return m.WireArray(dtype, tuple(shape), data)
        raise ValueError(f"unsupported type {typ!r}")

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code == self.profile.raw_view_ext_code:
            return bytes(data)
        # Codes 1/2 are pickle and cloudpickle: never unpickle data received from the wire.
        raise ValueError(f"msgpack ext type {code} refused (only raw-view ext "
                         f"{self.profile.raw_view_ext_code} is accepted)")

    # ------------------------------------------------------------------ helpers

    def _encode(self, obj: Any) -> list[bytes]:
        aux: list[bytes] = []
        self._local.aux = aux
        try:
            main = self._encoder.encode(obj)
        finally:
            self._local.aux = None
        return [main, *aux] if aux else [main]

    def _decode(self, decoder: msgspec.msgpack.Decoder[T], frames: Frames, kind: str,
                all_frames: Frames | None = None) -> T:
        self._local.frames = frames
        try:
            result: T = decoder.decode(frames[0])
            return result
        except ProtocolError:
            raise
        except Exception as exc:  # msgspec.DecodeError, ValidationError, hook errors
            raise ProtocolError(kind, str(exc), all_frames or frames) from None
        finally:
            self._local.frames = ()

    # ------------------------------------------------------- frontend -> engine

    def encode_add(self, request: m.EngineCoreRequest) -> list[bytes]:
        payload: Any = request if self._release is None else self._release.request_array(request)
        return [m.RequestType.ADD.value, *self._encode(payload)]

    def encode_abort(self, request_ids: Sequence[str]) -> list[bytes]:
        return [m.RequestType.ABORT.value, self._encoder.encode(list(request_ids))]

    def encode_utility(self, client_index: int, call_id: int, method: str,
                       args: Sequence[Any]) -> list[bytes]:
        payload = m.UtilityRequest(client_index, call_id, method, list(args))
        return [m.RequestType.UTILITY.value, *self._encode(payload)]

    def encode_start_dp_wave(self, wave: int, exclude_engine_index: int | None) -> list[bytes]:
        return [m.RequestType.START_DP_WAVE.value,
                self._encoder.encode(m.StartDPWave(wave, exclude_engine_index))]

    def decode_engine_input(self, frames: Frames) -> EngineInput:
        """Decode `[type, main, *aux]` as an engine's DEALER receives it."""
        if len(frames) < 2:
            raise ProtocolError("frame_count", f"expected [type, payload, *aux], got "
                                f"{len(frames)} frame(s)", frames)
        type_frame = bytes(frames[0])
        try:
            rtype = m.RequestType(type_frame)
        except ValueError:
            raise ProtocolError("request_type", f"unknown request type byte "
                                f"{type_frame[:8].hex() or '<empty>'}", frames) from None
        body = frames[1:]
        if rtype is m.RequestType.ADD:
            request: m.EngineCoreRequest = self._decode(self._dec_request, body, "add_payload",
                                                        frames)
            if self._release is not None:
                request = self._release.request_from(request)
            if request.sampling_params is None and request.pooling_params is None:
                raise ProtocolError("add_payload", "request has neither sampling_params "
                                    "nor pooling_params", frames)
            return AddRequest(request)
        if rtype is m.RequestType.ABORT:
            return AbortRequests(self._decode(self._dec_abort, body, "abort_payload", frames))
        if rtype is m.RequestType.UTILITY:
            return self._decode(self._dec_utility, body, "utility_payload", frames)
        return self._decode(self._dec_wave, body, "start_dp_wave_payload", frames)

    # ------------------------------------------------------- engine -> frontend

    def encode_outputs(self, outputs: m.EngineCoreOutputs) -> list[bytes]:
        if self._release is not None:
            return self._encode(self._release.outputs_array(outputs))
        return self._encode(outputs)

    def encode_engine_dead(self) -> list[bytes]:
        return [self.profile.engine_dead_sentinel]

    def decode_outputs(self, frames: Frames) -> EngineOutput:
        """Decode one message from an engine's PUSH socket (sentinel checked first)."""
        if not frames:
            raise ProtocolError("frame_count", "empty message", frames)
        if len(frames) == 1 and bytes(frames[0]) == self.profile.engine_dead_sentinel:
            return EngineDead()
        outs: m.EngineCoreOutputs = self._decode(self._dec_outputs, frames, "outputs_payload")
        if self._release is not None:
            outs = self._release.outputs_from(outs)
        util = outs.utility_output
        if util is not None:
            if util.failure_message is None and util.result is None:
                raise ProtocolError("utility_reply", f"call {util.call_id}: success reply "
                                    "without the [type_info, value] result wrapper", frames)
            if util.result is not None and util.result.type_info is not None:
                raise ProtocolError("utility_reply", f"call {util.call_id}: typed utility "
                                    "result needs insecure serialization; refused", frames)
        return outs

    # ------------------------------------------------------------ registration

    def encode_ready(self, response: m.EngineCoreReadyResponse | None) -> bytes:
        """The ready frame; `None` sends the empty payload ("no config to sync").

        Under an older profile only that release's keys go out, in its order."""
        if response is None:
            return b""
        if self._release is not None:
            return self._encoder.encode(self._release.ready_map(response))
        return self._encoder.encode(response)

    def decode_ready(self, payload: Frame) -> m.EngineCoreReadyResponse | None:
        """Our ready struct; a release whose keys cannot fill it is a ProtocolError here
        (`decode_ready_message` returns that release's own struct instead)."""
        message = self.decode_ready_message(payload)
        if message is None:
            return None
        if self._release is None:
            assert isinstance(message, m.EngineCoreReadyResponse)
            return message
        ready = self._release.ready_from(message)
        if ready is None:
            raise ProtocolError("ready_payload", f"a {self.profile.name} ready response lacks "
                                "keys corewire's ready struct requires", [payload])
        return ready

    def decode_ready_message(self, payload: Frame) -> msgspec.Struct | None:
        """The ready response as the profile's release defines it (its keys only)."""
        if len(payload) == 0:
            return None
        message: msgspec.Struct = self._decode(self._dec_ready, [payload], "ready_payload")
        return message

    # ------------------------------------------------------------ any message

    def encode_message(self, message: object) -> list[bytes]:
        """The frames of any message a decoder of this codec returns (the inverse of the
        decoders: golden vectors and fuzzing re-encode what they decoded)."""
        if isinstance(message, AddRequest):
            return self.encode_add(message.request)
        if isinstance(message, AbortRequests):
            return self.encode_abort(message.request_ids)
        if isinstance(message, m.UtilityRequest):
            return self.encode_utility(message.client_index, message.call_id, message.method,
                                       message.args)
        if isinstance(message, m.StartDPWave):
            return self.encode_start_dp_wave(message.wave, message.exclude_engine_index)
        if isinstance(message, m.EngineCoreOutputs):
            return self.encode_outputs(message)
        if isinstance(message, EngineDead):
            return self.encode_engine_dead()
        if message is None or isinstance(message, m.EngineCoreReadyResponse):
            return [self.encode_ready(message)]
        if isinstance(message, m.HandshakeReady):
            if message.status == "HELLO":
                return [self.encode_hello(message.local, message.headless)]
            return [self.encode_handshake_ready(  # vLLM adds the optional keys in this order
                message.local, message.headless,
                parallel_config_hash=message.parallel_config_hash,
                coord_store_port=message.coord_store_port,
                elastic_ep_max_dp_size=message.elastic_ep_max_dp_size,
                num_redundant_experts=message.num_redundant_experts)]
        if isinstance(message, m.EngineHandshakeMetadata):
            return [self.encode_init(message)]
        if isinstance(message, m.DPStatsUpdate):
            return [self.encode_dp_stats(message)]
        raise TypeError(f"no encoder for {type(message).__name__}")

    # --------------------------------------------------------------- handshake

    def encode_hello(self, local: bool, headless: bool) -> bytes:
        return self._encoder.encode({"status": "HELLO", "local": local, "headless": headless})

    def encode_handshake_ready(self, local: bool, headless: bool,
                               **extra: Any) -> bytes:
        msg: dict[str, Any] = {"status": "READY", "local": local, "headless": headless}
        msg.update({k: v for k, v in extra.items() if v is not None})
        return self._encoder.encode(msg)

    def decode_handshake_status(self, payload: Frame) -> m.HandshakeReady:
        """Decode HELLO or READY (READY's extra keys are optional)."""
        msg = self._decode(self._dec_ready_hs, [payload], "handshake_payload")
        if msg.status not in ("HELLO", "READY"):
            raise ProtocolError("handshake_payload", f"unknown status {msg.status!r}",
                                [payload])
        return msg

    def encode_init(self, metadata: m.EngineHandshakeMetadata) -> bytes:
        return self._encoder.encode(metadata)

    def decode_init(self, payload: Frame) -> m.EngineHandshakeMetadata:
        return self._decode(self._dec_init, [payload], "init_payload")

    # ------------------------------------------------------------- coordinator

    def encode_dp_stats(self, update: m.DPStatsUpdate) -> bytes:
        return self._encoder.encode(update)

    def decode_dp_stats(self, payload: Frame) -> m.DPStatsUpdate:
        return self._decode(self._dec_stats, [payload], "dp_stats_payload")


def to_jsonable(message: Any) -> Any:
    """A readable JSON view of any decoded message (structs as maps), for transcripts."""
    if isinstance(message, msgspec.Struct):
        fields = {f: to_jsonable(getattr(message, f)) for f in message.__struct_fields__}
        return {type(message).__name__: fields} if _is_top(message) else fields
    if isinstance(message, AddRequest):
        return {"ADD": to_jsonable(message.request)}
    if isinstance(message, AbortRequests):
        return {"ABORT": list(message.request_ids)}
    if isinstance(message, EngineDead):
        return "ENGINE_CORE_DEAD"
    if isinstance(message, m.WireArray):
        return {"dtype": message.dtype, "shape": list(message.shape),
                "data_hex": message.data.hex()}
    if isinstance(message, enum.Enum):
        return message.value if isinstance(message.value, int) else message.name
    if isinstance(message, bytes | bytearray | memoryview):
        return bytes(message).hex()
    if isinstance(message, dict):
        return {str(k): to_jsonable(v) for k, v in message.items()}
    if isinstance(message, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in message]
    return message


_TOP_LEVEL = (m.EngineCoreOutputs, m.UtilityRequest, m.StartDPWave, m.EngineCoreReadyResponse,
              m.HandshakeReady, m.EngineHandshakeMetadata, m.DPStatsUpdate)


def _is_top(message: msgspec.Struct) -> bool:
    # A release's own ready struct (harness/protocol/wire/layout.py) is named like ours.
    return isinstance(message, _TOP_LEVEL) or type(message).__name__ == "EngineCoreReadyResponse"


DEFAULT_CODEC = WireCodec()
_CODECS: dict[str, WireCodec] = {VLLM_0_33.name: DEFAULT_CODEC}
_CODECS_LOCK = threading.Lock()


def codec_for(profile: ProtocolProfile | None) -> WireCodec:
    """The shared codec of a profile (None: the default); built once per profile."""
    if profile is None:
        return DEFAULT_CODEC
    with _CODECS_LOCK:
        codec = _CODECS.get(profile.name)
        if codec is None or codec.profile is not profile:
            codec = _CODECS[profile.name] = WireCodec(profile)
        return codec
