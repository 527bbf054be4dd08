"""Soak: N consecutive full runs under a background load -> docs/soak.md.

Each run is `corewire run --frontend F... -n W` into reports/soak/run-NN/; a busy-loop
process per CPU (`--load-procs`, `--load-nice`) keeps every core loaded for the whole soak.
Every run is recorded as one line of reports/soak/log.jsonl as soon as it ends, so an
interrupted soak keeps what it measured (`--render-only` re-renders the log). The verdicts of
each run are compared with run 1's (harness/results/soak.py); the exit code is 0 only when
every run is identical.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.results.soak import SoakRun, compare, read_log, render_soak, verdicts_of  # noqa: E402

BUSY_LOOP = "import os, sys\nos.nice(int(sys.argv[1]))\nwhile True:\n    pass\n"


def start_load(procs: int, nice: int) -> list[subprocess.Popen[bytes]]:
    """`procs` busy loops, each in its own session so a Ctrl-C to the soak reaches only us."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(nice)],
                             start_new_session=True) for _ in range(procs)]


def stop_load(load: list[subprocess.Popen[bytes]]) -> None:
    for proc in load:
        proc.kill()
    for proc in load:
        proc.wait(timeout=10)


def _stop_on_sigterm(_signum: int, _frame: object) -> None:
    """SIGTERM (a CI cancel) stops the soak as Ctrl-C does: the run in progress is handed
    the signal, the load is stopped, and what was measured is rendered."""
    raise KeyboardInterrupt


def one_run(index: int, args: argparse.Namespace, report_root: Path) -> SoakRun:
    report_dir = report_root / f"run-{index:02d}"
    argv = [str(ROOT / ".venv/bin/corewire"), "run", "-n", str(args.workers),
            "--report-dir", str(report_dir)]
    for frontend in args.frontend:
        argv += ["--frontend", frontend]
    if args.select:
        argv += ["-k", args.select]
    if args.baseline:
        argv += ["--baseline", args.baseline]
    load_before = os.getloadavg()
    started = time.monotonic()
    with open(report_root / f"run-{index:02d}.log", "wb") as log:
        child = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                 env={**os.environ, "VLLM_HOST_IP": "127.0.0.1"})
        try:
            code = child.wait(timeout=args.run_timeout)
        except BaseException:
            # corewire run turns SIGTERM into partial reports and reaps its pytest child;
            # killing it outright would orphan that child (docs/cli.md, interrupts).
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=90)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            raise
    wall = time.monotonic() - started
    try:
        doc = json.loads((report_dir / "results.json").read_text())
    except (OSError, ValueError):
        doc = {"meta": {"partial": True}, "results": []}
    return SoakRun(index=index, exit_code=code, wall_s=round(wall, 1),
                   load_before=load_before, load_after=os.getloadavg(),
                   verdicts=verdicts_of(doc), partial=bool(doc["meta"].get("partial", False)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--frontend", action="append",
                        help="frontend spec (repeatable; default: reference, "
                        "reference-subprocess)")
    parser.add_argument("--workers", type=int, default=2, help="xdist workers per run")
    parser.add_argument("--load-procs", type=int, default=os.cpu_count() or 1,
                        help="busy-loop processes kept running for the whole soak")
    parser.add_argument("--load-nice", type=int, default=0, help="nice value of the busy loops")
    parser.add_argument("-k", dest="select", help="narrow the cases (for trying it out)")
    parser.add_argument("--baseline", help="the baseline that tolerates the real frontends' "
                        "known divergences (so a run over them exits 0)")
    parser.add_argument("--report-root", default=str(ROOT / "reports/soak"))
    parser.add_argument("--out", default=str(ROOT / "docs/soak.md"))
    parser.add_argument("--run-timeout", type=float, default=1800.0)
    parser.add_argument("--resume", action="store_true",
                        help="continue the soak recorded in the log instead of starting anew")
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the record's Notes (what happened around the soak)")
    args = parser.parse_args()
    args.frontend = args.frontend or ["reference", "reference-subprocess"]
    report_root = Path(args.report_root)
    report_root.mkdir(parents=True, exist_ok=True)
    log_path, config_path = report_root / "log.jsonl", report_root / "config.json"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    config = {
        "frontends": args.frontend, "workers": args.workers, "load_procs": args.load_procs,
        "load_nice": args.load_nice, "cpus": os.cpu_count(), "commit": commit,
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
        "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python scripts/soak.py " + " ".join(sys.argv[1:]),
    }
    if args.resume or args.render_only:
        config = json.loads(config_path.read_text()) if config_path.exists() else config
    else:
        log_path.write_text("")
        config_path.write_text(json.dumps(config, indent=1))
    runs = read_log(log_path.read_text()) if log_path.exists() else []
    if not args.render_only:
        load = start_load(args.load_procs, args.load_nice)
        signal.signal(signal.SIGTERM, _stop_on_sigterm)
        try:
            for index in range(len(runs) + 1, args.runs + 1):
                run = one_run(index, args, report_root)
                runs.append(run)
                with open(log_path, "a") as log:
                    log.write(json.dumps(run.to_json()) + "\n")
                moved = len([c for c in compare(runs).changes if c.index == index])
                print(f"run {index}: exit {run.exit_code}, {run.wall_s:.0f} s, load "
                      f"{run.load_after[0]:.2f}, {moved} verdict changes", flush=True)
        except (KeyboardInterrupt, subprocess.TimeoutExpired) as stop:
            print(f"soak stopped ({type(stop).__name__}); rendering what was measured",
                  flush=True)
        finally:
            stop_load(load)
    if args.note:
        config["notes"] = list(config.get("notes", [])) + args.note
        config_path.write_text(json.dumps(config, indent=1))
    summary = compare(runs)
    Path(args.out).write_text(render_soak(summary, config))
    print(f"{summary.identical_runs}/{len(runs)} identical -> {args.out}")
    return 0 if runs and summary.identical_runs == len(runs) == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
