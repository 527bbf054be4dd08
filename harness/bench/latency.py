"""Per-token overhead (engine send -> client receive) and TTFT overhead, split by hop.

Per-token: the engines step at a fixed rate (`latency_step_interval_s`), far below what any
frontend sustains, and record each step's send time. Every step carries one token id,
`token_base + step % token_cycle` (mock_engines/loadgen.py), so a token a client receives
names the step that sent it: latency = client receive time - that step's send time (both
`time.monotonic()` in this process). A chunk that coalesces several outputs is timed by its
newest token.

TTFT: requests one at a time: client request -> ADD read by the engine -> the engine's first
output sent -> first output at the client.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Callable
from typing import Any

from harness.bench.frontend_under_load import BenchFrontend, BenchOptions
from harness.bench.model import Row, Scenario, latency_figures
from harness.frontends.api import StreamHandle
from mock_engines.loadgen import LoadMode

Progress = Callable[[str], None]


async def run_token_latency(spec: str, options: BenchOptions, progress: Progress) -> Scenario:
    scenario = Scenario("token_latency")
    mode = LoadMode(step_interval=options.latency_step_interval_s, record_steps=True)
    tokens = max(8, int((options.warmup_s + options.window_s) / mode.step_interval) + 8)
    received: list[tuple[float, int]] = []

    def observer(event: str, fields: dict[str, Any]) -> None:
        if event == "output" and fields.get("tokens"):
            received.append((time.monotonic(), int(fields["tokens"][-1])))

    async with BenchFrontend(spec, 1, mode, options) as fe:
        handles: list[StreamHandle] = []
        for _ in range(options.latency_streams):
            handle = await fe.generate(tokens)
            handle.observer = observer
            handles.append(handle)
        await asyncio.sleep(options.warmup_s)
        meter = fe.meter()
        start = time.monotonic()
        await asyncio.sleep(options.window_s)
        end = time.monotonic()
        busy = meter.busy()
        for handle in handles:
            handle.observer = None
        await fe.drain(handles)
        step_times = list(fe.stats[0].step_times)
    cycle, base = mode.token_cycle, mode.token_base
    samples: list[float] = []
    for t, token in received:
        if not start <= t <= end:
            continue
        latest = bisect.bisect_right(step_times, t) - 1
        step = latest - ((latest - (token - base)) % cycle)
        if step >= 0:
            samples.append((t - step_times[step]) * 1000.0)
    row = Row(f"{options.latency_streams} streams at {1 / mode.step_interval:.0f} steps/s",
              params={"streams": options.latency_streams,
                      "step_interval_s": mode.step_interval})
    row.engine_busy = busy
    row.figures.update(latency_figures("token", samples))
    row.figures["samples"] = float(len(samples))
    row.add_samples("token_ms", samples)
    row.refuse_if_engines_busy()
    scenario.rows.append(row)
    progress(_describe("per-token overhead", row, "token"))
    return scenario


async def run_ttft(spec: str, options: BenchOptions, progress: Progress) -> Scenario:
    scenario = Scenario("ttft")
    mode = LoadMode(record_steps=True)
    hops: dict[str, list[float]] = {"request_to_add": [], "add_to_first_sent": [],
                                    "first_sent_to_client": [], "ttft": []}
    async with BenchFrontend(spec, 1, mode, options) as fe:
        stats = fe.stats[0]
        meter = fe.meter()
        for i in range(options.ttft_requests + 1):  # the first one warms the path up
            first: list[float] = []

            def observer(event: str, _fields: dict[str, Any], first: list[float] = first
                         ) -> None:
                if event == "output" and not first:
                    first.append(time.monotonic())

            t0 = time.monotonic()
            handle = await fe.generate(4)
            handle.observer = observer
            if handle.first_output.is_set() and not first:  # filled before the observer
                first.append(time.monotonic())
            await handle.wait(options.stream_timeout_s)
            if i == 0 or not first:
                continue
            ids = list(stats.added_at)
            if len(ids) != i + 1:
                raise RuntimeError(f"expected {i + 1} ADDs at the engine, saw {len(ids)}")
            rid = ids[i]
            added, sent = stats.added_at[rid], stats.first_sent_at.get(rid)
            if sent is None:
                continue
            hops["request_to_add"].append((added - t0) * 1000.0)
            hops["add_to_first_sent"].append((sent - added) * 1000.0)
            hops["first_sent_to_client"].append((first[0] - sent) * 1000.0)
            hops["ttft"].append((first[0] - t0) * 1000.0)
        busy = meter.busy()
    row = Row(f"{options.ttft_requests} sequential requests",
              params={"requests": options.ttft_requests})
    row.engine_busy = busy
    for name, values in hops.items():
        row.figures.update(latency_figures(name, values))
        row.add_samples(f"{name}_ms", values)
    row.refuse_if_engines_busy()
    scenario.rows.append(row)
    progress(_describe("TTFT", row, "ttft") + "; request->ADD p50 "
             + _ms(row.figures.get("request_to_add_p50_ms")) + ", first sent->client p50 "
             + _ms(row.figures.get("first_sent_to_client_p50_ms")))
    return scenario


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _describe(what: str, row: Row, prefix: str) -> str:
    if row.refused:
        return f"{what}: REFUSED ({row.refused})"
    return (f"{what}: p50 {_ms(row.figures.get(f'{prefix}_p50_ms'))}, p99 "
            f"{_ms(row.figures.get(f'{prefix}_p99_ms'))}, max "
            f"{_ms(row.figures.get(f'{prefix}_max_ms'))}")


