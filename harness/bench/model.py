"""What a bench run produces: scenarios of rows of figures, each with the engines' load.

A figure's unit is the suffix of its name (`_per_s`, `_ms`, `_s`, `_frames`...). A row taken
while the engines were busy more than `BUSY_LIMIT` of the time is refused: its figures are
withheld and the reason kept, because it would measure the engines, not the frontend.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

# Engine thread running-or-runnable time / wall above this: the engines may be the bottleneck.
BUSY_LIMIT = 0.8
SCHEMA = "corewire-bench/1"
# Figures where more is better; every other figure (latencies, CPU, frames) is a cost.
HIGHER_IS_BETTER = ("tokens_per_s",)
SAMPLE_CAP = 2000  # latency samples kept per series (for CDF plots), evenly thinned


@dataclass
class Row:
    """One measurement of one scenario (e.g. throughput at 16 streams)."""

    label: str
    figures: dict[str, float | None] = field(default_factory=dict)
    engine_busy: float | None = None  # max over engines: running or runnable / wall
    refused: str | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)  # ms, for CDFs
    notes: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)

    def refuse_if_engines_busy(self) -> None:
        """Withhold every figure of a row taken while the engines were the bottleneck."""
        if self.engine_busy is not None and self.engine_busy > BUSY_LIMIT:
            self.refused = (f"engines busy {self.engine_busy:.2f} > {BUSY_LIMIT}: the mock "
                            "engines, not the frontend, may have limited this figure")
            self.figures = {k: None for k in self.figures}
            self.samples = {}

    def add_samples(self, name: str, values: list[float]) -> None:
        if len(values) > SAMPLE_CAP:
            step = len(values) / SAMPLE_CAP
            values = [sorted(values)[int(i * step)] for i in range(SAMPLE_CAP)]
        self.samples[name] = sorted(values)


@dataclass
class Scenario:
    name: str
    rows: list[Row] = field(default_factory=list)
    error: str | None = None  # the scenario could not run to the end (what failed)
    seconds: float = 0.0


def higher_is_better(figure: str) -> bool:
    return figure.endswith(HIGHER_IS_BETTER)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of values; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[rank]


def latency_figures(prefix: str, values_ms: list[float]) -> dict[str, float | None]:
    return {f"{prefix}_p50_ms": percentile(values_ms, 50),
            f"{prefix}_p99_ms": percentile(values_ms, 99),
            f"{prefix}_max_ms": max(values_ms) if values_ms else None}


def scenario_to_json(scenario: Scenario) -> dict[str, Any]:
    return asdict(scenario)
