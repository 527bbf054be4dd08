"""Protocol profiles: everything that changes between vLLM releases, in one object.

A later vLLM release becomes a new `ProtocolProfile` (new struct classes, new required
ready keys, a new sentinel) rather than an edit scattered over the codec, the engines and
the frontends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from harness.wire import messages as m


@dataclass(frozen=True)
class ProtocolProfile:
    """The layouts and constants of one protocol version."""

    name: str
    vllm_version: str
    request_type: type[m.EngineCoreRequest] = m.EngineCoreRequest
    outputs_type: type[m.EngineCoreOutputs] = m.EngineCoreOutputs
    ready_type: type[m.EngineCoreReadyResponse] = m.EngineCoreReadyResponse
    engine_dead_sentinel: bytes = b"ENGINE_CORE_DEAD"
    # Arrays at least this large travel as aux frames instead of inline ext(3) data.
    zero_copy_threshold: int = 256
    raw_view_ext_code: int = 3
    # Reserved utility call ids (elastic-EP notification, fault-tolerance status push).
    reserved_call_ids: frozenset[int] = frozenset({-1, -2})
    request_array_len: int = 22
    output_array_len: int = 19
    outputs_array_len: int = 9
    required_ready_keys: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.required_ready_keys:
            required = tuple(
                f.encode_name for f in msgspec.structs.fields(self.ready_type) if f.required
            )
            object.__setattr__(self, "required_ready_keys", required)


VLLM_0_33 = ProtocolProfile(name="vllm-0.33", vllm_version="0.33.0")

PROFILES: dict[str, ProtocolProfile] = {VLLM_0_33.name: VLLM_0_33}


def get_profile(name: str) -> ProtocolProfile:
    """Look up a profile by name, with the known names in the error."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown protocol profile {name!r}; known: {sorted(PROFILES)}") from None
