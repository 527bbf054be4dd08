"""Run `abort.burst.shares_frame` N times under CPU load and tally the verdicts per frontend.

Evidence for docs/abort-batching.md: the case must separate frontends that batch their
auto-aborts (reference, vllm-rs) from ones that never do (mutant:abort_one_frame_per_id,
vllm-py) on every run, also while both cores are busy. Each trial starts `--load` busy-loop
processes of its own (each bounded by `--load-seconds`, killed by pid after the trial), runs
the case in a fresh pytest process against every `--frontend`, and records the verdict and
the ABORT frame sizes. The tally is written as JSON (and printed as a Markdown table).

    .venv/bin/python scripts/abort_batching_trials.py --trials 20 --out /tmp/tally.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

CASE = "abort.burst.shares_frame"
DEFAULT_FRONTENDS = ["reference", "mutant:abort_one_frame_per_id", "vllm-rs"]
ROOT = Path(__file__).resolve().parent.parent
BUSY_LOOP = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\n" \
            "while time.monotonic() < end:\n    pass\n"


def start_load(count: int, seconds: float) -> list[subprocess.Popen[bytes]]:
    """`count` busy-loop processes that end by themselves after `seconds` at the latest."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(seconds)])
            for _ in range(count)]


def stop_load(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def run_trial(frontends: list[str], report_dir: str, timeout: float) -> list[dict[str, Any]]:
    """One pytest process running the case against every frontend; its result records."""
    cmd = [sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider", "-n", "0",
           "-q", "-k", CASE.rsplit(".", 1)[-1], "--report-dir", report_dir]
    for frontend in frontends:
        cmd += ["--frontend", frontend]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.setdefault("VLLM_HOST_IP", "127.0.0.1")
    subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=timeout, check=False)
    results_file = Path(report_dir) / "results.json"
    if not results_file.exists():
        return [{"frontend": f, "verdict": "NO-RESULT", "sizes": None} for f in frontends]
    data = json.loads(results_file.read_text())
    records = data["results"] if isinstance(data, dict) else data
    out = []
    for record in records:
        if record.get("id") != CASE:
            continue
        notes = (record.get("evidence") or {}).get("notes") or []
        sizes = next((n.split("per burst ", 1)[1] for n in notes if "per burst" in n), None)
        out.append({"frontend": record["frontend"], "verdict": record["verdict"],
                    "sizes": sizes})
    return out


def markdown(tally: dict[str, Any]) -> str:
    frontends: list[str] = tally["frontends"]
    lines = ["| trial | " + " | ".join(frontends) + " |",
             "|---|" + "---|" * len(frontends)]
    for trial in tally["trials"]:
        by_frontend = {r["frontend"]: r["verdict"] for r in trial["results"]}
        lines.append(f"| {trial['trial']} | "
                     + " | ".join(by_frontend.get(f, "-") for f in frontends) + " |")
    lines.append("| total | " + " | ".join(
        ", ".join(f"{v} {n}" for v, n in sorted(tally["totals"][f].items()))
        for f in frontends) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--frontend", action="append", dest="frontends")
    parser.add_argument("--load", type=int, default=2, help="busy-loop processes per trial")
    parser.add_argument("--load-seconds", type=float, default=300.0)
    parser.add_argument("--trial-timeout", type=float, default=600.0)
    parser.add_argument("--out", default="abort-batching-tally.json")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the finally below still ends this trial's load.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    frontends = args.frontends or DEFAULT_FRONTENDS
    tally: dict[str, Any] = {
        "case": CASE, "frontends": frontends, "load_processes": args.load,
        "cpus": os.cpu_count(), "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "timescale": os.environ.get("COREWIRE_TIMESCALE", "1"), "trials": []}
    totals: dict[str, Counter[str]] = {f: Counter() for f in frontends}
    for trial in range(1, args.trials + 1):
        load = start_load(args.load, args.load_seconds)
        started = time.monotonic()
        try:
            with tempfile.TemporaryDirectory(prefix="cw-abort-trial-") as report_dir:
                results = run_trial(frontends, report_dir, args.trial_timeout)
        finally:
            stop_load(load)
        for r in results:
            totals.setdefault(r["frontend"], Counter())[r["verdict"]] += 1
        tally["trials"].append({"trial": trial, "seconds": round(time.monotonic() - started, 1),
                                "loadavg": os.getloadavg()[0], "results": results})
        print(f"trial {trial}: " + ", ".join(f"{r['frontend']}={r['verdict']} {r['sizes']}"
                                             for r in results), flush=True)
        tally["totals"] = {f: dict(c) for f, c in totals.items()}
        Path(args.out).write_text(json.dumps(tally, indent=1))
    print(markdown(tally))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
