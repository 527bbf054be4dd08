"""Sans-IO wire layer: message types, codec, protocol profiles, ProtocolError."""

from harness.wire.codec import (
    DEFAULT_CODEC,
    AbortRequests,
    AddRequest,
    EngineDead,
    EngineInput,
    EngineOutput,
    WireCodec,
    to_jsonable,
)
from harness.wire.errors import ProtocolError
from harness.wire.profiles import VLLM_0_33, ProtocolProfile, get_profile

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
    "WireCodec",
    "get_profile",
    "to_jsonable",
]
