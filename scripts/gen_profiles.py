"""Regenerate fixtures/profiles: one protocol profile per vLLM release, read from its sdist.

For every final vLLM release in [0.22.0, 0.33.0] listed by PyPI's JSON API, the sdist is
downloaded once into ``${XDG_CACHE_HOME:-~/.cache}/corewire/sdists/`` (sha256 checked) and
read WITHOUT importing vLLM: Python's ``ast`` over ``vllm/v1/engine/__init__.py`` and
``core.py``, plain text over the Rust client's ``protocol/*.rs``. Each release gets
``fixtures/profiles/vllm-X.Y.Z.json`` holding the array layouts of EngineCoreRequest,
EngineCoreOutput, EngineCoreOutputs and UtilityOutput (field names in order, required or
default), the ready response's keys, the request type bytes, the reserved utility call ids,
the ENGINE_CORE_DEAD sentinel and, where the sdist has ``rust/``, the Rust client's serde
structs (its required ready keys, its strict tuple decoding) -- every item with the
``file:line`` it came from.

    .venv/bin/python scripts/gen_profiles.py            # all releases in range (make profiles)
    .venv/bin/python scripts/gen_profiles.py 0.34.0     # one release (a new one: this command)
    .venv/bin/python scripts/gen_profiles.py --check    # exit 1 if a checked-in file differs

Needs the network for the release list and uncached sdists; tests read only the JSON.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "fixtures" / "profiles"
PYPI_JSON = "https://pypi.org/pypi/vllm/json"
FIRST, LAST = (0, 22, 0), (0, 33, 0)
SCHEMA = 1

PY_ENGINE = "vllm/v1/engine/__init__.py"
PY_CORE = "vllm/v1/engine/core.py"
RUST_PROTOCOL = "rust/src/engine-core-client/src/protocol/"
ARRAY_STRUCTS = ("EngineCoreRequest", "EngineCoreOutput", "EngineCoreOutputs", "UtilityOutput")
READY = "EngineCoreReadyResponse"
RESERVED_CALL_IDS = ("EEP_NOTIFICATION_CALL_ID", "FT_STATUS_CALL_ID")


class ExtractError(Exception):
    """A release's sources do not have the shape the extractor expects (names the file)."""


# ------------------------------------------------------------------ PyPI and the cache


@dataclass(frozen=True)
class Release:
    version: str
    url: str
    filename: str
    sha256: str
    upload_time: str


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "corewire" / "sdists"


def list_releases(wanted: list[str]) -> list[Release]:
    """Final releases in range (or the ones named) that have an sdist, oldest first."""
    with urllib.request.urlopen(PYPI_JSON, timeout=60) as resp:
        data = json.load(resp)
    out: list[Release] = []
    for version, files in data["releases"].items():
        if not re.fullmatch(r"\d+\.\d+\.\d+", version):
            continue  # pre-releases, post-releases
        key = tuple(int(p) for p in version.split("."))
        if wanted and version not in wanted:
            continue
        if not wanted and not FIRST <= key <= LAST:
            continue
        for f in files:
            if f["packagetype"] == "sdist" and not f.get("yanked"):
                out.append(Release(version, urljoin(PYPI_JSON, f["url"]), f["filename"],
                                   f["digests"]["sha256"], f["upload_time"]))
    missing = set(wanted) - {r.version for r in out}
    if missing:
        raise SystemExit(f"no sdist on PyPI for: {', '.join(sorted(missing))}")
    return sorted(out, key=lambda r: tuple(int(p) for p in r.version.split(".")))


def fetch(release: Release) -> Path:
    """The cached sdist, downloaded on first use and checked against PyPI's sha256."""
    path = cache_dir() / release.filename
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(".part")
        print(f"downloading {release.filename}", file=sys.stderr)
        with urllib.request.urlopen(release.url, timeout=600) as resp, part.open("wb") as f:
            while chunk := resp.read(1 << 20):
                f.write(chunk)
        part.rename(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != release.sha256:
        path.unlink()
        raise SystemExit(f"{release.filename}: sha256 {digest} != PyPI's {release.sha256}")
    return path


def read_sources(sdist: Path) -> dict[str, str]:
    """The few source files the extractor needs, keyed by path inside the release."""
    out: dict[str, str] = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            if not member.isfile():
                continue
            rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
            if rel in (PY_ENGINE, PY_CORE) or (
                    rel.startswith(RUST_PROTOCOL) and rel.endswith(".rs")):
                f = tar.extractfile(member)
                assert f is not None
                out[rel] = f.read().decode("utf-8")
    if PY_ENGINE not in out:
        raise ExtractError(f"{sdist.name}: no {PY_ENGINE}")
    return out


# ------------------------------------------------------------------ Python (ast)


def _literal(node: ast.expr) -> dict[str, Any]:
    """A default as data: a JSON literal, a factory, or the expression's text."""
    if isinstance(node, ast.List) and not node.elts:
        return {"default_factory": "list"}
    if isinstance(node, ast.Call):
        for kw in node.keywords:
            if kw.arg == "default_factory":
                return {"default_factory": ast.unparse(kw.value)}
            if kw.arg == "default":
                return _literal(kw.value)
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return {"default_expr": ast.unparse(node)}
    if isinstance(value, bytes | set | tuple):
        return {"default_expr": ast.unparse(node)}
    return {"default": value}


def _struct(cls: ast.ClassDef, path: str) -> dict[str, Any]:
    kind = "dataclass" if any(ast.unparse(d).endswith("dataclass") for d in cls.decorator_list) \
        else "msgspec"
    options = {kw.arg: ast.literal_eval(kw.value) for kw in cls.keywords if kw.arg}
    fields: list[dict[str, Any]] = []
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        if ast.unparse(stmt.annotation).startswith("ClassVar"):
            continue
        entry: dict[str, Any] = {"name": stmt.target.id, "type": ast.unparse(stmt.annotation),
                                 "required": stmt.value is None,
                                 "source": f"{path}:{stmt.lineno}"}
        if stmt.value is not None:
            entry.update(_literal(stmt.value))
        fields.append(entry)
    return {"kind": kind, "options": options, "source": f"{path}:{cls.lineno}",
            "fields": fields}


def extract_python(sources: dict[str, str]) -> dict[str, Any]:
    tree = ast.parse(sources[PY_ENGINE])
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    structs: dict[str, Any] = {}
    for name in (*ARRAY_STRUCTS, READY):
        if name not in classes:
            raise ExtractError(f"{PY_ENGINE}: no class {name}")
        structs[name] = _struct(classes[name], PY_ENGINE)
    for name in ARRAY_STRUCTS:
        if not structs[name]["options"].get("array_like"):
            raise ExtractError(f"{PY_ENGINE}: {name} is not array_like")

    request_types: dict[str, Any] = {}
    for stmt in classes["EngineCoreRequestType"].body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            value = ast.literal_eval(stmt.value)
            request_types[stmt.targets[0].id] = {"byte": value.hex(),
                                                 "source": f"{PY_ENGINE}:{stmt.lineno}"}
    reserved: dict[str, Any] = {}
    for stmt in tree.body:
        if (isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name)
                and stmt.targets[0].id in RESERVED_CALL_IDS):
            reserved[stmt.targets[0].id] = {"value": ast.literal_eval(stmt.value),
                                            "source": f"{PY_ENGINE}:{stmt.lineno}"}
    return {"structs": structs, "request_types": request_types,
            "reserved_call_ids": reserved, "engine_dead_sentinel": _dead_sentinel(sources)}


def _dead_sentinel(sources: dict[str, str]) -> dict[str, Any]:
    if PY_CORE not in sources:
        raise ExtractError(f"no {PY_CORE}")
    for node in ast.walk(ast.parse(sources[PY_CORE])):
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "ENGINE_CORE_DEAD"):
            value = ast.literal_eval(node.value)
            return {"value": value.decode("ascii"), "source": f"{PY_CORE}:{node.lineno}"}
    raise ExtractError(f"{PY_CORE}: no ENGINE_CORE_DEAD")


# ------------------------------------------------------------------ Rust (text)

_ATTR = re.compile(r"^\s*#\[(.*)\]\s*$")
_FIELD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:r#)?(\w+)\s*:\s*(.+?),?\s*(//.*)?$")
_RENAME = re.compile(r'rename\s*=\s*"([^"]+)"')


def _rust_struct(text: str, path: str, name: str) -> dict[str, Any] | None:
    """Fields of `pub struct NAME { ... }`: wire name, type, and whether a map may omit the
    key (serde: an `Option` or a `#[serde(default)]` field may be missing, and so may every
    field of a struct marked `#[serde(default)]`). `tuple` says it derives Deserialize_tuple:
    a positional array whose length the decoder checks (extra elements are refused)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if re.match(rf"^\s*(?:pub(?:\([^)]*\))?\s+)?struct {name}\s*\{{", line)),
                 None)
    if start is None:
        return None
    header: list[str] = []
    i = start - 1
    while i >= 0 and (lines[i].strip().startswith(("#[", "///", "//")) or not lines[i].strip()):
        if lines[i].strip().startswith("#["):
            header.append(lines[i].strip())
        i -= 1
    container_default = any("serde" in h and re.search(r"\bdefault\b", h) for h in header)
    tuple_layout = any("Deserialize_tuple" in h for h in header)
    fields: list[dict[str, Any]] = []
    attrs: list[str] = []
    for lineno, line in enumerate(lines[start + 1:], start=start + 2):
        stripped = line.strip()
        if stripped.startswith("}"):
            break
        attr = _ATTR.match(line)
        if attr:
            attrs.append(attr.group(1))
            continue
        field = _FIELD.match(line)
        if not field:
            continue  # doc comments, blank lines
        serde = " ".join(a for a in attrs if a.startswith("serde"))
        rename = _RENAME.search(serde)
        rtype = field.group(2).strip()
        optional = rtype.startswith(("Option<", "std::option::Option<"))
        has_default = bool(re.search(r"\bdefault\b", serde))
        fields.append({"name": rename.group(1) if rename else field.group(1),
                       "rust_type": rtype,
                       "required": not (optional or has_default or container_default),
                       "source": f"{path}:{lineno}"})
        attrs = []
    return {"source": f"{path}:{start + 1}", "tuple": tuple_layout,
            "container_default": container_default, "fields": fields}


def extract_rust(sources: dict[str, str]) -> dict[str, Any] | None:
    rust_files = {p: t for p, t in sources.items() if p.startswith(RUST_PROTOCOL)}
    if not rust_files:
        return None
    structs: dict[str, Any] = {}
    for name in (*ARRAY_STRUCTS, READY):
        # Newer clients decode into a private `WireX` struct and classify it afterwards.
        found = [s for path in sorted(rust_files) for candidate in (f"Wire{name}", name)
                 if (s := _rust_struct(rust_files[path], path, candidate)) is not None]
        if not found:
            raise ExtractError(f"{RUST_PROTOCOL}: no struct {name} (or Wire{name})")
        structs[name] = found[0]
    ready = structs[READY]
    return {"structs": structs,
            "required_ready_keys": [f["name"] for f in ready["fields"] if f["required"]],
            "strict_arrays": all(structs[n]["tuple"] for n in ARRAY_STRUCTS)}


# ------------------------------------------------------------------ profile


def build_profile(release: Release, sources: dict[str, str]) -> dict[str, Any]:
    py = extract_python(sources)
    structs = py["structs"]
    layouts = {name: [f["name"] for f in structs[name]["fields"]] for name in ARRAY_STRUCTS}
    ready_fields = structs[READY]["fields"]
    return {
        "schema": SCHEMA,
        "name": f"vllm-{release.version}",
        "vllm_version": release.version,
        "release_date": release.upload_time,
        "release_date_source": f"PyPI upload time of {release.filename}",
        "sdist": {"filename": release.filename, "sha256": release.sha256},
        "generated_by": "scripts/gen_profiles.py",
        "array_lengths": {name: len(fields) for name, fields in layouts.items()},
        "ready_keys": [f["name"] for f in ready_fields],
        "required_ready_keys": [f["name"] for f in ready_fields if f["required"]],
        "structs": structs,
        "request_types": py["request_types"],
        "reserved_call_ids": py["reserved_call_ids"],
        "engine_dead_sentinel": py["engine_dead_sentinel"],
        "rust": extract_rust(sources),
    }


def render(profile: dict[str, Any]) -> str:
    return json.dumps(profile, indent=1, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", help="releases (default: all in range)")
    parser.add_argument("--check", action="store_true",
                        help="compare with the checked-in files instead of writing")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    stale: list[str] = []
    for release in list_releases(args.versions):
        try:
            profile = build_profile(release, read_sources(fetch(release)))
        except ExtractError as exc:
            print(f"vllm {release.version}: {exc}", file=sys.stderr)
            return 2
        target = args.out / f"{profile['name']}.json"
        text = render(profile)
        if args.check:
            if not target.exists() or target.read_text() != text:
                stale.append(target.name)
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        lengths = profile["array_lengths"]
        print(f"{target.relative_to(REPO_ROOT) if target.is_relative_to(REPO_ROOT) else target}:"
              f" request {lengths['EngineCoreRequest']}, output {lengths['EngineCoreOutput']},"
              f" outputs {lengths['EngineCoreOutputs']}, ready keys "
              f"{len(profile['ready_keys'])}")
    if stale:
        print(f"stale profiles (run make profiles): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
