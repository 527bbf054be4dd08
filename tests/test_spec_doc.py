"""docs/spec.md is generated, complete and in sync with the cases and the profile."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from harness.cases.index import wire_specs
from harness.cases.spec_document import markdown_table

ROOT = Path(__file__).resolve().parent.parent


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_spec", ROOT / "scripts" / "gen_spec.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_spec_is_not_stale() -> None:
    assert _generator().main(["--check"]) == 0, "docs/spec.md is stale: run `make spec`"


def test_every_requirement_and_every_wire_message_is_in_the_spec() -> None:
    text = (ROOT / "docs" / "spec.md").read_text(encoding="utf-8")
    missing = [c for c in wire_specs() if f"**`{c}`**" not in text]
    assert missing == []
    profile = json.loads((ROOT / "fixtures" / "profiles" / "vllm-0.33.0.json").read_text())
    for name, struct in profile["structs"].items():
        assert f"`{name}`" in text or name == "EngineCoreReadyResponse"
        for field in struct["fields"]:
            assert f"| `{field['name']}` |" in text, f"{name}.{field['name']}"
    for request_type in profile["request_types"]:
        assert f"| `{request_type}` |" in text
    assert profile["engine_dead_sentinel"]["value"] in text


def test_markdown_table_reads_the_first_matching_table() -> None:
    text = "x\n| a | b |\n|---|---|\n| 1 | **F** |\n\n| case | v |\n|---|---|\n| c | P |\n"
    assert markdown_table(text) == {"c": {"case": "c", "v": "P"}}
    assert markdown_table(text, first="a") == {"1": {"a": "1", "b": "F"}}
