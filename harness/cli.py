"""`corewire` command: run the suites, compare runs, re-render reports.

    corewire run [--frontend F ...] [-k EXPR] [-n N] [--baseline FILE] [-- PYTEST ARGS]
    corewire diff OLD.json NEW.json
    corewire report RESULTS.json [--out report.html]
    corewire compliance RESULTS.json [--baseline FILE] [--out docs/compliance.md]

Exit codes of `run` are pytest's: 0 all graded verdicts acceptable, 1 some FAIL / ERROR /
TIMEOUT not tolerated by the baseline (or a stale/expired baseline entry), 2 interrupted,
4 usage error, 5 no case ran. `diff` exits 1 when a case moved into a failing verdict.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

CONFORMANCE_DIR = Path(__file__).resolve().parent.parent / "conformance"


def _run(args: argparse.Namespace, extra: list[str]) -> int:
    import subprocess

    os.makedirs(args.report_dir, exist_ok=True)
    argv = [str(CONFORMANCE_DIR), "-p", "no:cacheprovider", "-q",
            "--report-dir", args.report_dir,
            f"--junitxml={os.path.join(args.report_dir, 'junit.xml')}",
            "-o", "junit_family=xunit2", "-o", "junit_logging=system-out",
            "-o", "junit_suite_name=corewire"]
    for frontend in args.frontend or ["reference"]:
        argv += ["--frontend", frontend]
    if args.k:
        argv += ["-k", args.k]
    if args.m:
        argv += ["-m", args.m]
    if args.n and args.n != "0":
        argv += ["-n", args.n]
    if args.baseline:
        argv += ["--baseline", args.baseline]
    if args.update_baseline:
        argv += ["--update-baseline"]
    if args.timescale:
        argv += ["--timescale", str(args.timescale)]
    # A child process: pytest must import (and assertion-rewrite) the plugin itself.
    return subprocess.run([sys.executable, "-m", "pytest", *argv, *extra]).returncode


def _diff(args: argparse.Namespace) -> int:
    from harness.report.diff import diff_results, format_diff
    from harness.report.writer import load_results

    transitions = diff_results(load_results(args.old), load_results(args.new))
    print(format_diff(transitions))
    return 1 if any(t.regression for t in transitions) else 0


def _report(args: argparse.Namespace) -> int:
    import json

    from harness.report.html import render_html

    with open(args.results) as fh:
        doc = json.load(fh)
    out = args.out or os.path.join(os.path.dirname(args.results) or ".", "report.html")
    with open(out, "w") as fh:
        fh.write(render_html(doc))
    print(out)
    return 0


def _compliance(args: argparse.Namespace) -> int:
    import json

    from harness.baseline import Baseline
    from harness.report.compliance import render_compliance

    with open(args.results) as fh:
        doc = json.load(fh)
    baseline = Baseline.load(args.baseline) if args.baseline else None
    text = render_compliance(doc, baseline)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
        print(args.out)
    else:
        print(text, end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    parser = argparse.ArgumentParser(prog="corewire", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the conformance suites")
    run.add_argument("--frontend", action="append",
                     help="reference (default), reference-subprocess, vllm-rs, vllm-py, "
                          "subprocess:'CMD', mutant:NAME; repeatable")
    run.add_argument("-k", help="pytest -k expression, e.g. abort")
    run.add_argument("-m", help="pytest -m expression, e.g. 'dp and must'")
    run.add_argument("-n", default="2", help="pytest-xdist workers (0: none)")
    run.add_argument("--report-dir", default="reports")
    run.add_argument("--baseline")
    run.add_argument("--update-baseline", action="store_true")
    run.add_argument("--timescale", type=float)
    diff = sub.add_parser("diff", help="verdict transitions between two results.json")
    diff.add_argument("old")
    diff.add_argument("new")
    rep = sub.add_parser("report", help="re-render the HTML report from results.json")
    rep.add_argument("results")
    rep.add_argument("--out")
    comp = sub.add_parser("compliance", help="render docs/compliance.md from results.json")
    comp.add_argument("results")
    comp.add_argument("--baseline")
    comp.add_argument("--out")
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args, extra)
    if args.command == "diff":
        return _diff(args)
    if args.command == "compliance":
        return _compliance(args)
    return _report(args)


if __name__ == "__main__":
    sys.exit(main())
