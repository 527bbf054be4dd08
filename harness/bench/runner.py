"""Run the bench scenarios against each frontend in turn and collect one result document."""

from __future__ import annotations

import asyncio
import datetime
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

from harness.bench.control import run_abort_storm, run_startup, run_utility
from harness.bench.frontend_under_load import BenchOptions
from harness.bench.latency import run_token_latency, run_ttft
from harness.bench.model import BUSY_LIMIT, SCHEMA, Scenario, scenario_to_json
from harness.bench.throughput import run_throughput

ScenarioFn = Callable[[str, BenchOptions, Callable[[str], None]], Coroutine[Any, Any, Scenario]]

SCENARIOS: dict[str, ScenarioFn] = {
    "throughput": run_throughput,
    "token_latency": run_token_latency,
    "ttft": run_ttft,
    "abort_storm": run_abort_storm,
    "utility": run_utility,
    "startup": run_startup,
}


def machine() -> dict[str, Any]:
    import msgspec
    import zmq

    return {"platform": platform.platform(), "machine": platform.machine(),
            "cores": os.cpu_count(), "python": platform.python_version(),
            "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(),
            "msgspec": msgspec.__version__}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _one(spec: str, name: str, options: BenchOptions, say: Callable[[str], None]
         ) -> Scenario:
    """One scenario against one frontend; a failure is recorded with its error."""
    t0 = time.monotonic()

    def progress(line: str) -> None:
        say(f"[bench] {spec}: {line}")

    try:
        scenario = asyncio.run(SCENARIOS[name](spec, options, progress))
    except Exception as exc:  # recorded; the run goes on with the next scenario
        scenario = Scenario(name, error=f"{type(exc).__name__}: {exc}")
        say(f"[bench] {spec}: {name} FAILED: {scenario.error}")
        if os.environ.get("COREWIRE_BENCH_TRACE"):
            traceback.print_exc()
    scenario.seconds = round(time.monotonic() - t0, 2)
    return scenario


def run_bench(frontends: list[str], scenarios: list[str], options: BenchOptions,
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every scenario against every frontend (one frontend at a time, fresh processes per
    scenario); a scenario that fails is recorded with its error, the others still run."""
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    doc: dict[str, Any] = {
        "schema": SCHEMA, "partial": False,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "load_before": _load(), "busy_limit": BUSY_LIMIT,
        "options": {k: v for k, v in vars(options).items() if k not in ("extra", "timescale")},
        "scenarios": scenarios, "frontends": {},
    }
    try:
        for spec in frontends:
            results: dict[str, Any] = {}
            doc["frontends"][spec] = {"scenarios": results}
            for name in scenarios:
                say(f"[bench] {spec}: {name} ...")
                results[name] = scenario_to_json(_one(spec, name, options, say))
    except KeyboardInterrupt:  # Ctrl-C: keep what finished, say the run is partial
        doc["partial"] = True
        say("[bench] interrupted: the report holds the scenarios that finished")
    doc["load_after"] = _load()
    return doc
