"""Smoke of `corewire bench`: every scenario against `reference`, tiny sizes, STRUCTURE only.

Nothing here asserts a speed (no timed unit tests): the keys, units and counts of the result
document, the files written (JSON, markdown, PNG plots), the refusal rule firing when the
engines are throttled, the baseline gate's verdicts on hand-made documents, and the CLI's
usage errors.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from harness.bench import SCENARIOS, BenchOptions, run_bench
from harness.bench.gate import compare
from harness.bench.model import BUSY_LIMIT, SCHEMA, percentile
from harness.bench.report import render_markdown, write_json, write_markdown, write_plots
from harness.run.cli import main

TINY = BenchOptions(concurrency=(1, 4), tokens_per_request=8, warmup_s=0.05, window_s=0.2,
                    repeat=2, latency_streams=2, latency_step_interval_s=0.01,
                    ttft_requests=3, utility_calls=3, utility_engines=(1, 2), abort_streams=20,
                    abort_step_interval_s=0.02, startup_runs=1, stream_timeout_s=20.0)

UNITS = ("_per_s", "_ms", "_mtok", "_frames", "_per_frame", "samples")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    lines: list[str] = []
    doc = run_bench(["reference"], list(SCENARIOS), TINY, log=lines.append)
    out = tmp_path_factory.mktemp("bench")
    write_json(doc, str(out))
    write_markdown(doc, str(out))
    write_plots(doc, str(out))
    doc["_progress"] = lines
    return doc, out


def test_every_scenario_reports_rows_with_units(smoke: tuple[dict[str, Any], Path]) -> None:
    doc, _ = smoke
    assert doc["schema"] == SCHEMA and doc["busy_limit"] == BUSY_LIMIT
    assert len(doc["load_before"]) == 3 and doc["machine"]["cores"]
    scenarios = doc["frontends"]["reference"]["scenarios"]
    assert list(scenarios) == list(SCENARIOS)
    expected_rows = {"throughput": 2, "token_latency": 1, "ttft": 1, "abort_storm": 1,
                     "utility": 2, "startup": 1}
    for name, scenario in scenarios.items():
        assert scenario["error"] is None, (name, scenario["error"])
        assert len(scenario["rows"]) == expected_rows[name], name
        for row in scenario["rows"]:
            assert row["figures"], name
            for figure, value in row["figures"].items():
                assert figure.endswith(UNITS), figure
                assert value is None or isinstance(value, float | int), figure
            if name != "startup":
                assert row["engine_busy"] is not None and row["engine_busy"] >= 0, name
            # A row may be refused on a machine busy enough to starve the engines (that
            # depends on the load, so it is not asserted away); a refused row has no figure.
            if row["refused"] is not None:
                assert row["engine_busy"] > BUSY_LIMIT
                assert all(v is None for v in row["figures"].values()) and not row["samples"]
    throughput = scenarios["throughput"]["rows"]
    assert [r["params"]["streams"] for r in throughput] == [1, 4]
    assert all(len(r["params"]["windows_tokens_per_s"]) == 2 for r in throughput)
    assert all(r["refused"] or r["figures"]["tokens_per_s"] > 0 for r in throughput)
    assert throughput[0]["params"]["cpu_scope"].startswith("harness process")
    abort = scenarios["abort_storm"]["rows"][0]
    assert not abort["notes"]  # every stream was aborted at the engine
    if not abort["refused"]:
        assert abort["figures"]["abort_frames"] >= 1
        assert abort["figures"]["all_aborted_ms"] is not None
    for name, key in (("token_latency", "token"), ("ttft", "ttft"), ("utility", "rtt")):
        row = scenarios[name]["rows"][0]
        assert {f"{key}_p50_ms", f"{key}_p99_ms", f"{key}_max_ms"} <= set(row["figures"])
        if not row["refused"]:
            assert row["samples"][f"{key}_ms"] == sorted(row["samples"][f"{key}_ms"])
    assert set(scenarios["startup"]["rows"][0]["figures"]) == {
        "registered_ms", "serving_ms", "first_served_ms"}
    assert all(v is not None for v in scenarios["startup"]["rows"][0]["figures"].values())
    assert any("throughput" in line and "streams" in line for line in doc["_progress"])


def test_files_written(smoke: tuple[dict[str, Any], Path]) -> None:
    doc, out = smoke
    names = set(os.listdir(out))
    assert {"bench.json", "bench.md"} <= names
    rows = doc["frontends"]["reference"]["scenarios"]["throughput"]["rows"]
    assert ("throughput.png" in names) == any(not r["refused"] for r in rows)
    kept = [row for name, scenario in doc["frontends"]["reference"]["scenarios"].items()
            if name != "startup" for row in scenario["rows"] if row["samples"]]
    assert bool(kept) == any(n.startswith("cdf-") for n in names)  # one per series kept
    for name in names:
        if name.endswith(".png"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "bench.json").read_text())
    assert saved["frontends"].keys() == doc["frontends"].keys()
    text = (out / "bench.md").read_text()
    assert "| throughput | 1 streams | tokens_per_s |" in text


def test_throttled_engines_are_refused() -> None:
    """Engines that spin 20 ms per step are the bottleneck: the figure must be withheld."""
    slow = dataclasses.replace(TINY, concurrency=(1,), repeat=1, window_s=0.3,
                               engine_step_cost_s=0.02)
    doc = run_bench(["reference"], ["throughput"], slow, log=lambda _line: None)
    row = doc["frontends"]["reference"]["scenarios"]["throughput"]["rows"][0]
    assert row["engine_busy"] > BUSY_LIMIT
    assert row["refused"] and "engines busy" in row["refused"]
    assert row["figures"] == {"tokens_per_s": None, "frontend_cpu_s_per_mtok": None}
    assert "REFUSED" in render_markdown(doc)


def _doc(tokens: float | None, p50: float | None) -> dict[str, Any]:
    rows = [{"label": "16 streams", "figures": {"tokens_per_s": tokens}},
            {"label": "is_sleeping", "figures": {"rtt_p50_ms": p50, "rtt_max_ms": 1.0}}]
    return {"schema": SCHEMA, "frontends": {"x": {"scenarios": {
        "throughput": {"rows": rows[:1]}, "utility": {"rows": rows[1:]}}}}}


def test_gate_ratios_both_directions() -> None:
    saved = _doc(1000.0, 2.0)
    assert all(v.ok for v in compare(saved, _doc(950.0, 2.2), 0.9))
    verdicts = {v.figure: v for v in compare(saved, _doc(800.0, 2.5), 0.9)}
    assert not verdicts["tokens_per_s"].ok and not verdicts["rtt_p50_ms"].ok
    assert "rtt_max_ms" not in verdicts  # max is too noisy to gate
    lost = {v.figure: v for v in compare(saved, _doc(None, 2.0), 0.9)}
    assert not lost["tokens_per_s"].ok and lost["tokens_per_s"].now is None
    assert compare(saved, {"schema": SCHEMA, "frontends": {"other": {"scenarios": {}}}}) == []


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([5.0], 99) == 5.0


def test_cli_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--scenarios", "nope", "--report-dir", str(tmp_path)]) == 4
    assert "unknown nope" in capsys.readouterr().err
    assert main(["bench", "--frontend", "bogus", "--report-dir", str(tmp_path)]) == 4
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["bench", "--bench-baseline", str(bad), "--report-dir", str(tmp_path)]) == 4
