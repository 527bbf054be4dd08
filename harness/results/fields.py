"""The field table: every field of every wire message -> the cases that check its value.

The data is fixtures/coverage/fields-<version>.toml (one `[[field]]` per field, written by
hand from reading the cases); the list of fields it must cover is not: the five structs come
from the protocol profile (fixtures/profiles/, read from the sdist), the other messages
from `OTHER_MESSAGES` below. `field_problems` is what tests/test_coverage_map.py asserts: every
field present once, every case real, an empty row explained, and every mutant a row names
caught (in the kill matrix) by one of the row's cases, so a claimed check is a proven one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The profile's structs, in the order the table shows them, and who sends each.
PROFILE_MESSAGES: tuple[tuple[str, str], ...] = (
    ("EngineCoreRequest", "frontend -> engine"),
    ("EngineCoreOutput", "engine -> frontend"),
    ("EngineCoreOutputs", "engine -> frontend"),
    ("UtilityOutput", "engine -> frontend"),
    ("EngineCoreReadyResponse", "engine -> frontend"),
)
# Messages without a struct in the profile: their fields as docs/spec.md Part 1 names them.
OTHER_MESSAGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("SamplingParams", "frontend -> engine",
     ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos",
      "min_tokens", "stop_token_ids", "stop", "_eos_token_id", "_all_stop_token_ids",
      "extra_args", "output_kind", "n", "logprobs", "detokenize")),
    ("ABORT", "frontend -> engine", ("request_ids", "identity")),
    ("UTILITY", "frontend -> engine", ("client_index", "call_id", "method", "args")),
    ("INIT", "frontend -> engine",
     ("addresses.inputs", "addresses.outputs", "addresses.coordinator_input",
      "addresses.coordinator_output", "addresses.frontend_stats_publish_address",
      "parallel_config")),
    ("START_DP_WAVE", "frontend coordinator -> engine", ("wave", "exclude_engine_index")),
    ("coordinator subscription", "frontend -> coordinator", ("subscribe_frame",)),
    ("ADD framing", "frontend -> engine", ("identity", "aux_frames")),
    ("HELLO", "engine -> frontend", ("status", "local", "headless")),
    ("READY", "engine -> frontend", ("status", "local", "headless", "parallel_config_hash")),
    ("coordinator publication", "coordinator -> frontend",
     ("counts", "current_wave", "engines_running")),
    ("SchedulerStats", "engine -> frontend",
     ("num_running_reqs", "num_waiting_reqs", "other keys")),
    ("ENGINE_CORE_DEAD", "engine -> frontend", ("sentinel",)),
    ("engine start_wave / wave_complete on the coordinator path", "engine -> coordinator",
     ("start_wave", "wave_complete")),
)


class FieldMapError(Exception):
    """The field map file is malformed (what is wrong and where is in the message)."""


@dataclass(frozen=True)
class FieldRow:
    """One field and what checks it."""

    message: str
    field: str
    cases: tuple[str, ...]
    mutants: tuple[str, ...]
    reason: str
    wanted: str  # "case.id: what it would check", or ""

    @property
    def wanted_id(self) -> str:
        return self.wanted.split(":", 1)[0].strip()


def load_fields(path: Path) -> list[FieldRow]:
    """The rows of a field map, in file order (tomllib: Python 3.11+, as the docs tooling;
    the installed harness never imports this module)."""
    import tomllib

    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise FieldMapError(f"{path}: {exc}") from exc
    rows = []
    for n, entry in enumerate(raw.get("field", []), 1):
        where = f"{path.name} field #{n}"
        unknown = set(entry) - {"message", "field", "cases", "mutants", "reason", "wanted"}
        if unknown or not isinstance(entry.get("message"), str) \
                or not isinstance(entry.get("field"), str):
            raise FieldMapError(f"{where}: needs message and field strings, no other keys "
                                f"than cases, mutants, reason, wanted (unknown: "
                                f"{sorted(unknown)})")
        lists = {k: entry.get(k, []) for k in ("cases", "mutants")}
        if not all(isinstance(v, list) and all(isinstance(x, str) for x in v)
                   for v in lists.values()):
            raise FieldMapError(f"{where}: cases and mutants are lists of strings")
        rows.append(FieldRow(entry["message"], entry["field"], tuple(lists["cases"]),
                             tuple(lists["mutants"]), str(entry.get("reason", "")),
                             str(entry.get("wanted", ""))))
    return rows


def expected_fields(profile: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every (message, field) the table must have: the profile's structs, then the rest."""
    out = [(name, f["name"]) for name, _ in PROFILE_MESSAGES
           for f in profile["structs"][name]["fields"]]
    out += [(name, field) for name, _, fields in OTHER_MESSAGES for field in fields]
    return out


def field_problems(rows: Sequence[FieldRow], expected: Sequence[tuple[str, str]],
                   levels: Mapping[str, str],
                   caught_by: Mapping[str, Sequence[str]]) -> list[str]:
    """What is wrong with the table (empty: nothing). `caught_by`: mutant -> the cases that
    catch it (fixtures/kill-matrix.json)."""
    problems = []
    keys = [(r.message, r.field) for r in rows]
    for key in expected:
        if keys.count(key) != 1:
            problems.append(f"{key[0]}.{key[1]}: {keys.count(key)} rows (want exactly 1)")
    problems += [f"{k[0]}.{k[1]}: not a field of the protocol" for k in keys
                 if k not in set(expected)]
    for r in rows:
        name = f"{r.message}.{r.field}"
        problems += [f"{name}: no case {c}" for c in r.cases if c not in levels]
        if not r.cases and not r.reason.strip():
            problems.append(f"{name}: no case and no reason why")
        for mutant in r.mutants:
            if mutant not in caught_by:
                problems.append(f"{name}: mutant {mutant} is not in the kill matrix")
            elif not set(caught_by[mutant]) & set(r.cases):
                problems.append(f"{name}: mutant {mutant} is caught by none of the row's "
                                f"cases (the kill matrix: {sorted(caught_by[mutant])[:4]})")
        if r.wanted and r.wanted_id in levels:
            problems.append(f"{name}: the wanted case {r.wanted_id} exists now: move it "
                            "into cases")
    return problems


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _strength(row: FieldRow, levels: Mapping[str, str]) -> str:
    found = {levels.get(c, "") for c in row.cases}
    return next((lvl for lvl in ("MUST", "SHOULD", "INFO") if lvl in found), "none")


def render_fields(rows: Sequence[FieldRow], levels: Mapping[str, str],
                  source: str) -> list[str]:
    """The field section of docs/coverage.md (lines)."""
    directions = {name: d for name, d in PROFILE_MESSAGES}
    directions.update({name: d for name, d, _ in OTHER_MESSAGES})
    order = [name for name, _ in PROFILE_MESSAGES[:1]] + ["SamplingParams"] + [
        name for name, _ in PROFILE_MESSAGES[1:]] + [
        name for name, _, _ in OTHER_MESSAGES if name != "SamplingParams"]
    by_message: dict[str, list[FieldRow]] = {}
    for r in rows:
        by_message.setdefault(r.message, []).append(r)
    counts = {lvl: sum(1 for r in rows if _strength(r, levels) == lvl)
              for lvl in ("MUST", "SHOULD", "INFO", "none")}
    out = ["", "## Fields: every field of every message x the cases that check its value", "",
           f"From `{source}` (checked by tests/test_coverage_map.py: every field of the "
           "protocol profile's structs and of the other messages present once, every case "
           "real, an empty row explained, and every mutant named caught by one of its row's "
           "cases in fixtures/kill-matrix.json). A case is listed only where it compares "
           "the field's VALUE with what the client asked (frontend -> engine) or checks what "
           "the client receives from it (engine -> frontend), strongest first; the last "
           "column says what those cases leave unchecked, or why no case can check the field.",
           "",
           f"**{len(rows)} fields: {counts['MUST']} checked by a MUST case, "
           f"{counts['SHOULD']} by a SHOULD case only, {counts['INFO']} recorded by an INFO "
           f"case only, {counts['none']} by no case (each with the reason).**", "",
           "| message | direction | fields | MUST | SHOULD only | INFO only | none |",
           "|---|---|---|---|---|---|---|"]
    for name in order:
        group = by_message.get(name, [])
        got = [_strength(r, levels) for r in group]
        out.append(f"| {name} | {directions[name]} | {len(group)} | {got.count('MUST')} | "
                   f"{got.count('SHOULD')} | {got.count('INFO')} | {got.count('none')} |")
    for name in order:
        out += ["", f"### {name} ({directions[name]})", "",
                "| field | cases | mutants caught by them | unchecked / why no case |",
                "|---|---|---|---|"]
        for r in by_message.get(name, []):
            cases = "<br>".join(f"`{c}` ({levels.get(c, 'MISSING')})" for c in r.cases)
            mutants = ", ".join(f"`{m}`" for m in r.mutants)
            notes = _cell(r.reason)
            if r.wanted:
                notes = (notes + "<br>" if notes else "") + "wanted: " + _cell(r.wanted)
            out.append(f"| `{r.field}` | {cases or '-'} | {mutants or '-'} | {notes or '-'} |")
    return out
