"""Mock engine overhead in load mode: against a bare pyzmq + msgspec loop, and DP startup.

A mock engine used as a load generator must not be the bottleneck, so its cost per message
is compared, in the same run, with the cheapest sender of the same bytes:

* mock: one `EngineGroup` engine in load mode (mock_engines/loadgen.py) streams K requests of
  M tokens each: one message per engine step carrying K one-token outputs;
* bare: a thread with a PUSH socket builds K `EngineCoreOutput` structs and the
  `EngineCoreOutputs` around them with plain msgspec for every message, encodes and sends.

Both go to the same kind of consumer (a bare PULL, recv only). Measured at K = 1 and K = 256
outputs per message, interleaved mock/bare, best of `--repeat` with every run listed; the
ratio mock/bare of tokens/s comes first (targets >= 0.5 at K=1, >= 0.8 at K=256). Then a
4-engine group (256 requests each) to a bare PULL: tokens/s (target >= 1 M/s), and the time a
64-rank group takes to register.

    .venv/bin/python benchmarks/bench_mock_engine.py [--tokens 20000] [--repeat 5]
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
from typing import NamedTuple

import msgspec
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.bench.proc import thread_cpu  # noqa: E402
from harness.protocol.transport.endpoints import PrivateIpcDir  # noqa: E402
from harness.protocol.transport.sockets import make_socket  # noqa: E402
from harness.protocol.wire import DEFAULT_CODEC  # noqa: E402
from harness.protocol.wire import messages as m  # noqa: E402
from mock_engines import EngineGroup, EngineScript  # noqa: E402
from mock_engines.loadgen import LoadMode  # noqa: E402

Ctx = zmq.Context[zmq.Socket[bytes]]


class Run(NamedTuple):
    """One streaming run: tokens/s at the consumer, and the sending thread's CPU seconds
    per message (load-independent: what the sender costs, whoever else runs)."""

    tokens_per_s: float
    cpu_us_per_message: float


def _thread_cpu(native_id: int | None) -> float:
    """CPU seconds (user + system) of one thread of this process, from /proc."""
    return thread_cpu(native_id) or 0.0


def _load_script() -> EngineScript:
    return EngineScript(load=LoadMode(), retain_transcript=False)


def bench_mock(per_message: int, tokens: int, engines: int = 1) -> Run:
    """Tokens/s of `engines` load-mode engines, each running `per_message` requests of
    `tokens // per_message` tokens, to one bare PULL."""
    steps = max(1, tokens // per_message)
    ctx: Ctx = zmq.Context()
    ipc = PrivateIpcDir()
    router, pull = make_socket(ctx, zmq.ROUTER), make_socket(ctx, zmq.PULL)
    group = EngineGroup([_load_script() for _ in range(engines)], codec=DEFAULT_CODEC)
    try:
        inputs, outputs = [ipc.address("in")], [ipc.address("out")]
        router.bind(inputs[0])
        pull.bind(outputs[0])
        group.start_bootstrapped(inputs, outputs)
        identities: list[bytes] = []
        while len(identities) < engines:
            if not router.poll(10_000):
                raise TimeoutError("mock engine did not register")
            identities.append(router.recv_multipart()[0])
        adds = [[ident, *DEFAULT_CODEC.encode_add(m.EngineCoreRequest(
            f"bench-{e}-{i}", [1, 2, 3], None, m.SamplingParams(max_tokens=steps), None, 0.0,
            None, None, None))] for e, ident in enumerate(identities) for i in range(per_message)]
        stats = [e.core.load.stats for e in group.engines if e.core.load is not None]
        threads = [e.runner.native_id for e in group.engines if e.runner is not None]
        cpu0 = sum(_thread_cpu(t) for t in threads)
        expected = per_message * engines
        pull.setsockopt(zmq.RCVTIMEO, 120_000)
        start = time.monotonic()
        for frames in adds:
            router.send_multipart(frames)
        received = 0
        target = 1  # messages to receive before looking at the engines' counters again
        try:
            while True:
                while received < target:
                    pull.recv()
                    received += 1
                sent = sum(s.messages for s in stats)
                if sum(s.requests_finished for s in stats) == expected and received >= sent:
                    break
                target = max(received + 1, sent)
        except zmq.Again:
            raise TimeoutError("benchmark consumer timed out") from None
        elapsed = time.monotonic() - start
        cpu = sum(_thread_cpu(t) for t in threads) - cpu0
        return Run(sum(s.tokens for s in stats) / elapsed, cpu / received * 1e6)
    finally:
        router.close(0)
        pull.close(0)
        group.stop()
        ctx.term()
        ipc.cleanup()


def bench_bare(per_message: int, tokens: int) -> Run:
    """Tokens/s of a bare PUSH loop building and encoding each message with msgspec."""
    steps = max(1, tokens // per_message)
    ctx: Ctx = zmq.Context()
    ipc = PrivateIpcDir()
    pull = make_socket(ctx, zmq.PULL)
    address = ipc.address("out")
    pull.bind(address)
    go = threading.Event()
    ids = [f"bench-0-{i}" for i in range(per_message)]
    cpu: list[float] = []

    # Its own context, as the mock engine group has: the same threads carry the bytes.
    sender_ctx: Ctx = zmq.Context()

    def sender() -> None:
        push = make_socket(sender_ctx, zmq.PUSH, linger=1000)
        push.connect(address)
        encoder = msgspec.msgpack.Encoder()
        go.wait()
        cpu0 = time.thread_time()
        try:
            for step in range(steps):
                token = [100 + step % 800]
                outs = m.EngineCoreOutputs(0, [m.EngineCoreOutput(rid, token) for rid in ids],
                                           None, time.monotonic(), weight_version="default")
                push.send(encoder.encode(outs))
            cpu.append(time.thread_time() - cpu0)
        finally:
            push.close()

    thread = threading.Thread(target=sender, name="bare-push", daemon=True)
    thread.start()
    pull.setsockopt(zmq.RCVTIMEO, 120_000)
    try:
        start = time.monotonic()
        go.set()
        for _ in range(steps):
            pull.recv()
        rate = steps * per_message / (time.monotonic() - start)
        thread.join(10)
        return Run(rate, (cpu[0] if cpu else float("nan")) / steps * 1e6)
    except zmq.Again:
        raise TimeoutError("benchmark consumer timed out") from None
    finally:
        thread.join(10)
        pull.close(0)
        ctx.term()
        sender_ctx.term()
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
        group = EngineGroup(ranks, codec=DEFAULT_CODEC)
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


def _spread(runs: list[float], unit: str = "tokens/s") -> str:
    best, worst = max(runs), min(runs)
    return (f"best {best:,.0f} {unit}, median {statistics.median(runs):,.0f}, worst "
            f"{worst:,.0f} (spread {(best - worst) / best:.0%}; runs "
            f"{' / '.join(f'{r:,.0f}' for r in runs)})")


def _interleaved(a: Callable[[], Run], b: Callable[[], Run], repeat: int
                 ) -> tuple[list[Run], list[Run]]:
    """Alternate a and b so a change of machine load hits both alike."""
    runs_a: list[Run] = []
    runs_b: list[Run] = []
    for _ in range(repeat):
        runs_a.append(a())
        runs_b.append(b())
    return runs_a, runs_b


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=20_000,
                        help="outputs per streaming run at 1 output/message (x16 at 256)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement (best kept)")
    parser.add_argument("--ranks", type=int, default=64, help="engines in the startup run")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, pyzmq {zmq.__version__}, libzmq "
          f"{zmq.zmq_version()}, msgspec {msgspec.__version__}; load average "
          f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    bench_mock(1, 2000)  # warm-up (imports, allocator)
    ok = True
    lines: list[str] = []
    for per_message, target, tokens in ((1, 0.5, args.tokens), (256, 0.8, args.tokens * 16)):
        mock_runs, bare_runs = _interleaved(lambda k=per_message, n=tokens: bench_mock(k, n),
                                            lambda k=per_message, n=tokens: bench_bare(k, n),
                                            args.repeat)
        mock_rates = [r.tokens_per_s for r in mock_runs]
        bare_rates = [r.tokens_per_s for r in bare_runs]
        ratio = max(mock_rates) / max(bare_rates)
        mock_cpu = min(r.cpu_us_per_message for r in mock_runs)
        bare_cpu = min(r.cpu_us_per_message for r in bare_runs)
        ok = ok and ratio >= target
        print(f"ratio mock/bare at {per_message:>3} output(s)/message: {ratio:5.2f} "
              f"(target >= {target}); sender CPU per message: bare/mock "
              f"{bare_cpu / mock_cpu:.2f} ({mock_cpu:.1f} us mock, {bare_cpu:.1f} us bare)")
        lines.append(f"  {per_message:>3}/msg mock: {_spread(mock_rates)}")
        lines.append(f"  {per_message:>3}/msg bare: {_spread(bare_rates)}")
    group_runs = [bench_mock(256, args.tokens * 64, engines=4).tokens_per_s
                  for _ in range(args.repeat)]
    ok = ok and max(group_runs) >= 1e6
    print(f"4-engine group -> bare PULL: {max(group_runs):,.0f} tokens/s (target >= 1,000,000)")
    lines.append(f"  4-engine group: {_spread(group_runs)}")
    print("\n".join(lines))
    start_runs = [bench_group_start(args.ranks) for _ in range(args.repeat)]
    print(f"{args.ranks}-rank group start: {min(start_runs) * 1000:.0f} ms (runs: "
          f"{', '.join(f'{s * 1000:.0f}' for s in start_runs)} ms; target <= 1000 ms)")
    ok = ok and min(start_runs) <= 1.0
    load = os.getloadavg()
    print(f"load average after: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
