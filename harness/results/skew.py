"""Version skew: mock engines of release P behind a frontend of release R, classified.

A rolling upgrade runs old engines behind a new frontend (or the reverse) for a while. The
skew grid runs a small fixed selection of cases for every frontend F and engine profile P
(`--frontend F --profile vllm-P`) and sorts each combination into one of three outcomes, read
from the verdict messages of its results.json (never hard-coded per release):

* works: every case's verdict is the one the same frontend gets against its own engines
  (the matched run; vllm-0.22.1's own is_sleeping FAIL is not a skew failure);
* refused at startup: every case failed to start the frontend; the cell names the first line
  of the refusal (a missing ready key, a decode failure);
* garbage later: the frontend started, then a case's verdict differs from the matched run
  (streams failed to decode, a reply went missing).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from harness.frontends.vllm_rs.releases import INSTALLED, PREFIX, parse_version

# Engine profiles and vllm-rs releases of the grid: one release per protocol change.
SKEW_RELEASES = ("0.22.1", "0.23.0", "0.24.0", "0.26.0", "0.28.0", "0.29.0", "0.31.0",
                 "0.32.0", "0.33.0")
# The frontends that are not a vllm-rs release speak the installed release's protocol.
OTHER_FRONTENDS = ("vllm-py", "reference")
# Fast cases that together show "works": the ready handshake, three stream endings over two
# engines (outputs decoded and routed), and a utility call answered by each engine.
SKEW_CASES = ("handshake.register.all_engines",
              "streaming.finish_kinds.length_2_engines",
              "streaming.finish_kinds.stop_token_id_2_engines",
              "streaming.finish_kinds.abort_mid_2_engines",
              "dp.is_sleeping.disagree_reversed")
NOT_STARTED = "frontend did not start"
MAX_DETAIL = 150


class Kind(Enum):
    """How a combination of frontend and engine profile behaved."""

    WORKS = "works"
    REFUSED = "refused at startup"
    GARBAGE = "garbage later"


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    detail: str = ""  # the refusal's first line, or the differing case and its message


def skew_frontends(releases: Sequence[str] = SKEW_RELEASES) -> tuple[str, ...]:
    return (*(f"{PREFIX}{r}" for r in releases), *OTHER_FRONTENDS)


def native_release(frontend: str) -> str:
    """The release whose protocol `frontend` speaks (its matched engine profile)."""
    return frontend.removeprefix(PREFIX) if frontend.startswith(PREFIX) else INSTALLED


def frontend_dir(frontend: str) -> str:
    """reports/history/skew/<this>/<profile>/: the bare release for vllm-rs@R."""
    return frontend.removeprefix(PREFIX)


def selection() -> str:
    """The pytest -k expression of SKEW_CASES (classify() keeps exact ids only)."""
    return " or ".join(SKEW_CASES)


_RUST_LOG_PREFIX = re.compile(r"^\(\w+ pid=\d+\) \w+ [\d\- :]+\[[^\]]*\] ")
_RUST_PATH = re.compile(r"\b(?:\w+::)+(\w+)")


def first_line(message: str) -> str:
    """The line of a verdict message that says what went wrong, shortened for a table.

    A Rust error chain ("failed to connect ... Caused by: <reason>") gives its first cause;
    otherwise the first line, without the "frontend did not start:" prefix and log prefixes.
    """
    text = message.removeprefix(f"{NOT_STARTED}: ")
    lines = [line.strip() for line in text.splitlines()]
    line = lines[0] if lines else ""
    if "Caused by:" in lines:
        after = lines[lines.index("Caused by:") + 1:]
        line = next((x for x in after if x), line)
    line = _RUST_LOG_PREFIX.sub("", line)
    line = _RUST_PATH.sub(r"\1", line).split("; value fallback", 1)[0].rstrip(";")
    return line if len(line) <= MAX_DETAIL else line[:MAX_DETAIL - 1] + "…"


def _selected(rows: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {row["id"]: row for row in rows if row["id"] in SKEW_CASES}


def classify(rows: Sequence[Mapping[str, Any]],
             matched: Sequence[Mapping[str, Any]] | None) -> Outcome | None:
    """One combination's outcome from its result rows and the matched run's (same frontend,
    its own profile); None when the selection did not run. Without a matched run, "works"
    means every case passed or was not observable."""
    got = _selected(rows)
    if not got:
        return None
    ran = [row for row in got.values() if row["verdict"] != "UNSUPPORTED"]
    if ran and all(str(row["message"]).startswith(NOT_STARTED) for row in ran):
        return Outcome(Kind.REFUSED, first_line(str(ran[0]["message"])))
    expected = _selected(matched or [])
    for case_id in SKEW_CASES:
        row = got.get(case_id)
        if row is None:
            continue
        want = expected[case_id]["verdict"] if case_id in expected else None
        ok = (row["verdict"] == want if want is not None
              else row["verdict"] in ("PASS", "NON-STRICT", "INFO", "UNSUPPORTED"))
        if not ok:
            # "expected ...; observed ..." messages: what was observed says what broke.
            observed = str(row["message"]).split("; observed ", 1)[-1]
            return Outcome(Kind.GARBAGE, f"{case_id} {row['verdict']}: {first_line(observed)}")
    return Outcome(Kind.WORKS)


# (frontend, engine release) -> that combination's rows for that frontend
SkewRuns = Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]


def load_skew(root: Path) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every root/<frontend dir>/<release>/results.json, keyed by (frontend, release)."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for results in sorted(root.glob("*/*/results.json")):
        release = results.parent.name
        if results.parent.parent.name.startswith("_"):
            continue  # the raw per-profile runs
        doc = json.loads(results.read_text())
        for row in doc["results"]:
            out.setdefault((row["frontend"], release), []).append(row)
    return out


def _order(frontend: str) -> tuple[int, tuple[int, int, int], str]:
    if frontend.startswith(PREFIX):
        return 0, parse_version(frontend.removeprefix(PREFIX)), frontend
    return 1, (0, 0, 0), frontend


def _range(releases: Sequence[str]) -> str:
    return ", ".join(releases) if releases else "none"


def render_skew(skew: SkewRuns) -> list[str]:
    """The "## Version skew" section of docs/history.md (empty when nothing ran)."""
    if not skew:
        return []
    frontends = sorted({f for f, _ in skew}, key=_order)
    profiles = sorted({p for _, p in skew}, key=parse_version)
    notes: dict[str, int] = {}
    grid: dict[tuple[str, str], Outcome] = {}
    for frontend in frontends:
        for profile in profiles:
            rows = skew.get((frontend, profile))
            outcome = classify(rows, skew.get((frontend, native_release(frontend)))) \
                if rows else None
            if outcome is not None:
                grid[frontend, profile] = outcome
                if outcome.detail:
                    notes.setdefault(f"{outcome.kind.value}: {outcome.detail}", len(notes) + 1)
    lines = [
        "## Version skew", "",
        "Mock engines speaking release P's protocol (columns, `--profile vllm-P`) behind a "
        "frontend (rows: `vllm-rs@R` is release R's binary; vllm-py and reference are 0.33.0 "
        "frontends). Generated by `scripts/history.py --skew` (reports/history/skew/) from the "
        f"cases {', '.join(f'`{c}`' for c in SKEW_CASES)}. The matched combination (the "
        "frontend's own release) is the yardstick.", "",
        "Legend: **works** every case gets the verdict of the matched combination; "
        "**refused** every case failed at startup, with the refusal [n] below; **garbage** the "
        "frontend started and a case then differed from the matched combination [n]; blank: "
        "not run. *(matched)* marks the frontend's own release.", "",
        "| frontend \\ engines | " + " | ".join(profiles) + " |",
        "|---|" + "---|" * len(profiles)]
    for frontend in frontends:
        cells = []
        for profile in profiles:
            outcome = grid.get((frontend, profile))
            cell = "" if outcome is None else f"**{outcome.kind.value.split()[0]}**"
            if outcome is not None and outcome.detail:
                cell += f" [{notes[f'{outcome.kind.value}: {outcome.detail}']}]"
            if outcome is not None and profile == native_release(frontend):
                cell += " *(matched)*"
            cells.append(cell)
        lines.append(f"| {frontend} | " + " | ".join(cells) + " |")
    lines += [""] + [f"{n}. {text.replace('|', '/')}" for text, n in notes.items()]
    lines += ["", "### What it means for a rolling upgrade", ""]
    newer_engines = [k for k in grid if parse_version(k[1]) > parse_version(native_release(k[0]))]
    older_engines = [k for k in grid if parse_version(k[1]) < parse_version(native_release(k[0]))]
    for label, keys in (("Frontends first (newer frontend, older engines)", older_engines),
                        ("Engines first (older frontend, newer engines)", newer_engines)):
        works = sum(grid[k].kind is Kind.WORKS for k in keys)
        refused = sum(grid[k].kind is Kind.REFUSED for k in keys)
        later = len(keys) - works - refused
        verdict = ("" if not refused + later else
                   " Every mismatch is refused before serving: it fails safe." if not later else
                   " A mismatch starts serving and then fails requests: it fails late.")
        lines.append(f"- {label}: {works} of {len(keys)} combinations work, {refused} are "
                     f"refused at startup, {later} break later.{verdict}")
    lines.append("")
    for frontend in frontends:
        ok = [p for p in profiles if (frontend, p) in grid
              and grid[frontend, p].kind is Kind.WORKS]
        lines.append(f"- {frontend} works with engines of: {_range(ok)}.")
    return lines


__all__ = ["Kind", "OTHER_FRONTENDS", "Outcome", "SKEW_CASES", "SKEW_RELEASES", "classify",
           "first_line", "frontend_dir", "load_skew", "native_release", "render_skew",
           "selection", "skew_frontends"]
