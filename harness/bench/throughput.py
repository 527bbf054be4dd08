"""Streaming throughput: tokens/s delivered to clients at N concurrent streams.

Closed loop: N client workers each start a stream of `tokens_per_request` tokens and start
the next one as soon as it ends. The engines step as fast as they can (load mode, interval 0),
so what bounds the rate is how fast the frontend moves outputs to clients and ADDs to engines;
the engines' busy fraction proves it (a row above the limit is refused). Tokens are counted
at the clients over `repeat` consecutive windows after a warm-up (the best window is the
figure, every window is kept with the spread: a shared machine's other work only ever slows a
window down); the frontend's CPU over the same window gives CPU seconds per million tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from harness.bench.frontend_under_load import BenchFrontend, BenchOptions, FrontendCpu
from harness.bench.model import Row, Scenario
from harness.frontends.api import StreamHandle
from mock_engines.loadgen import LoadMode

Progress = Callable[[str], None]


async def run_throughput(spec: str, options: BenchOptions, progress: Progress) -> Scenario:
    scenario = Scenario("throughput")
    async with BenchFrontend(spec, 1, LoadMode(), options) as fe:
        for streams in options.concurrency:
            row = await _level(fe, streams, options)
            scenario.rows.append(row)
            figure = row.figures.get("tokens_per_s")
            progress(f"throughput {streams:>5} streams: "
                     + (f"{figure:,.0f} tokens/s" if figure is not None else f"REFUSED "
                        f"({row.refused})" if row.refused else "no figure")
                     + (f", engine busy {row.engine_busy:.2f}"
                        if row.engine_busy is not None else ""))
    return scenario


async def _level(fe: BenchFrontend, streams: int, options: BenchOptions) -> Row:
    row = Row(f"{streams} streams", params={"streams": streams,
                                            "tokens_per_request": options.tokens_per_request})
    handles: list[StreamHandle] = []
    errors: list[str] = []
    running = True

    async def worker() -> None:
        while running:
            handle = await fe.generate(options.tokens_per_request)
            handles.append(handle)
            await handle.wait(options.stream_timeout_s)
            if handle.error is not None:
                errors.append(handle.error)

    tasks = [asyncio.create_task(worker()) for _ in range(streams)]
    cpu = fe.frontend_cpu()
    windows: list[tuple[float, float | None, float | None, float | None]] = []
    try:
        await asyncio.sleep(options.warmup_s)
        for _ in range(max(1, options.repeat)):
            windows.append(await _window(fe, handles, cpu, options.window_s))
            failed = [t for t in tasks if t.done() and t.exception() is not None]
            if failed:
                raise RuntimeError(f"a client worker failed: {failed[0].exception()!r}")
    finally:
        running = False
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
    dropped = await fe.drain(handles)
    best = max(windows, key=lambda w: w[0])
    row.figures["tokens_per_s"] = best[0]
    row.figures["frontend_cpu_s_per_mtok"] = best[1]
    row.engine_busy = best[2]
    if cpu.separate:
        row.figures["client_cpu_s_per_mtok"] = best[3]
    rates = [w[0] for w in windows]
    row.params.update(cpu_scope=cpu.scope, window_s=options.window_s,
                      windows_tokens_per_s=[round(r) for r in rates],
                      spread=round((max(rates) - min(rates)) / max(rates), 3) if max(rates)
                      else None)
    if errors:
        row.notes.append(f"{len(errors)} stream(s) ended in an error, e.g. {errors[0]}")
    if dropped:
        row.notes.append(f"{dropped} stream(s) still open after the level; dropped")
    row.refuse_if_engines_busy()
    return row


async def _window(fe: BenchFrontend, handles: list[StreamHandle], cpu: FrontendCpu,
                  seconds: float) -> tuple[float, float | None, float | None, float | None]:
    """(tokens/s, frontend CPU s per million tokens, engine busy, client CPU s per million
    tokens) over one window; the client figure only where the frontend is a process."""
    meter = fe.meter()
    tokens0 = sum(len(h.tokens) for h in handles)
    cpu0, client0 = cpu.sample(), cpu.harness_sample()
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    tokens = sum(len(h.tokens) for h in handles) - tokens0
    wall = time.monotonic() - t0
    cpu1, client1 = cpu.sample(), cpu.harness_sample()
    per_mtok = ((cpu1 - cpu0) / tokens * 1e6 if cpu0 is not None and cpu1 is not None
                and tokens else None)
    client = (client1 - client0) / tokens * 1e6 if tokens else None
    return tokens / wall, per_mtok, meter.busy(), client
