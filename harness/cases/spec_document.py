"""docs/spec.md: vLLM's engine-core wire protocol as of 0.33.0, written down (RFC 2119 form).

Part 1, the wire, is rendered from the protocol profile (fixtures/profiles/vllm-0.33.0.json:
every struct, field, type, default and request type byte, each with the sdist line it was
read from) around short fixed prose. Part 2, the behaviour, is rendered from the cases
themselves: every requirement with its id, level, text, basis and checked grounds
(harness.cases.grounds), and which frontends and vllm-rs releases hold it, read from the committed
docs/compliance.md and docs/history.md tables. Nothing here is written by hand twice: a case
that changes level or grounds changes the spec, and tests/test_spec_doc.py fails on a stale
file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from harness.cases.declaration import CaseSpec
from harness.cases.grounds import Basis, Impl
from harness.locations import IMPORT_ROOT

REPO = str(IMPORT_ROOT) + "/"  # requirement texts name fixtures
RELEASE = re.compile(r"\d+\.\d+\.\d+")
LEVEL_WORD = {"MUST": "MUST", "SHOULD": "SHOULD", "INFO": "MAY (recorded, not judged)"}
BASIS_TEXT = {
    Basis.BOTH: "both 0.33.0 frontends hold it",
    Basis.DEFECT: "one frontend holds it; the other's deviation is a defect",
    Basis.ONLY: "only one frontend has the feature; it holds the rule and the engine relies "
                "on it",
    Basis.DIFFER: "the frontends deliberately differ",
    Basis.RECOMMENDATION: "neither frontend holds it: corewire's recommendation",
}
SHORT = {"PASS": "holds", "NON-STRICT": "does not hold (SHOULD)", "FAIL": "FAILS",
         "n/a": "not observable through its surface", "INFO": "recorded",
         "ERROR": "ERROR", "TIMEOUT": "TIMEOUT", "NOT-RUN": "not run", "": "not run"}
AREA_TITLES = {"handshake": "Startup: handshake, registration and the ready response",
               "dp": "Data parallelism: routing, load, waves, the DP coordinator, fan-out",
               "abort": "Aborts", "failure": "Failure semantics",
               "streaming": "Streaming outputs, finish kinds, sessions",
               "utility": "Utility calls"}


def markdown_table(text: str, first: str = "case") -> dict[str, dict[str, str]]:
    """The rows of the first markdown table whose header starts with `first`, by first cell
    (cells stripped of ** emphasis)."""
    rows: dict[str, dict[str, str]] = {}
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            if header is not None and rows:
                break
            continue
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if header is None:
            if cells and cells[0] == first:
                header = cells
            continue
        if set(line) <= set("|-: "):
            continue
        rows[cells[0]] = dict(zip(header, cells, strict=False))
    return rows


def _runs(cells: Sequence[tuple[str, str]]) -> str:
    """'0.22.0-0.23.0 F, 0.24.0-0.33.0 P' from [(release, mark), ...]."""
    out: list[str] = []
    start = 0
    for i in range(1, len(cells) + 1):
        if i == len(cells) or cells[i][1] != cells[start][1]:
            first, last, mark = cells[start][0], cells[i - 1][0], cells[start][1]
            out.append(f"{first}{'' if first == last else '-' + last} {mark or '?'}")
            start = i
    return ", ".join(out)


def _field_rows(struct: Mapping[str, Any]) -> list[str]:
    rows = ["| # | field | type | default | source |", "|---|---|---|---|---|"]
    for i, f in enumerate(struct["fields"]):
        if f.get("required"):
            default = "required"
        elif "default_factory" in f:
            default = f"`{f['default_factory']}()`"
        else:
            default = f"`{f.get('default')!r}`".replace("None", "nil")
        kind = str(f["type"]).replace("|", "\\|")
        rows.append(f"| {i} | `{f['name']}` | `{kind}` | {default} | {f['source']} |")
    return rows


def render_wire(profile: Mapping[str, Any]) -> list[str]:
    """Part 1 from the protocol profile."""
    structs = profile["structs"]
    rust = profile.get("rust", {}).get("structs", {})
    lines = ["## Part 1. The wire", "",
             f"Every table below is read from the vLLM {profile['vllm_version']} sdist "
             f"(`{profile['sdist']['filename']}`, sha256 `{profile['sdist']['sha256'][:16]}...`) "
             "by scripts/gen_profiles.py; the source column is the line each fact comes from.",
             "",
             "### 1.1 Sockets and identities", "",
             "| socket | frontend | engine | carries |", "|---|---|---|---|",
             "| handshake (frontend-launched deployments) | ROUTER, bind | DEALER, connect | "
             "HELLO, INIT (the addresses), READY: msgpack maps |",
             "| input | ROUTER, bind (one per frontend client) | DEALER, connect | "
             "`[identity, type byte, msgpack, aux...]` (the ROUTER adds/strips the identity) |",
             "| output | PULL, bind | PUSH, connect | `[msgpack EngineCoreOutputs, aux...]` or the "
             "one-frame ENGINE_CORE_DEAD sentinel |",
             "| coordinator back publish | - | XSUB, connect | `[b\"\\x01\"]` subscription; "
             "`READY`; START_DP_WAVE `[b\"\\x02\", msgpack [wave, exclude_engine_index]]` |",
             "| coordinator back output | - | PUSH, connect | EngineCoreOutputs with only stats "
             "and wave fields |",
             "| coordinator front publish | XSUB, connect (DP clients) | - | "
             "`[counts \\| nil, current_wave, engines_running]` |", "",
             "An engine's identity is its data-parallel rank as 2 bytes, little-endian (rank 1 "
             "is `01 00`); the same identity is used on the handshake and input sockets. A "
             "frontend MUST address every request frame to the identity of the engine it "
             "routes the request to; which identities it accepts at startup is in Part 2 "
             "(`handshake.register.*`, `handshake.engine_index.*`, `handshake.mode.*`).", "",
             "### 1.2 The handshake (a frontend that launches its engines)", "",
             "Each message is one msgpack map on the handshake socket, in this order per "
             "engine:", "",
             "| message | direction | keys | source |", "|---|---|---|---|",
             "| HELLO | engine -> frontend | `status: \"HELLO\"`, `local`, `headless` | "
             "vllm/v1/engine/core.py:1411 |",
             "| INIT | frontend -> engine | `addresses` (`inputs`, `outputs`, "
             "`coordinator_input`, `coordinator_output`, `frontend_stats_publish_address`), "
             "`parallel_config` | vllm/v1/engine/utils.py:100, :139, :1517 |",
             "| READY | engine -> frontend | `status: \"READY\"`, `local`, `headless`, "
             "`parallel_config_hash` (checked for coordinated MoE DP), optional "
             "`coord_store_port`, `elastic_ep_max_dp_size`, `num_redundant_experts` | "
             "vllm/v1/engine/core.py:1378, utils.py:1552 |", "",
             "The engine then connects its input and output sockets to the INIT addresses and "
             "sends the ready response (1.8) as its first output. A frontend handed its "
             "engines' addresses instead (`client_addresses`, the Rust client's bootstrapped "
             "mode) skips HELLO/INIT/READY and waits for the ready responses alone.", "",
             "### 1.3 Request types (frontend -> engine)", "",
             "The first frame after the identity is one byte:", "",
             "| type | byte | source |", "|---|---|---|"]
    for name, rt in profile["request_types"].items():
        lines.append(f"| `{name}` | `0x{rt['byte']}` | {rt['source']} |")
    lines += ["", "`EXECUTOR_FAILED` and `WAKEUP` are engine-internal: a frontend MUST NOT send "
              "them. ABORT's payload is a msgpack array of request ids (never empty). UTILITY's "
              "payload is `[client_index, call_id, method_name, args]`; call ids "
              + ", ".join(f"{v['value']} (`{k}`, {v['source']})"
                          for k, v in profile["reserved_call_ids"].items())
              + " are reserved for engine-initiated notifications.", ""]
    for number, name in enumerate(("EngineCoreRequest", "EngineCoreOutputs", "EngineCoreOutput",
                                   "UtilityOutput"), start=4):
        struct = structs[name]
        options = struct.get("options", {})
        shape = "an array (`array_like`)" if options.get("array_like") else "a map"
        omit = ", trailing defaults omitted" if options.get("omit_defaults") else ""
        length = profile["array_lengths"].get(name)
        lines += [f"### 1.{number} `{name}` ({struct['source']})", "",
                  f"Encoded as {shape}{omit}"
                  + (f", {length} elements" if length else "") + ". "
                  + (f"The Rust client's struct: {rust[name]['source']}."
                     if name in rust else ""), ""]
        lines += _field_rows(struct) + [""]
    ready = structs["EngineCoreReadyResponse"]
    lines += [f"### 1.8 The ready response ({ready['source']})", "",
              "The first message an engine sends each frontend, on its input socket (the "
              "engine's DEALER: the frontend's ROUTER reads it as `[identity, payload]` and so "
              "learns the engine's identity). Keys "
              "(a msgpack map):", ""]
    lines += _field_rows(ready) + [""]
    required = profile["required_ready_keys"]
    rust_required = profile.get("rust", {}).get("required_ready_keys", [])
    lines += [f"The Python client requires {len(required)} keys; the Rust client requires "
              f"{', '.join(f'`{k}`' for k in rust_required) or 'none beyond its struct'}. "
              "A frontend MUST take `max_model_len` as the minimum over engines, "
              "`num_gpu_blocks` as the sum, and refuse to start on a ready response it cannot "
              "decode (Part 2, `handshake.ready.*`).", "",
              "### 1.9 Utility results and engine death", "",
              "A utility answer is an EngineCoreOutputs whose `utility_output` is "
              "`[call_id, failure_message | nil, [type_info, value] | nil]`; `type_info` is nil "
              "unless the engine was started with insecure serialization. An engine that dies "
              "sends the one frame `" + profile["engine_dead_sentinel"]["value"] + "` ("
              + profile["engine_dead_sentinel"]["source"] + ") on every output socket; a "
              "frontend MUST fail every open stream and pending call (Part 2, `failure.*`).", ""]
    return lines


def _grounds_lines(spec: CaseSpec) -> list[str]:
    grounds = spec.grounds
    if grounds is None:
        return ["  - grounds: none (a component contract: " + spec.source + ")"]
    out = [f"  - basis: **{grounds.basis.value}** ({BASIS_TEXT[grounds.basis]})"
           + (f": {grounds.note}" if grounds.note else "")]
    for impl in Impl:
        cites = grounds.of(impl)
        if cites:
            out.append(f"  - {impl.value}: " + "; ".join(c.render() for c in cites))
    return out


def render_behaviour(specs: Mapping[str, CaseSpec], compliance: Mapping[str, Mapping[str, str]],
                     history: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Part 2: every requirement, by area and topic."""
    lines = ["## Part 2. The behaviour", "",
             "Each requirement is one conformance case: `corewire run -k <id>` tests it. "
             "Levels follow one rule: MUST only where both 0.33.0 frontends hold the behaviour "
             "(`both`), where one holds it and the other's deviation is a defect (`defect`: a "
             "hang, a crash, lost or corrupted data, an engine left in a wrong state), or "
             "where only one frontend has the feature and the engine relies on the rule "
             "(`only`); SHOULD where they deliberately differ (`differ`) or neither holds it "
             "(`recommendation`), and where both send a value nothing reads (a default no "
             "engine relies on); INFO records without judging. Every citation is checked "
             "against the sdist by make test (tests/test_grounds.py). \"Held by\" is the last "
             "compliance run (docs/compliance.md) and, for vllm-rs, every release 0.22.0-0.33.0 "
             "(docs/history.md: P pass, N non-strict, F fail, - not observable, I info).", ""]
    levels = {lv: sum(1 for s in specs.values() if s.level.value == lv)
              for lv in ("MUST", "SHOULD", "INFO")}
    lines += [f"{len(specs)} requirements: {levels['MUST']} MUST, {levels['SHOULD']} SHOULD, "
              f"{levels['INFO']} INFO.", ""]
    by_area: dict[str, dict[str, list[CaseSpec]]] = {}
    for spec in specs.values():
        topic = spec.case_id.split(".")[1]
        by_area.setdefault(spec.area, {}).setdefault(topic, []).append(spec)
    for number, area in enumerate(sorted(by_area, key=lambda a: list(AREA_TITLES).index(a)
                                         if a in AREA_TITLES else 99), start=1):
        lines += [f"### 2.{number} {AREA_TITLES.get(area, area)}", ""]
        for topic in sorted(by_area[area]):
            lines += [f"#### `{area}.{topic}`", ""]
            for spec in sorted(by_area[area][topic], key=lambda s: s.case_id):
                lines.append(f"- **`{spec.case_id}`** ({LEVEL_WORD[spec.level.value]}): "
                             f"{' '.join(spec.requirement.replace(REPO, '').split())}")
                lines += _grounds_lines(spec)
                row = compliance.get(spec.case_id, {})
                held = [f"{f} {SHORT.get(row.get(f, ''), row.get(f, ''))}"
                        for f in ("vllm-py", "vllm-rs") if f in row]
                releases = history.get(spec.case_id)
                if releases:
                    marks = [(k, v) for k, v in releases.items() if RELEASE.fullmatch(k)]
                    held.append("vllm-rs releases: " + _runs(marks))
                lines.append("  - held by: " + ("; ".join(held) if held else
                                                "not in the last compliance run"))
            lines.append("")
    return lines


def render_spec(profile: Mapping[str, Any], specs: Mapping[str, CaseSpec],
                compliance_md: str, history_md: str) -> str:
    compliance = markdown_table(compliance_md)
    history = markdown_table(history_md.split("## Every case", 1)[-1])
    lines = ["# The vLLM engine-core wire protocol (as of vLLM "
             f"{profile['vllm_version']})", "",
             "Generated by `make spec` (scripts/gen_spec.py) from the protocol profile and the "
             "conformance cases; do not edit by hand. The key words MUST, MUST NOT, SHOULD and "
             "MAY are to be read as in RFC 2119. The protocol links an LLM-serving frontend "
             "(vLLM's Python `AsyncLLM` / `core_client`, the Rust `vllm-rs`, or a port) with "
             "its engine cores over ZMQ with msgpack payloads; vLLM itself documents it "
             "nowhere else. A port author gates a frontend against it with corewire "
             "(docs/driver-protocol.md).", ""]
    lines += render_wire(profile)
    lines += render_behaviour(specs, compliance, history)
    return "\n".join(lines).rstrip() + "\n"
