"""The BEFORE figure of the history mutants (docs/mutation-history.md).

Runs the whole wire suite (`-m "not components"`) against each history mutant in turn
(harness.mutation.registry.history_mutants(); one child pytest run per mutant, so runs are
serialised) with the firing check loaded (harness/mutation/history_fired.py), and records
for every mutant: the cases that caught it (verdict and level), and the cases during which
its broken branch fired. Writes fixtures/history-mutants.json and prints a summary.

    python scripts/history_matrix.py [--workers 2] [NAME ...]

A name given on the command line re-runs that mutant only and updates its entry.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.mutation.registry import history_mutants  # noqa: E402

HISTORY_MUTANTS = history_mutants()
from harness.mutation.killmatrix import HARMLESS, PREFIX  # noqa: E402
from harness.results.writer import load_results  # noqa: E402

RECORD = ROOT / "fixtures" / "history-mutants.json"


def run_one(name: str, workers: int, timeout: float) -> dict[str, Any]:
    """One child pytest run of the wire suite against mutant:`name`."""
    with tempfile.TemporaryDirectory(prefix="corewire-history-") as tmp:
        fired_log = Path(tmp) / "fired.log"
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "-n", str(workers), "--report-dir", str(Path(tmp) / "reports"),
                str(ROOT / "conformance"), "-m", "not components",
                "--frontend", f"{PREFIX}{name}",
                "-p", "harness.mutation.history_fired", "--fired-log", str(fired_log)]
        began = time.monotonic()
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
        seconds = round(time.monotonic() - began, 1)
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"pytest exited {proc.returncode} for {name}:\n"
                               f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        results = load_results(str(Path(tmp) / "reports" / "results.json"))
        fired: set[str] = set()
        if fired_log.exists():
            for line in fired_log.read_text(encoding="utf-8").splitlines():
                _mutant, _, node = line.partition("\t")
                case = node.rpartition("::")[2].partition("[")[0]
                fired.add(case or "(outside a case)")
    caught = {r.case_id: {"verdict": r.verdict.value, "level": r.level,
                          "message": r.message[:300]}
              for r in results if r.verdict not in HARMLESS}
    return {"rule": HISTORY_MUTANTS[name].rule, "source": HISTORY_MUTANTS[name].source,
            "cases_run": len(results), "seconds": seconds,
            "fired_in": sorted(fired), "caught_by": dict(sorted(caught.items()))}


def classify(entry: dict[str, Any]) -> str:
    """MUST (a MUST case fails it), SHOULD (only SHOULD cases, NON-STRICT), none, or
    not fired (the broken branch never acted: the run proves nothing)."""
    if not entry["fired_in"]:
        return "not fired"
    levels = {c["level"] for c in entry["caught_by"].values()}
    if "MUST" in levels:
        return "MUST"
    if levels:
        return "SHOULD only"
    return "not caught"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="history mutants to (re-)run; default all")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--record", type=Path, default=RECORD)
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(HISTORY_MUTANTS))
    if unknown:
        print(f"unknown history mutants {unknown}", file=sys.stderr)
        return 4
    record: dict[str, Any] = (json.loads(args.record.read_text()) if args.record.exists()
                              and args.names else {"mutants": {}})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    for name in args.names or list(HISTORY_MUTANTS):
        entry = run_one(name, args.workers, args.timeout)
        entry["commit"] = commit
        record["mutants"][name] = entry
        print(f"{name}: {classify(entry)}; fired in {len(entry['fired_in'])} case(s), "
              f"caught by {len(entry['caught_by'])} in {entry['seconds']}s", flush=True)
    record["mutants"] = {n: record["mutants"][n] for n in HISTORY_MUTANTS
                         if n in record["mutants"]}
    record["generated_by"] = "scripts/history_matrix.py; do not edit by hand"
    record["updated"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    counts: dict[str, int] = {}
    for entry in record["mutants"].values():
        entry["class"] = classify(entry)
        counts[entry["class"]] = counts.get(entry["class"], 0) + 1
    record["summary"] = dict(sorted(counts.items()))
    args.record.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
    print(f"summary: {record['summary']} -> {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
