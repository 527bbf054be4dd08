"""Regression gating for ports: compare a bench run with a saved one, figure by figure.

`--bench-baseline FILE` names a saved `bench.json`. Every figure present in both, for the
same frontend, scenario and row, must stay within a ratio of the saved value: more-is-better
figures (tokens/s) >= `min_ratio` x saved, costs (latencies, CPU per token, frames) <=
saved / `min_ratio`. A figure the saved run has but this run refused or lost is a failure
too (it can no longer be vouched for). Figures with no saved counterpart are not gated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from harness.bench.model import SCHEMA, higher_is_better

EXIT_OK = 0
EXIT_REGRESSION = 1
GATED = ("tokens_per_s", "_p50_ms", "_p99_ms", "frontend_cpu_s_per_mtok", "abort_frames",
         "all_aborted_ms", "first_served_ms")


@dataclass(frozen=True)
class Verdict:
    frontend: str
    scenario: str
    row: str
    figure: str
    saved: float
    now: float | None
    ratio: float | None  # >= 1: as good or better than saved
    ok: bool

    def line(self) -> str:
        now = "missing/refused" if self.now is None else f"{self.now:.4g}"
        ratio = "-" if self.ratio is None else f"{self.ratio:.2f}x"
        return (f"{'ok  ' if self.ok else 'FAIL'} {self.frontend} / {self.scenario} / "
                f"{self.row} / {self.figure}: saved {self.saved:.4g}, now {now} ({ratio})")


def load_baseline(path: str) -> dict[str, Any]:
    with open(path) as fh:
        doc: dict[str, Any] = json.load(fh)
    if doc.get("schema") != SCHEMA or "frontends" not in doc:
        raise ValueError(f"{path} is not a corewire bench result ({SCHEMA})")
    return doc


def _gated(figure: str) -> bool:
    return any(figure.endswith(g) for g in GATED)


def compare(saved: dict[str, Any], now: dict[str, Any], min_ratio: float = 0.9
            ) -> list[Verdict]:
    verdicts: list[Verdict] = []
    for spec, fdoc in now["frontends"].items():
        old = saved["frontends"].get(spec)
        if old is None:
            continue
        for sname, sdoc in fdoc["scenarios"].items():
            old_rows = {r["label"]: r for r in old["scenarios"].get(sname, {}).get("rows", [])}
            new_rows = {r["label"]: r for r in sdoc.get("rows", [])}
            for label, old_row in old_rows.items():
                new_row = new_rows.get(label, {"figures": {}})
                for figure, was in old_row["figures"].items():
                    if was is None or not _gated(figure) or was <= 0:
                        continue
                    value = new_row["figures"].get(figure)
                    if value is None:
                        verdicts.append(Verdict(spec, sname, label, figure, was, None, None,
                                                False))
                        continue
                    ratio = (value / was if higher_is_better(figure)
                             else (was / value if value > 0 else float("inf")))
                    verdicts.append(Verdict(spec, sname, label, figure, was, value, ratio,
                                            ratio >= min_ratio))
    return verdicts
