"""Sans-IO wire layer: message types, codec, protocol profiles, ProtocolError."""

from harness.protocol.wire.codec import (
    DEFAULT_CODEC,
    AbortRequests,
    AddRequest,
    EngineDead,
    EngineInput,
    EngineOutput,
    WireCodec,
    codec_for,
    to_jsonable,
)
from harness.protocol.wire.errors import ProtocolError
from harness.protocol.wire.profiles import (
    VLLM_0_33,
    ProtocolProfile,
    UnknownProfileError,
    get_profile,
    profile_for_release,
    profile_names,
)

__all__ = [
    "DEFAULT_CODEC",
    "VLLM_0_33",
    "AbortRequests",
    "AddRequest",
    "EngineDead",
    "EngineInput",
    "EngineOutput",
    "ProtocolError",
    "ProtocolProfile",
    "UnknownProfileError",
    "WireCodec",
    "codec_for",
    "get_profile",
    "profile_for_release",
    "profile_names",
    "to_jsonable",
]
