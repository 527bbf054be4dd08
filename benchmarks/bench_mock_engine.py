"""Mock engine overhead: streaming throughput against a bare pyzmq + msgspec loop, and DP startup.

A mock engine must not be the bottleneck when it stands in for vLLM behind a real frontend, so
its per-message cost is compared with the cheapest possible sender of the same bytes:

* mock: one `EngineGroup` engine streams N one-token outputs (one request scripted with
  `stream(range(N))`, interval 0) to a bare PULL socket;
* bare: a thread with a PUSH socket builds and encodes an equivalent one-token
  `EngineCoreOutputs` with plain msgspec for each message and sends it.

Both are received by the same loop (recv only), and the ratio mock/bare is reported (target
>= 0.5). Then a 64-rank `EngineGroup` is started against a ROUTER and the time until all 64
registrations arrived is measured (target <= 1 s).

    .venv/bin/python benchmarks/bench_mock_engine.py [--n 20000] [--repeat 3] [--ranks 64]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.transport.endpoints import PrivateIpcDir  # noqa: E402
from harness.transport.sockets import make_socket  # noqa: E402
from harness.wire import DEFAULT_CODEC  # noqa: E402
from harness.wire import messages as m  # noqa: E402
from mock_engines import EngineGroup, EngineScript, any_request, stream  # noqa: E402

Ctx = zmq.Context[zmq.Socket[bytes]]


def _receive(pull: zmq.Socket[bytes], n: int, timeout: float) -> float:
    """Receive n messages (blocking recv, bounded by RCVTIMEO); returns when the last arrived."""
    pull.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
    try:
        for _ in range(n):
            pull.recv_multipart()
    except zmq.Again:
        raise TimeoutError("benchmark consumer timed out") from None
    return time.monotonic()


def bench_mock(n: int) -> float:
    """Messages/s of one mock engine streaming n one-token outputs to a bare PULL."""
    ctx: Ctx = zmq.Context()
    ipc = PrivateIpcDir()
    router, pull = make_socket(ctx, zmq.ROUTER), make_socket(ctx, zmq.PULL)
    group = EngineGroup([EngineScript(rules=[any_request(stream(range(n)))])])
    try:
        inputs, outputs = [ipc.address("in")], [ipc.address("out")]
        router.bind(inputs[0])
        pull.bind(outputs[0])
        group.start_bootstrapped(inputs, outputs)
        if not router.poll(10_000):
            raise TimeoutError("mock engine did not register")
        identity, _ready = router.recv_multipart()
        request = m.EngineCoreRequest("bench", [1, 2, 3], None, m.SamplingParams(max_tokens=n),
                                      None, 0.0, None, None, None)
        start = time.monotonic()
        router.send_multipart([identity, *DEFAULT_CODEC.encode_add(request)])
        end = _receive(pull, n, timeout=120)
        return n / (end - start)
    finally:
        router.close(0)
        pull.close(0)
        group.stop()
        ctx.term()
        ipc.cleanup()


def bench_bare(n: int) -> float:
    """Messages/s of a bare pyzmq PUSH loop encoding an equivalent EngineCoreOutputs each time."""
    ctx: Ctx = zmq.Context()
    ipc = PrivateIpcDir()
    pull = make_socket(ctx, zmq.PULL)
    address = ipc.address("out")
    pull.bind(address)
    go = threading.Event()

    def sender() -> None:
        push = make_socket(ctx, zmq.PUSH, linger=1000)
        push.connect(address)
        encoder = msgspec.msgpack.Encoder()
        go.wait()
        try:
            for i in range(n):
                outs = m.EngineCoreOutputs(0, [m.EngineCoreOutput("bench", [i])], None,
                                           time.monotonic(), weight_version="default")
                push.send_multipart([encoder.encode(outs)])
        finally:
            push.close()

    thread = threading.Thread(target=sender, name="bare-push", daemon=True)
    thread.start()
    try:
        start = time.monotonic()
        go.set()
        end = _receive(pull, n, timeout=120)
        return n / (end - start)
    finally:
        thread.join(10)
        pull.close(0)
        ctx.term()
        ipc.cleanup()


def bench_group_start(ranks: int) -> float:
    """Seconds from EngineGroup construction to all `ranks` registrations at one ROUTER."""
    ctx: Ctx = zmq.Context()
    ipc = PrivateIpcDir()
    router, pull = make_socket(ctx, zmq.ROUTER), make_socket(ctx, zmq.PULL)
    group: EngineGroup | None = None
    try:
        inputs, outputs = [ipc.address("in")], [ipc.address("out")]
        router.bind(inputs[0])
        pull.bind(outputs[0])
        start = time.monotonic()
        group = EngineGroup(ranks)
        group.start_bootstrapped(inputs, outputs)
        seen: set[bytes] = set()
        deadline = start + 30
        while len(seen) < ranks:
            if not router.poll(int(max(0.0, deadline - time.monotonic()) * 1000)):
                raise TimeoutError(f"only {len(seen)}/{ranks} engines registered")
            identity, _ready = router.recv_multipart()
            seen.add(identity)
        return time.monotonic() - start
    finally:
        router.close(0)
        pull.close(0)
        if group is not None:
            group.stop()
        ctx.term()
        ipc.cleanup()


def _best(fn: Callable[[], float], repeat: int, higher_is_better: bool = True
          ) -> tuple[float, list[float]]:
    runs = [fn() for _ in range(repeat)]
    return (max(runs) if higher_is_better else min(runs)), runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="messages per streaming run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (best kept)")
    parser.add_argument("--ranks", type=int, default=64, help="engines in the startup run")
    args = parser.parse_args(argv)

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, pyzmq {zmq.__version__}, libzmq "
          f"{zmq.zmq_version()}, msgspec {msgspec.__version__}")
    bench_mock(min(args.n, 2000))  # warm-up (imports, allocator)
    mock, mock_runs = _best(lambda: bench_mock(args.n), args.repeat)
    bare, bare_runs = _best(lambda: bench_bare(args.n), args.repeat)
    ratio = mock / bare
    start, start_runs = _best(lambda: bench_group_start(args.ranks), args.repeat,
                              higher_is_better=False)

    def fmt(runs: list[float]) -> str:
        return ", ".join(f"{r:,.0f}" for r in runs)

    print(f"mock engine stream : {mock:>10,.0f} msg/s  (runs: {fmt(mock_runs)})")
    print(f"bare pyzmq+msgspec : {bare:>10,.0f} msg/s  (runs: {fmt(bare_runs)})")
    print(f"ratio mock/bare    : {ratio:>10.2f}      (target >= 0.5)")
    print(f"{args.ranks}-rank group start : {start * 1000:>7.0f} ms     "
          f"(runs: {', '.join(f'{s * 1000:.0f}' for s in start_runs)} ms; target <= 1000 ms; "
          f"median {statistics.median(start_runs) * 1000:.0f} ms)")
    ok = ratio >= 0.5 and start <= 1.0
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
