"""Drift check: our hand-written message layouts against vLLM's own classes.

harness/protocol/wire/messages.py is written from protocol facts, not copied.
This lane imports the real
vLLM and compares, per message type, what decides the bytes: field names and order, which
fields are required, defaults (enum defaults as their values), the struct options that change
the encoding, and the enum values. A mismatch fails with a unified diff of the two layouts
(`-` vLLM, `+` ours). Field *types* are not compared: ours deliberately use wire-level types
(WireArray for tensors, plain maps for stats); the golden vectors check those bytes.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import importlib
import os
from types import ModuleType
from typing import Any

import msgspec
import pytest

from harness.protocol.wire import VLLM_0_33
from harness.protocol.wire import messages as m

pytestmark = pytest.mark.vllm

# (ours, vLLM module, vLLM class name)
PAIRS: list[tuple[type, str, str]] = [
    (m.EngineCoreRequest, "vllm.v1.engine", "EngineCoreRequest"),
    (m.SamplingParams, "vllm.sampling_params", "SamplingParams"),
    (m.PoolingParams, "vllm.pooling_params", "PoolingParams"),
    (m.LoRARequest, "vllm.lora.request", "LoRARequest"),
    (m.EngineCoreOutputs, "vllm.v1.engine", "EngineCoreOutputs"),
    (m.EngineCoreOutput, "vllm.v1.engine", "EngineCoreOutput"),
    (m.UtilityOutput, "vllm.v1.engine", "UtilityOutput"),
    (m.EngineCoreEvent, "vllm.v1.engine", "EngineCoreEvent"),
    (m.RequestError, "vllm.outputs", "RequestError"),
    (m.LogprobsLists, "vllm.v1.outputs", "LogprobsLists"),
    (m.LogprobsTensors, "vllm.v1.outputs", "LogprobsTensors"),
    (m.SamplingMaskLists, "vllm.v1.outputs", "SamplingMaskLists"),
    (m.EngineCoreReadyResponse, "vllm.v1.engine", "EngineCoreReadyResponse"),
    (m.EngineZmqAddresses, "vllm.v1.engine.utils", "EngineZmqAddresses"),
    (m.EngineHandshakeMetadata, "vllm.v1.engine.utils", "EngineHandshakeMetadata"),
]

ENUMS: list[tuple[type[enum.Enum], str, str]] = [
    (m.FinishReason, "vllm.v1.engine", "FinishReason"),
    (m.EngineCoreEventType, "vllm.v1.engine", "EngineCoreEventType"),
    (m.RequestOutputKind, "vllm.sampling_params", "RequestOutputKind"),
]

# vLLM request types that never cross the wire from a frontend (engine-internal sentinels).
INTERNAL_REQUEST_TYPES = {"EXECUTOR_FAILED", "WAKEUP"}


def _vllm_attr(vllm: ModuleType, module: str, name: str) -> Any:
    assert vllm.__name__ == "vllm"
    return getattr(importlib.import_module(module), name)


# --------------------------------------------------------------------------- layouts


def _show_default(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, set | frozenset):
        return f"set({sorted(value)!r})" if value else "set()"
    return repr(value)


def layout(cls: type) -> list[str]:
    """The wire-relevant layout of a Struct, dataclass or NamedTuple: a line per field, in order."""
    lines: list[str] = []
    if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        cfg = cls.__struct_config__
        form = ("array of all fields" if cfg.array_like
                else "map of non-default fields" if cfg.omit_defaults else "map of all fields")
        lines.append(f"wire: {form}")
        for sf in msgspec.structs.fields(cls):
            if sf.default is not msgspec.NODEFAULT:
                default = _show_default(sf.default)
            elif sf.default_factory is not msgspec.NODEFAULT:
                default = _show_default(sf.default_factory())
            else:
                default = "<required>"
            lines.append(f"{sf.encode_name} = {default}")
        return lines
    if dataclasses.is_dataclass(cls):
        # msgspec encodes dataclasses as maps of all fields except leading-underscore ones.
        lines.append("wire: map of all fields")
        wire_fields = [f for f in dataclasses.fields(cls) if not f.name.startswith("_")]
        for f in wire_fields:
            if f.default is not dataclasses.MISSING:
                default = _show_default(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                default = _show_default(f.default_factory())
            else:
                default = "<required>"
            lines.append(f"{f.name} = {default}")
        return lines
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        lines.append("wire: array of all fields")
        defaults: dict[str, Any] = getattr(cls, "_field_defaults", {})
        for name in cls._fields:
            default = _show_default(defaults[name]) if name in defaults else "<required>"
            lines.append(f"{name} = {default}")
        return lines
    raise TypeError(f"cannot describe the layout of {cls!r}")


def struct_options(cls: Any) -> list[str]:
    """Struct options that change the encoding (only comparable between two Structs)."""
    cfg = cls.__struct_config__
    return [f"{opt} = {getattr(cfg, opt)!r}" for opt in
            ("array_like", "omit_defaults", "forbid_unknown_fields", "tag", "tag_field")]


def assert_same(what: str, theirs: list[str], ours: list[str]) -> None:
    if theirs != ours:
        diff = "\n".join(difflib.unified_diff(theirs, ours, f"vllm {what}", f"ours {what}",
                                              lineterm=""))
        pytest.fail(f"{what}: layout drift from vLLM (- vllm, + ours)\n{diff}", pytrace=False)


# --------------------------------------------------------------------------- tests


def test_vllm_version_matches_profile(vllm: ModuleType) -> None:
    assert vllm.__version__ == VLLM_0_33.vllm_version


@pytest.mark.parametrize(("ours", "module", "name"), PAIRS, ids=[p[2] for p in PAIRS])
def test_layout(vllm: ModuleType, ours: type, module: str, name: str) -> None:
    theirs = _vllm_attr(vllm, module, name)
    assert_same(name, layout(theirs), layout(ours))
    if issubclass(theirs, msgspec.Struct):
        assert_same(f"{name} options", struct_options(theirs), struct_options(ours))


@pytest.mark.parametrize(("ours", "module", "name"), ENUMS, ids=[e[2] for e in ENUMS])
def test_enum_values(vllm: ModuleType, ours: type[enum.Enum], module: str, name: str) -> None:
    theirs = _vllm_attr(vllm, module, name)
    assert_same(name, [f"{e.name} = {e.value!r}" for e in theirs],
                [f"{e.name} = {e.value!r}" for e in ours])


def test_finish_reason_strings(vllm: ModuleType) -> None:
    """`str(reason)` becomes RequestOutput.finish_reason in the public API."""
    theirs = _vllm_attr(vllm, "vllm.v1.engine", "FinishReason")
    assert_same("str(FinishReason)", [f"{e.value} -> {e!s}" for e in theirs],
                [f"{e.value} -> {e!s}" for e in m.FinishReason])


def test_request_type_bytes(vllm: ModuleType) -> None:
    theirs = _vllm_attr(vllm, "vllm.v1.engine", "EngineCoreRequestType")
    on_wire = [e for e in theirs if e.name not in INTERNAL_REQUEST_TYPES]
    assert {e.name for e in theirs} - {e.name for e in on_wire} == INTERNAL_REQUEST_TYPES
    assert_same("EngineCoreRequestType", [f"{e.name} = {e.value!r}" for e in on_wire],
                [f"{e.name} = {e.value!r}" for e in m.RequestType])


def test_profile_constants(vllm: ModuleType) -> None:
    core = importlib.import_module("vllm.v1.engine.core")
    serial = importlib.import_module("vllm.v1.serial_utils")
    engine = importlib.import_module("vllm.v1.engine")
    profile = VLLM_0_33
    assert profile.engine_dead_sentinel == core.EngineCoreProc.ENGINE_CORE_DEAD
    assert profile.raw_view_ext_code == serial.CUSTOM_TYPE_RAW_VIEW
    assert {serial.CUSTOM_TYPE_PICKLE, serial.CUSTOM_TYPE_CLOUDPICKLE} == {1, 2}
    if "VLLM_MSGPACK_ZERO_COPY_THRESHOLD" not in os.environ:
        assert serial.MsgpackEncoder().size_threshold == profile.zero_copy_threshold
    assert {engine.EEP_NOTIFICATION_CALL_ID, engine.FT_STATUS_CALL_ID} == \
        set(profile.reserved_call_ids)
    assert len(msgspec.structs.fields(engine.EngineCoreRequest)) == profile.request_array_len
    assert len(msgspec.structs.fields(engine.EngineCoreOutput)) == profile.output_array_len
    assert len(msgspec.structs.fields(engine.EngineCoreOutputs)) == profile.outputs_array_len
    required = tuple(f.name for f in dataclasses.fields(engine.EngineCoreReadyResponse)
                     if f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)
    assert_same("required ready keys", list(required), list(profile.required_ready_keys))
