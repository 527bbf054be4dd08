"""Control-path scenarios: abort storm, utility round trip, startup.

* abort storm: N streams running (the engines step slowly), the client drops all of them at
  once; time until the last ABORT reached an engine (the engine's own receive time) and how
  many ABORT frames carried them;
* utility round trip: `is_sleeping` called one after another, with 1 and with 4 engines (the
  frontend must fan out and aggregate);
* startup: frontend start -> every engine registered -> serving (the driver's start returned)
  -> first request served.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from harness.bench.frontend_under_load import BenchFrontend, BenchOptions
from harness.bench.model import Row, Scenario, latency_figures
from harness.frontends.api import StreamHandle
from mock_engines.loadgen import LoadMode

Progress = Callable[[str], None]


async def run_abort_storm(spec: str, options: BenchOptions, progress: Progress) -> Scenario:
    scenario = Scenario("abort_storm")
    n = options.abort_streams
    mode = LoadMode(step_interval=options.abort_step_interval_s)
    row = Row(f"drop {n} streams", params={"streams": n})
    async with BenchFrontend(spec, 1, mode, options) as fe:
        handles: list[StreamHandle] = [await fe.generate(100_000) for _ in range(n)]
        deadline = time.monotonic() + options.stream_timeout_s
        while (sum(s.requests_added for s in fe.stats) < n
               or not all(h.first_output.is_set() for h in handles)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {sum(s.requests_added for s in fe.stats)}/{n} "
                                   "streams reached the engine and streamed")
            await asyncio.sleep(0.01)
        meter = fe.meter()
        counters = [e.transcript.counters for e in fe.group.engines]
        frames0 = sum(c.abort_frames for c in counters)
        t0 = time.monotonic()
        await fe.driver.drop(handles)
        while sum(s.requests_aborted for s in fe.stats) < n:
            if time.monotonic() > t0 + options.stream_timeout_s:
                break
            await asyncio.sleep(0.002)
        aborted = sum(s.requests_aborted for s in fe.stats)
        row.engine_busy = meter.busy()
        frames = sum(c.abort_frames for c in counters) - frames0
        ids = sum(c.aborted_ids for c in counters)
        last = max(c.last_abort_t for c in counters)
    row.figures["all_aborted_ms"] = (last - t0) * 1000.0 if aborted == n else None
    row.figures["abort_frames"] = float(frames)
    row.figures["ids_per_frame"] = ids / frames if frames else None
    if aborted < n:
        row.notes.append(f"only {aborted}/{n} streams were aborted at the engines within "
                         f"{options.stream_timeout_s:.0f} s")
    row.refuse_if_engines_busy()
    scenario.rows.append(row)
    ms = row.figures["all_aborted_ms"]
    progress(f"abort storm: {aborted}/{n} aborted"
             + (f" in {ms:.1f} ms" if ms is not None else "")
             + f", {frames} ABORT frame(s)")
    return scenario


async def run_utility(spec: str, options: BenchOptions, progress: Progress) -> Scenario:
    scenario = Scenario("utility")
    for engines in options.utility_engines:
        row = Row(f"is_sleeping, {engines} engine(s)",
                  params={"engines": engines, "calls": options.utility_calls})
        async with BenchFrontend(spec, engines, LoadMode(), options) as fe:
            await fe.driver.is_sleeping()  # warm-up
            meter = fe.meter()
            times: list[float] = []
            for _ in range(options.utility_calls):
                t0 = time.monotonic()
                await fe.driver.is_sleeping()
                times.append((time.monotonic() - t0) * 1000.0)
            row.engine_busy = meter.busy()
        row.figures.update(latency_figures("rtt", times))
        row.add_samples("rtt_ms", times)
        row.refuse_if_engines_busy()
        scenario.rows.append(row)
        progress(f"utility is_sleeping, {engines} engine(s): p50 "
                 f"{row.figures['rtt_p50_ms'] or 0:.2f} ms, p99 "
                 f"{row.figures['rtt_p99_ms'] or 0:.2f} ms")
    return scenario


async def run_startup(spec: str, options: BenchOptions, progress: Progress) -> Scenario:
    scenario = Scenario("startup")
    registered: list[float] = []
    serving: list[float] = []
    served: list[float] = []
    for _ in range(options.startup_runs):
        fe = BenchFrontend(spec, 1, LoadMode(), options)
        try:
            await fe.start()
            registered_at = [e.runner.registered_at for e in fe.group.engines
                             if e.runner is not None and e.runner.registered_at is not None]
            handle = await fe.generate(1)
            await handle.wait(options.stream_timeout_s)
            done = time.monotonic()
            if registered_at:
                registered.append((max(registered_at) - fe.started_at) * 1000.0)
            serving.append((fe.serving_at - fe.started_at) * 1000.0)
            served.append((done - fe.started_at) * 1000.0)
        finally:
            await fe.close()
    row = Row(f"{options.startup_runs} start(s), 1 engine",
              params={"runs": options.startup_runs})
    row.figures["registered_ms"] = min(registered) if registered else None
    row.figures["serving_ms"] = min(serving) if serving else None
    row.figures["first_served_ms"] = min(served) if served else None
    row.samples = {"first_served_ms": sorted(served)}
    row.notes.append("best of the runs; every run in samples")
    scenario.rows.append(row)
    progress(f"startup: registered {row.figures['registered_ms'] or 0:.0f} ms, serving "
             f"{row.figures['serving_ms'] or 0:.0f} ms, first request served "
             f"{row.figures['first_served_ms'] or 0:.0f} ms")
    return scenario
