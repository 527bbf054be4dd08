"""One release's positions for our structs: encode to them, decode from them.

Everything in corewire builds and reads the hand-written structs of
harness/protocol/wire/messages.py
(the newest layout, a superset of every release's fields). A `ReleaseLayout` maps them to the
layout of one `ProtocolProfile`, field by field and by name:

* encoding writes exactly the release's fields in the release's order -- an older release's
  strict decoder (vllm-rs refuses extra trailing elements) never sees a newer field, and a
  field the release has but our structs lack gets the release's default;
* decoding uses msgspec structs defined at run time with the release's fields, defaults and
  required keys (so a release's own rules validate what arrives, and extra trailing elements
  are ignored as that release's msgspec would), then copies the values into our structs.

Only a profile whose layouts differ from ours goes through here; the default takes the
structs directly.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

import msgspec

from harness.protocol.wire import messages as m
from harness.protocol.wire.profiles import (
    CANONICAL,
    READY_STRUCT,
    FieldSpec,
    Layout,
    ProfileDataError,
    ProtocolProfile,
)


def _canonical_types(struct: type[msgspec.Struct]) -> dict[str, Any]:
    return {f.encode_name: f.type for f in msgspec.structs.fields(struct)}


class ReleaseLayout:
    """The struct mapping for one non-default profile."""

    def __init__(self, profile: ProtocolProfile) -> None:
        self.profile = profile
        layouts = profile.layouts
        self.request = layouts["EngineCoreRequest"]
        self.output = layouts["EngineCoreOutput"]
        self.outputs = layouts["EngineCoreOutputs"]
        self.utility = layouts["UtilityOutput"]
        self.ready = layouts[READY_STRUCT]
        for layout in (self.request, self.output, self.outputs, self.utility):
            self._check_convertible(layout)
        self.utility_struct = self._define(self.utility, {})
        self.output_struct = self._define(self.output, {})
        self.outputs_struct = self._define(self.outputs, {
            "outputs": list[self.output_struct],  # type: ignore[name-defined]
            "utility_output": self.utility_struct | None})
        self.request_struct = self._define(self.request, {})
        self.ready_struct = self._define(self.ready, {}, array_like=False)
        self._to_request, self._from_request = _to_release(self.request), _from_release(
            self.request)
        self._to_output, self._from_output = _to_release(self.output), _from_release(
            self.output)
        self._to_outputs, self._from_outputs = _to_release(self.outputs), _from_release(
            self.outputs)
        self._to_utility, self._from_utility = _to_release(self.utility), _from_release(
            self.utility)
        self._to_ready, self._from_ready = _to_release(self.ready), _from_release(self.ready)
        names = self.outputs.names
        self._outputs_at = names.index("outputs") if "outputs" in names else None
        self._utility_at = names.index("utility_output") if "utility_output" in names else None

    def _check_convertible(self, layout: Layout) -> None:
        """Every field our struct requires must exist in the release (else no mapping)."""
        have = set(layout.names)
        lacking = [f.encode_name for f in msgspec.structs.fields(CANONICAL[layout.struct])
                   if f.required and f.encode_name not in have]
        if lacking:
            raise ProfileDataError(f"profile {self.profile.name}: {layout.struct} lacks "
                                   f"{lacking}, which corewire's struct requires")

    def _define(self, layout: Layout, override: dict[str, Any], *,
                array_like: bool = True) -> type[msgspec.Struct]:
        """A msgspec struct with the release's fields, our types and the release's defaults."""
        types = _canonical_types(CANONICAL[layout.struct])
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
        for spec in layout.fields:
            typ = override.get(spec.name, types.get(spec.name, Any))
            if spec.required:
                fields.append((spec.name, typ))
            elif spec.default_factory is not None:
                fields.append((spec.name, typ, msgspec.field(default_factory=_factory(spec))))
            else:
                if spec.default is None and typ is not Any:
                    typ = typ | None
                fields.append((spec.name, typ, spec.default))
        return msgspec.defstruct(layout.struct, fields, array_like=array_like, kw_only=True,
                                 gc=False)

    # ------------------------------------------------------------------ encode

    def request_array(self, request: m.EngineCoreRequest) -> list[Any]:
        return self._to_request(request)

    def outputs_array(self, outputs: m.EngineCoreOutputs) -> list[Any]:
        values = self._to_outputs(outputs)
        if self._outputs_at is not None:
            values[self._outputs_at] = [self._to_output(o) for o in values[self._outputs_at]]
        if self._utility_at is not None and values[self._utility_at] is not None:
            values[self._utility_at] = self._to_utility(values[self._utility_at])
        return values

    def ready_map(self, response: m.EngineCoreReadyResponse) -> dict[str, Any]:
        """The release's ready keys, in its order (vLLM encodes the dataclass as a map)."""
        return dict(zip(self.ready.names, self._to_ready(response), strict=True))

    # ------------------------------------------------------------------ decode

    def request_from(self, decoded: Any) -> m.EngineCoreRequest:
        result: m.EngineCoreRequest = self._from_request(decoded)
        return result

    def outputs_from(self, decoded: Any) -> m.EngineCoreOutputs:
        replace: dict[str, Any] = {}
        if self._outputs_at is not None:
            replace["outputs"] = [self._from_output(o) for o in decoded.outputs]
        if self._utility_at is not None and decoded.utility_output is not None:
            replace["utility_output"] = self._from_utility(decoded.utility_output)
        result: m.EngineCoreOutputs = self._from_outputs(decoded, **replace)
        return result

    def ready_from(self, decoded: Any) -> m.EngineCoreReadyResponse | None:
        """Our struct, or None when the release lacks keys our struct requires."""
        try:
            result: m.EngineCoreReadyResponse = self._from_ready(decoded)
        except TypeError:
            return None
        return result


def _to_release(layout: Layout) -> Callable[[Any], list[Any]]:
    """Our struct -> the release's values in its order (its default where we lack a field)."""
    ours = CANONICAL[layout.struct].__struct_fields__
    present = [spec.name for spec in layout.fields if spec.name in ours]
    get = attrgetter(*present)
    if len(present) == len(layout.fields) and len(present) > 1:
        return lambda obj: list(get(obj))
    missing = [(i, spec) for i, spec in enumerate(layout.fields) if spec.name not in ours]

    def values(obj: Any) -> list[Any]:
        got = get(obj)
        out = list(got) if len(present) > 1 else [got]
        for i, spec in missing:
            out.insert(i, spec.default_value())
        return out

    return values


def _from_release(layout: Layout) -> Callable[..., Any]:
    """A release's decoded struct -> ours (its fields we lack are dropped)."""
    target = CANONICAL[layout.struct]
    common = tuple(n for n in layout.names if n in target.__struct_fields__)
    get = attrgetter(*common)

    def build(obj: Any, **replace: Any) -> Any:
        got = get(obj)
        kwargs = dict(zip(common, got if len(common) > 1 else (got,), strict=True))
        kwargs.update(replace)
        return target(**kwargs)

    return build


def _factory(spec: FieldSpec) -> Any:
    return {"list": list, "dict": dict, "set": set}[spec.default_factory or "list"]
