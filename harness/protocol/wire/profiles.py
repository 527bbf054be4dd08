"""Protocol profiles: everything that changes between vLLM releases, in one object.

A release becomes a `ProtocolProfile`: the field layouts of the positional (array_like)
structs, the ready response's keys, the Rust client's required ready keys and strictness,
the request type bytes, the reserved call ids and the dead sentinel. Profiles are data,
generated from each release's sources by scripts/gen_profiles.py into
fixtures/profiles/vllm-X.Y.Z.json; this module only reads them (no download, no vLLM).

`vllm-0.33` is the hand-written default (harness/protocol/wire/messages.py); the generated
`vllm-0.33.0` profile must have the same layouts (tests/test_profiles.py). The codec uses
the hand-written structs directly when a profile's layouts equal them, and otherwise maps
them to the release's positions field by field (harness/protocol/wire/layout.py).
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import msgspec

from harness.locations import fixture
from harness.protocol.wire import messages as m

PROFILE_DIR = fixture("profiles")
DEFAULT_PROFILE_NAME = "vllm-0.33"

# The structs whose positions matter (array_like), by the name vLLM gives them.
ARRAY_STRUCTS = ("EngineCoreRequest", "EngineCoreOutput", "EngineCoreOutputs", "UtilityOutput")
READY_STRUCT = "EngineCoreReadyResponse"
CANONICAL: dict[str, type[msgspec.Struct]] = {
    "EngineCoreRequest": m.EngineCoreRequest,
    "EngineCoreOutput": m.EngineCoreOutput,
    "EngineCoreOutputs": m.EngineCoreOutputs,
    "UtilityOutput": m.UtilityOutput,
    READY_STRUCT: m.EngineCoreReadyResponse,
}


class UnknownProfileError(KeyError):
    """No profile by that name (a KeyError, so `except KeyError` callers keep working)."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(name)
        self.name = name
        self.known = known

    def __str__(self) -> str:
        return f"unknown protocol profile {self.name!r}; known: {', '.join(self.known)}"


class ProfileDataError(ValueError):
    """A profile JSON file that does not hold what a profile needs (names file and item)."""


_NO_DEFAULT: Any = msgspec.NODEFAULT


@dataclass(frozen=True)
class FieldSpec:
    """One field of a struct in one release: wire name, required or its default."""

    name: str
    required: bool
    default: Any = None
    default_factory: str | None = None
    source: str = ""

    def default_value(self) -> Any:
        """The value a release's encoder writes when the field was never set."""
        if self.default_factory is not None:
            return {"list": list, "dict": dict, "set": set}[self.default_factory]()
        return self.default


@dataclass(frozen=True)
class Layout:
    """A struct's fields in wire order (an array's positions, or a map's keys)."""

    struct: str
    fields: tuple[FieldSpec, ...]
    source: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def __len__(self) -> int:
        return len(self.fields)


def layout_of(struct: type[msgspec.Struct], name: str) -> Layout:
    """The layout of one of our hand-written structs."""
    specs = []
    for f in msgspec.structs.fields(struct):
        factory = f.default_factory
        specs.append(FieldSpec(
            f.encode_name, f.required,
            None if f.default is _NO_DEFAULT else f.default,
            None if factory is _NO_DEFAULT else getattr(factory, "__name__", str(factory)),
            "harness/protocol/wire/messages.py"))
    return Layout(name, tuple(specs), "harness/protocol/wire/messages.py")


@cache
def _canonical_layouts() -> Mapping[str, Layout]:
    """Our structs' layouts (resolving their fields is slow: once per process)."""
    return {name: layout_of(struct, name) for name, struct in CANONICAL.items()}


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
    # Struct name -> layout (ARRAY_STRUCTS and READY_STRUCT); empty = the hand-written ones.
    layouts: Mapping[str, Layout] = field(default_factory=dict)
    # Request type name -> its byte (ADD, ABORT, START_DP_WAVE, UTILITY and vLLM's internal
    # EXECUTOR_FAILED / WAKEUP sentinels).
    request_types: Mapping[str, bytes] = field(default_factory=lambda: {
        "ADD": b"\x00", "ABORT": b"\x01", "START_DP_WAVE": b"\x02", "UTILITY": b"\x03",
        "EXECUTOR_FAILED": b"\x04", "WAKEUP": b"\x05"})
    release_date: str | None = None
    # The Rust client of this release (None: the release has no `rust/`): the ready keys
    # its serde struct cannot do without, and whether its positional structs refuse extra
    # trailing elements (serde_tuple; a shorter array takes the trailing defaults).
    rust_required_ready_keys: tuple[str, ...] | None = None
    rust_strict_arrays: bool = False
    source: str = "harness/protocol/wire/messages.py"

    def __post_init__(self) -> None:
        layouts = {**_canonical_layouts(), **self.layouts}
        object.__setattr__(self, "layouts", layouts)
        if not self.required_ready_keys:
            object.__setattr__(self, "required_ready_keys", tuple(
                f.name for f in layouts[READY_STRUCT].fields if f.required))
        object.__setattr__(self, "request_array_len", len(layouts["EngineCoreRequest"]))
        object.__setattr__(self, "output_array_len", len(layouts["EngineCoreOutput"]))
        object.__setattr__(self, "outputs_array_len", len(layouts["EngineCoreOutputs"]))

    @property
    def ready_keys(self) -> tuple[str, ...]:
        return self.layouts[READY_STRUCT].names

    @property
    def is_canonical(self) -> bool:
        """True when every layout equals our hand-written structs (the codec's fast path)."""
        canonical = _canonical_layouts()
        required = tuple(f.name for f in canonical[READY_STRUCT].fields if f.required)
        return (all(self.layouts[n].names == canonical[n].names for n in canonical)
                and self.required_ready_keys == required)


def _non_optional_required(struct: type[msgspec.Struct]) -> tuple[str, ...]:
    """Keys a serde struct needs: required and not `Option` (serde fills a missing Option)."""
    return tuple(f.encode_name for f in msgspec.structs.fields(struct)
                 if f.required and type(None) not in typing.get_args(f.type))


VLLM_0_33 = ProtocolProfile(name=DEFAULT_PROFILE_NAME, vllm_version="0.33.0",
                            release_date="2026-11-02T10:12:56",
                            rust_required_ready_keys=_non_optional_required(
                                m.EngineCoreReadyResponse),
                            rust_strict_arrays=True)


# ------------------------------------------------------------------ generated profiles


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", name))


def _load(path: Path) -> ProtocolProfile:
    """Build a profile from one generated JSON file."""
    try:
        data = json.loads(path.read_text())
        layouts = {
            name: Layout(name, tuple(
                FieldSpec(f["name"], bool(f["required"]), f.get("default"),
                          f.get("default_factory"), f.get("source", ""))
                for f in data["structs"][name]["fields"]), data["structs"][name]["source"])
            for name in (*ARRAY_STRUCTS, READY_STRUCT)}
        for name, layout in layouts.items():
            if any("default_expr" in f for f in data["structs"][name]["fields"]):
                raise ProfileDataError(f"{path.name}: {name} has a default that is not data")
            if name in ARRAY_STRUCTS and not layout.fields:
                raise ProfileDataError(f"{path.name}: {name} has no fields")
        rust = data.get("rust")
        return ProtocolProfile(
            name=data["name"], vllm_version=data["vllm_version"],
            engine_dead_sentinel=data["engine_dead_sentinel"]["value"].encode("ascii"),
            reserved_call_ids=frozenset(v["value"] for v in data["reserved_call_ids"].values()),
            layouts=layouts,
            request_types={k: bytes.fromhex(v["byte"]) for k, v in data["request_types"].items()},
            required_ready_keys=tuple(data["required_ready_keys"]),
            release_date=data.get("release_date"),
            rust_required_ready_keys=None if rust is None else tuple(rust["required_ready_keys"]),
            rust_strict_arrays=bool(rust and rust["strict_arrays"]),
            source=f"fixtures/profiles/{path.name}")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, ProfileDataError):
            raise
        raise ProfileDataError(f"{path}: not a protocol profile ({type(exc).__name__}: "
                               f"{exc})") from None


@cache
def _generated() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PROFILE_DIR.glob("vllm-*.json"),
                                      key=lambda p: _version_key(p.stem))}


@cache
def _loaded(name: str) -> ProtocolProfile:
    return _load(_generated()[name])


def profile_names() -> list[str]:
    """The default's name, then every generated release, oldest first."""
    return [DEFAULT_PROFILE_NAME, *_generated()]


def get_profile(name: str) -> ProtocolProfile:
    """Look up a profile by name (`vllm-0.33`, `vllm-0.22.1`, ...)."""
    if name == DEFAULT_PROFILE_NAME:
        return VLLM_0_33
    if name not in _generated():
        raise UnknownProfileError(name, profile_names())
    return _loaded(name)


def profile_for_release(version: str) -> ProtocolProfile:
    """The profile of a vLLM release given as `0.22.1` (or `vllm-0.22.1`)."""
    name = version if version.startswith("vllm-") else f"vllm-{version}"
    return get_profile(name)


def all_profiles() -> list[ProtocolProfile]:
    return [get_profile(n) for n in profile_names()]


# Kept for callers that listed the profiles by dict; only the default is eager.
PROFILES: dict[str, ProtocolProfile] = {VLLM_0_33.name: VLLM_0_33}
