"""One release's positions for our structs: encode to them, decode from them.

Everything in corewire builds and reads the hand-written structs of harness/wire/messages.py
(the newest layout, a superset of every release's fields). A `ReleaseLayout` maps them to the
layout of one `ProtocolProfile`, field by field and by name:

* encoding writes exactly the release's fields in the release's order -- an older release's
  strict decoder (vllm-rs refuses arrays of another length) never sees a newer field, and a
  field the release has but our structs lack gets the release's default;
* decoding uses msgspec structs defined at run time with the release's fields, defaults and
  required keys (so a release's own rules validate what arrives, and extra trailing elements
  are ignored as that release's msgspec would), then copies the values into our structs.

Only a profile whose layouts differ from ours goes through here; the default takes the
structs directly.
"""

from __future__ import annotations

from typing import Any

import msgspec

from harness.wire import messages as m
from harness.wire.profiles import (
    CANONICAL,
    READY_STRUCT,
    FieldSpec,
    Layout,
    ProfileDataError,
    ProtocolProfile,
)

_MISSING: Any = object()


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

    @staticmethod
    def _values(obj: Any, layout: Layout) -> list[Any]:
        out = []
        for spec in layout.fields:
            value = getattr(obj, spec.name, _MISSING)
            out.append(spec.default_value() if value is _MISSING else value)
        return out

    def request_array(self, request: m.EngineCoreRequest) -> list[Any]:
        return self._values(request, self.request)

    def outputs_array(self, outputs: m.EngineCoreOutputs) -> list[Any]:
        values = self._values(outputs, self.outputs)
        names = self.outputs.names
        if "outputs" in names:
            i = names.index("outputs")
            values[i] = [self._values(o, self.output) for o in values[i]]
        if "utility_output" in names:
            i = names.index("utility_output")
            if values[i] is not None:
                values[i] = self._values(values[i], self.utility)
        return values

    def ready_map(self, response: m.EngineCoreReadyResponse) -> dict[str, Any]:
        """The release's ready keys, in its order (vLLM encodes the dataclass as a map)."""
        return dict(zip(self.ready.names, self._values(response, self.ready), strict=True))

    # ------------------------------------------------------------------ decode

    @staticmethod
    def _copy(obj: msgspec.Struct, target: type[Any], **replace: Any) -> Any:
        known = _canonical_types(target)
        kwargs = {name: getattr(obj, name) for name in obj.__struct_fields__ if name in known}
        kwargs.update(replace)
        return target(**kwargs)

    def request_from(self, decoded: Any) -> m.EngineCoreRequest:
        result: m.EngineCoreRequest = self._copy(decoded, m.EngineCoreRequest)
        return result

    def outputs_from(self, decoded: Any) -> m.EngineCoreOutputs:
        replace: dict[str, Any] = {}
        if "outputs" in decoded.__struct_fields__:
            replace["outputs"] = [self._copy(o, m.EngineCoreOutput) for o in decoded.outputs]
        if "utility_output" in decoded.__struct_fields__ and decoded.utility_output is not None:
            replace["utility_output"] = self._copy(decoded.utility_output, m.UtilityOutput)
        result: m.EngineCoreOutputs = self._copy(decoded, m.EngineCoreOutputs, **replace)
        return result

    def ready_from(self, decoded: Any) -> m.EngineCoreReadyResponse | None:
        """Our struct, or None when the release lacks keys our struct requires."""
        try:
            result: m.EngineCoreReadyResponse = self._copy(decoded, m.EngineCoreReadyResponse)
        except TypeError:
            return None
        return result


def _factory(spec: FieldSpec) -> Any:
    return {"list": list, "dict": dict, "set": set}[spec.default_factory or "list"]
