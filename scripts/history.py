"""make history: every case against the Rust frontend of every release -> docs/history.md.

One pytest run per release (`--frontend vllm-rs@X`, results in reports/history/X/), then the
matrix is rendered from those results.json files. `--skew` runs the version-skew grid instead
(harness/results/skew.py: a few cases for every frontend x engine profile, results in
reports/history/skew/<frontend>/<profile>/). `--render-only` skips the runs (re-renders what
reports/history/ holds, skew included); `-k` narrows the cases (for trying it out).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.frontends.vllm_rs.releases import RELEASES  # noqa: E402
from harness.results.history import render_history  # noqa: E402
from harness.results.skew import (  # noqa: E402
    SKEW_RELEASES,
    frontend_dir,
    load_skew,
    selection,
    skew_frontends,
)


def run_release(release: str, report_dir: Path, workers: str, selection: str | None) -> None:
    argv = [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-p",
            "no:cacheprovider", "-n", workers, "--frontend", f"vllm-rs@{release}",
            "--report-dir", str(report_dir)]
    if selection:
        argv += ["-k", selection]
    print(f"==> vllm-rs@{release}", flush=True)
    # Exit 1 (a FAIL somewhere) is the expected outcome for old releases; only a missing
    # results.json means the run itself broke.
    subprocess.run(argv, cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
    if not (report_dir / "results.json").is_file():
        raise SystemExit(f"history: the run of vllm-rs@{release} wrote no results.json")


def run_skew_profile(release: str, skew_root: Path, workers: str) -> None:
    """Every skew frontend against engines of `release`, in one pytest run; its rows are then
    split into skew/<frontend>/<release>/results.json."""
    raw = skew_root / "_runs" / release
    argv = [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-p",
            "no:cacheprovider", "-n", workers, "-k", selection(), "--profile", f"vllm-{release}",
            "--report-dir", str(raw)]
    for frontend in skew_frontends():
        argv += ["--frontend", frontend]
    print(f"==> skew: engines vllm-{release}", flush=True)
    subprocess.run(argv, cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
    if not (raw / "results.json").is_file():
        raise SystemExit(f"history: the skew run of vllm-{release} wrote no results.json")
    doc = json.loads((raw / "results.json").read_text())
    for frontend in skew_frontends():
        out = skew_root / frontend_dir(frontend) / release
        out.mkdir(parents=True, exist_ok=True)
        rows = [row for row in doc["results"] if row["frontend"] == frontend]
        (out / "results.json").write_text(json.dumps({"meta": doc["meta"], "results": rows},
                                                     indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--releases", nargs="*", default=list(RELEASES))
    parser.add_argument("--report-root", type=Path, default=ROOT / "reports" / "history")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "history.md")
    parser.add_argument("-n", dest="workers", default="2", help="pytest-xdist workers")
    parser.add_argument("-k", dest="selection", help="pytest -k expression")
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument("--skew", action="store_true",
                        help="run the version-skew grid (not the per-release runs)")
    parser.add_argument("--skew-profiles", nargs="*", default=list(SKEW_RELEASES))
    args = parser.parse_args(argv)
    skew_root = args.report_root / "skew"
    if args.skew and not args.render_only:
        for release in args.skew_profiles:
            run_skew_profile(release, skew_root, args.workers)
    runs: dict[str, dict[str, Any]] = {}
    for release in args.releases:
        report_dir = args.report_root / release
        if not (args.render_only or args.skew):
            run_release(release, report_dir, args.workers, args.selection)
        results = report_dir / "results.json"
        if results.is_file():
            runs[release] = json.loads(results.read_text())
    skew = load_skew(skew_root)
    if not runs and not skew:
        raise SystemExit(f"history: no results under {args.report_root}")
    args.out.write_text(render_history(runs, skew))
    print(f"history: {args.out} ({len(runs)} releases, {len(skew)} skew combinations)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
