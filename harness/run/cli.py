"""`corewire` command: run the suites, compare runs, re-render reports.

    corewire run [--frontend [NAME=]SPEC ...] [-k EXPR] [-n N] [--baseline FILE] [-- PYTEST ARGS]
    corewire merge DIR... [--report-dir OUT] [--baseline FILE]
    corewire diff OLD.json NEW.json
    corewire report RESULTS.json [--out report.html]
    corewire compliance RESULTS.json [--baseline FILE] [--out docs/compliance.md]
    corewire profiles [--json]
    corewire bench [--frontend F ...] [--scenarios a,b] [--quick] [--report-dir DIR]
                   [--bench-baseline FILE [--bench-min-ratio 0.9]]

Exit codes of `run` are pytest's: 0 all graded verdicts acceptable, 1 some FAIL / ERROR /
TIMEOUT not tolerated by the baseline (or a stale/expired baseline entry), 2 interrupted,
4 usage error (a --report-dir another run holds included), 5 no case ran; and 6: a report
file could not be written (disk full), the verdicts printed but not saved; 7: a frontend
could not start (3 start failures in a row, same cause), its remaining cases not run.
`diff` exits 1 when a case moved into a failing verdict; every command exits 4 with one
line (no traceback) on unreadable or malformed input. `merge` exits with the code the
unsharded run would have had (4: the inputs are not the shards of one run).
The table, interrupts and report-set rules: docs/cli.md (`bench`'s exit codes there too).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, NoReturn

from harness.frontends.table import FRONTENDS
from harness.locations import IMPORT_ROOT, RUN_INI, MissingInstallError, require_cases_dir
from harness.protocol.timing import DEFAULT, Timescale, TimescaleError

USAGE_ERROR = 4  # pytest's code for a usage error; `run` passes pytest's codes through


class CliUsageError(Exception):
    """A command the user can fix: printed as one line, exit 4, never a traceback."""


WORKERS_PER_CPU = 6
WORKERS_PER_CPU_VLLM_PY = 3  # every worker that runs a vllm-py case imports vLLM (~8 CPU-s)
MAX_AUTO_WORKERS = 16


def default_workers(frontends: list[str]) -> str:
    """`-n auto`: the cases are I/O-bound (the reference lane: 125 s of case time for 15
    CPU-s on 2 CPUs), so several workers per CPU; fewer when vllm-py is in the run, whose
    per-worker vLLM import turns extra workers into CPU work. Measured on 2 CPUs
    (docs/benchmarks.md): reference + kv + ec 67 s at 2 workers, 21 s at 8, 18 s at 12;
    vllm-py 155 s at 2, 67-75 s at 6, 82 s at 8, 94 s at 4."""
    from harness.frontends import naming
    from harness.frontends.table import parse_frontend

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    kinds = set()
    for value in frontends:
        with contextlib.suppress(ValueError):  # a bad spec is the plugin's usage error
            kinds.add(parse_frontend(naming.split_name(value)[1]).kind)
    per_cpu = WORKERS_PER_CPU_VLLM_PY if "vllm-py" in kinds else WORKERS_PER_CPU
    return str(max(2, min(MAX_AUTO_WORKERS, per_cpu * cpus)))


# The plugins `corewire run`'s pytest child loads (its environment turns autoload off).
CHILD_PLUGINS = ("-p", "xdist.plugin", "-p", "pytest_timeout", "-p", "harness.run.plugin",
                 "-p", "harness.run.replay_plugin")


def _run(args: argparse.Namespace, extra: list[str]) -> int:
    try:
        os.makedirs(args.report_dir, exist_ok=True)
        if not os.access(args.report_dir, os.W_OK):
            raise PermissionError(f"cannot write to {args.report_dir}")
    except OSError as exc:
        raise CliUsageError(f"--report-dir {args.report_dir}: {exc}") from None
    try:
        cases = require_cases_dir()
    except MissingInstallError as exc:
        raise CliUsageError(str(exc)) from None
    # The installed (or checked-out) cases, wherever `corewire run` is run from, under
    # corewire's own pytest configuration (harness/run/corewire_run.ini), not the cwd's.
    # junit.xml is the plugin's (harness/results/junit.py), beside results.json.
    # Only corewire's own plugins and the two it depends on are loaded (CHILD_PLUGINS, with
    # pytest's entry-point autoload off in the child's environment): whatever else the
    # environment has installed (hypothesis's, anyio's, a port's own) serves no case and
    # cannot change a verdict, and finding and loading those cost every worker ~0.1-0.2 CPU-s.
    argv = [str(cases), "-c", str(RUN_INI), "--rootdir", str(IMPORT_ROOT),
            "-p", "no:cacheprovider", *CHILD_PLUGINS, "-q", "--report-dir", args.report_dir]
    for frontend in args.frontend or ["reference"]:
        argv += ["--frontend", frontend]
    if args.k:
        argv += ["-k", args.k]
    if args.m:
        argv += ["-m", args.m]
    workers = default_workers(args.frontend or ["reference"]) if args.n == "auto" else args.n
    if workers and workers != "0":
        # worksteal: an idle worker takes queued cases from a busy one, so the few
        # multi-second cases do not leave the run waiting on one worker (an explicit
        # `-- --dist ...` comes later in argv and wins).
        argv += ["-n", workers, "--dist", "worksteal"]
    if args.baseline:
        argv += ["--baseline", args.baseline]
    if args.update_baseline:
        argv += ["--update-baseline"]
    if args.timescale:
        argv += ["--timescale", str(args.timescale)]
    if args.shard:
        from harness.run.shard import ShardSpecError, parse_shard

        try:
            parse_shard(args.shard)
        except ShardSpecError as exc:
            raise CliUsageError(str(exc)) from None
        argv += ["--shard", args.shard]
    if args.profile:
        from harness.protocol.wire.profiles import UnknownProfileError, get_profile

        try:
            get_profile(args.profile)
        except UnknownProfileError as exc:
            raise CliUsageError(f"--profile: {exc}") from None
        argv += ["--profile", args.profile]
    # The stop bound scales like the child's windows: --timescale, else $COREWIRE_TIMESCALE
    # (the child reads the same two; a non-positive --timescale is its usage error).
    try:
        timescale = Timescale.from_user(args.timescale or None, os.environ)
    except TimescaleError:
        timescale = DEFAULT
    # A child process: pytest must import (and assertion-rewrite) the plugin itself.
    return _run_child([sys.executable, "-m", "pytest", *argv, *extra], timescale,
                      {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})


INTERRUPTED = 2  # pytest's code for an interrupted session
STOP_BOUND_S = 60.0  # after SIGINT/SIGTERM: how long the pytest child may take to stop


def _die_with_parent(parent: int) -> None:
    """In the pytest child, before exec: SIGTERM when `corewire run` dies, however it dies
    (SIGKILL included), so the run stops, writes its partial reports and reaps its drivers
    instead of running on unowned (Linux prctl PR_SET_PDEATHSIG; elsewhere a no-op)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


def _run_child(argv: list[str], timescale: Timescale,
               env: dict[str, str] | None = None) -> int:
    """Run pytest; SIGINT / SIGTERM are forwarded to it (once each, the child treats
    repeats as the same interrupt) and we wait for it to write its partial reports and
    reap its children. A child still running STOP_BOUND_S x timescale after the signal
    is killed. Never returns before the child has exited."""
    import signal
    import subprocess
    import time

    parent = os.getpid()
    child = subprocess.Popen(argv, env=env, preexec_fn=lambda: _die_with_parent(parent))
    received: list[int] = []
    deadline: float | None = None

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                code = child.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if received and deadline is None:
                deadline = time.monotonic() + timescale.scaled(STOP_BOUND_S)
            if deadline is not None and time.monotonic() > deadline:
                print(f"corewire run: pytest did not stop within "
                      f"{timescale.scaled(STOP_BOUND_S):.0f} s of the interrupt; killed",
                      file=sys.stderr)
                child.kill()
                child.wait()
                return INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received and code < 0:  # ended by a signal: still an interrupt
        return INTERRUPTED
    return code


def _diff(args: argparse.Namespace) -> int:
    from harness.results.diff import diff_results, format_diff
    from harness.results.writer import load_results

    transitions = diff_results(load_results(args.old), load_results(args.new))
    print(format_diff(transitions))
    return 1 if any(t.regression for t in transitions) else 0


def _merge(args: argparse.Namespace) -> int:
    from harness.results.baseline import Baseline, BaselineError
    from harness.results.merge import MergeError, merge_runs, summary_lines

    baseline = None
    if args.baseline:
        try:
            baseline = Baseline.load(args.baseline)
        except (OSError, BaselineError, ValueError) as exc:
            raise CliUsageError(f"--baseline {args.baseline}: {exc}") from None
    from harness.results.failsafe import REPORTS_NOT_WRITTEN, ReportsNotWritten

    try:
        merged = merge_runs(args.dirs, args.report_dir, baseline)
    except MergeError as exc:
        raise CliUsageError(str(exc)) from None
    except ReportsNotWritten as exc:
        for failure in exc.failures:
            print(f"corewire merge: not written: {failure}", file=sys.stderr)
        return REPORTS_NOT_WRITTEN
    print("\n".join(summary_lines(merged, args.verbose)))
    return merged.exit_code


def _report(args: argparse.Namespace) -> int:
    from harness.results.html import render_html
    from harness.results.schema import read_document

    doc = read_document(args.results)
    out = args.out or os.path.join(os.path.dirname(args.results) or ".", "report.html")
    with open(out, "w") as fh:
        fh.write(render_html(doc))
    print(out)
    return 0


def _profiles(args: argparse.Namespace) -> int:
    """One line per protocol profile: release date, array lengths, ready keys."""
    import json

    from harness.protocol.wire.profiles import all_profiles

    rows = [{"name": p.name, "vllm_version": p.vllm_version,
             "release_date": (p.release_date or "")[:10],
             "request": p.request_array_len, "output": p.output_array_len,
             "outputs": p.outputs_array_len, "ready_keys": len(p.ready_keys),
             "required_ready_keys": len(p.required_ready_keys),
             "rust_required_ready_keys": (None if p.rust_required_ready_keys is None
                                          else len(p.rust_required_ready_keys)),
             "source": p.source} for p in all_profiles()]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    header = ("profile", "released", "request", "output", "outputs", "ready keys",
              "required", "rust required")
    keys = ("name", "release_date", "request", "output", "outputs", "ready_keys",
            "required_ready_keys", "rust_required_ready_keys")
    table: list[tuple[str, ...]] = [header] + [
        tuple("-" if r[k] is None else str(r[k]) for k in keys) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    print("array lengths: EngineCoreRequest / EngineCoreOutput / EngineCoreOutputs; "
          "vllm-0.33 is the default (harness/protocol/wire/messages.py)")
    return 0


BENCH_SCENARIO_FAILED = 3
BENCH_INTERRUPTED = 2


def _bench(args: argparse.Namespace) -> int:
    from harness.bench import SCENARIOS, BenchOptions, run_bench
    from harness.bench.gate import EXIT_REGRESSION, compare, load_baseline
    from harness.bench.report import write_json, write_markdown, write_plots
    from harness.frontends.run_config import RunConfig, RunConfigError

    frontends = args.frontend or ["reference"]
    try:  # the frontends and $COREWIRE_TIMESCALE, checked once
        run_config = RunConfig.from_options(frontends, environ=os.environ)
    except RunConfigError as exc:
        raise CliUsageError(str(exc)) from None
    scenarios = (list(SCENARIOS) if not args.scenarios
                 else [s.strip() for s in args.scenarios.split(",") if s.strip()])
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        raise CliUsageError(f"--scenarios: unknown {', '.join(unknown)}; known: "
                         f"{', '.join(SCENARIOS)}")
    saved = load_baseline(args.bench_baseline) if args.bench_baseline else None
    try:
        os.makedirs(args.report_dir, exist_ok=True)
    except OSError as exc:
        raise CliUsageError(f"--report-dir {args.report_dir}: {exc}") from None
    options = BenchOptions.quick() if args.quick else BenchOptions()
    options.timescale = run_config.timescale
    doc = run_bench(frontends, scenarios, options)
    paths = [write_json(doc, args.report_dir), write_markdown(doc, args.report_dir),
             *write_plots(doc, args.report_dir)]
    print("\n".join(paths))
    code = 0
    if any(s.get("error") for f in doc["frontends"].values() for s in f["scenarios"].values()):
        code = BENCH_SCENARIO_FAILED
    if doc.get("partial"):
        return BENCH_INTERRUPTED
    if saved is not None:
        verdicts = compare(saved, doc, args.bench_min_ratio)
        for verdict in verdicts:
            print(verdict.line())
        if not verdicts:
            print("bench baseline: no figure in common with the saved run")
        if any(not v.ok for v in verdicts):
            code = EXIT_REGRESSION
    return code


def _compliance(args: argparse.Namespace) -> int:
    from harness.results.baseline import Baseline
    from harness.results.compliance import render_compliance
    from harness.results.schema import read_document

    doc = read_document(args.results)
    baseline = Baseline.load(args.baseline) if args.baseline else None
    text = render_compliance(doc, baseline)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
        print(args.out)
    else:
        print(text, end="")
    return 0


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default, unless it says it already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (action.default not in (None, False, argparse.SUPPRESS) and "default" not in text
                and action.option_strings):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad arguments; 2 is `interrupted` here (docs/cli.md), so a bad
    argument is the usage error it is: one line on stderr, exit 4."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)  # help ends with defaults
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    parser = _Parser(prog="corewire", description=__doc__, formatter_class=_HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)  # _Parser's, like the top
    run = sub.add_parser("run", help="run the conformance suites",
                         description="Run the conformance suites against each "
                                     "--frontend.\nExit codes (docs/cli.md): 0 pass, 1 "
                                     "failure, 2 interrupted, 4 usage error, 5 no case ran,\n"
                                     "6 reports not written (disk full), 7 a frontend could "
                                     "not start (3 start failures in a row, same cause).")
    run.add_argument("--frontend", action="append", metavar="[NAME=]SPEC",
                     help=f"what to test, repeatable (default: reference). SPEC: "
                          f"{FRONTENDS.usage} (vllm-rs@X: vLLM release X's; subprocess:'CMD': a "
                          "port's driver program); kv: and ec: specs run the component "
                          "cases instead (the unit after the colon: a KV-connector worker: "
                          "reference, vllm-nixl; an EC scheduler: reference, vllm; either: "
                          "mutant:NAME). A NAME= prefix (letters, digits, _.@+-) keys the "
                          "reports and baselines, e.g. "
                          "myport=subprocess:./driver; a subprocess: spec without one is "
                          "named by its program's init reply")
    run.add_argument("-k", help="pytest -k expression, e.g. abort (default: every case)")
    run.add_argument("-m", help="pytest -m expression, e.g. 'dp and must' (default: every "
                                "case)")
    run.add_argument("-n", default="auto",
                     help="pytest-xdist workers (0: none; default auto: "
                          f"{WORKERS_PER_CPU} per CPU, {WORKERS_PER_CPU_VLLM_PY} with "
                          f"vllm-py, at most {MAX_AUTO_WORKERS}: cases mostly wait on "
                          "sockets and timers, so more workers than CPUs shorten a run)")
    run.add_argument("--report-dir", default="reports",
                     help="where junit.xml, results.json, report.html and transcripts go")
    run.add_argument("--baseline", help="JSON file of tolerated non-PASS verdicts "
                                        "(default: none)")
    run.add_argument("--update-baseline", action="store_true",
                     help="rewrite --baseline from this run (refused for a filtered run)")
    run.add_argument("--timescale", type=float,
                     help="multiply every timing window by this factor (slow machines; "
                          "default: $COREWIRE_TIMESCALE, else 1)")
    run.add_argument("--profile",
                     help="protocol profile the mock engines speak, e.g. vllm-0.23.0 "
                          "(default: vllm-0.33; see `corewire profiles`)")
    run.add_argument("--shard", metavar="I/N",
                     help="run only shard I of N (1-based; a stable hash of case id and "
                          "frontend name); join the shards' report dirs with `corewire "
                          "merge` (default: the whole selection)")
    merge = sub.add_parser("merge", help="join the report dirs of a sharded run (--shard) "
                                         "into one report set and one exit code")
    merge.add_argument("dirs", nargs="+", metavar="DIR",
                       help="report dirs of the shards (any frontend x shard matrix)")
    merge.add_argument("--report-dir", default="reports",
                       help="where the merged junit.xml, results.json, report.html and "
                            "transcripts go (not one of the inputs)")
    merge.add_argument("--baseline",
                       help="re-grade the merged verdicts against this baseline (default: "
                            "as each shard graded them)")
    merge.add_argument("-v", "--verbose", action="store_true",
                       help="list every non-PASS item, not only those failing the run")
    prof = sub.add_parser("profiles", help="list the protocol profiles (one per vLLM release)")
    prof.add_argument("--json", action="store_true", help="machine-readable")
    bench = sub.add_parser("bench", help="measure frontends under load (mock engines as a "
                                         "load generator): JSON, markdown and PNG plots")
    bench.add_argument("--frontend", action="append",
                       help="as for run (default reference); repeatable, measured in turn")
    bench.add_argument("--scenarios",
                       help="comma-separated subset of throughput, token_latency, ttft, "
                            "abort_storm, utility, startup (default: all)")
    bench.add_argument("--quick", action="store_true",
                       help="small sizes and short windows (development; not for figures)")
    bench.add_argument("--report-dir", default="reports/bench",
                       help="where bench.json, bench.md and the PNG plots go")
    bench.add_argument("--bench-baseline",
                       help="a saved bench.json: gate this run against it (exit 1)")
    bench.add_argument("--bench-min-ratio", type=float, default=0.9,
                       help="allowed ratio against the saved run (default 0.9: tokens/s "
                            ">= 0.9x, latencies <= 1/0.9x)")
    diff = sub.add_parser("diff", help="verdict transitions between two results.json")
    diff.add_argument("old", help="results.json of the earlier run")
    diff.add_argument("new", help="results.json of the later run")
    rep = sub.add_parser("report", help="re-render the HTML report from results.json")
    rep.add_argument("results", help="a results.json")
    rep.add_argument("--out", help="the HTML file (default: report.html beside results)")
    comp = sub.add_parser("compliance", help="render docs/compliance.md from results.json")
    comp.add_argument("results", help="results.json of a run with every frontend")
    comp.add_argument("--baseline", help="the baseline whose reasons explain divergences")
    comp.add_argument("--out", help="the markdown file (default: stdout)")
    args = parser.parse_args(argv)
    commands = {"run": lambda: _run(args, extra), "diff": lambda: _diff(args),
                "compliance": lambda: _compliance(args), "merge": lambda: _merge(args),
                "report": lambda: _report(args),
                "profiles": lambda: _profiles(args), "bench": lambda: _bench(args)}
    try:
        return commands[args.command]()
    except CliUsageError as exc:
        print(f"corewire {args.command}: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except (OSError, ValueError, KeyError, TypeError) as exc:  # unreadable or malformed input
        what = f"{type(exc).__name__}: {exc}"
        print(f"corewire {args.command}: cannot read its input ({what})", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
