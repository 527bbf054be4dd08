"""``python -m harness.stateful run|replay|promote``: fuzz a core, re-run or keep a failure."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from harness.stateful.invariants import InvariantViolation
from harness.stateful.replays import STATEFUL_DIR_ENV, promote, replay
from harness.stateful.run import resolve_core, run_stateful
from harness.stateful.settings import stateful_settings
from harness.stateful.worlds import TRANSPORTS


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.stateful",
                                     description="corewire stateful fuzzing")
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="fuzz a core; failures become replay files")
    run_p.add_argument("--core", default="reference",
                       help="reference, mutant:NAME or module:Attr")
    run_p.add_argument("--transport", choices=TRANSPORTS, default="sansio")
    run_p.add_argument("--examples", type=int, default=None)
    run_p.add_argument("--seed", type=int, default=None)
    run_p.add_argument("--dir", default=None, help=f"replay directory (${STATEFUL_DIR_ENV})")
    replay_p = sub.add_parser("replay", help="re-run a replay file")
    replay_p.add_argument("file")
    replay_p.add_argument("--core", default="reference")
    promote_p = sub.add_parser("promote", help="copy a replay file into the regressions")
    promote_p.add_argument("file")
    promote_p.add_argument("--name", default=None)
    promote_p.add_argument("--no-check", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "run":
        try:
            run_stateful(resolve_core(args.core), transport=args.transport, seed=args.seed,
                         settings=stateful_settings(max_examples=args.examples),
                         replay_directory=args.dir)
        except Exception as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            for path in getattr(exc, "replay_files", []):
                print(f"replay file: {path}", file=sys.stderr)
            return 1
        print("no invariant violated")
        return 0
    if args.command == "replay":
        try:
            replay(args.file, resolve_core(args.core))
        except InvariantViolation as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            return 1
        print("replay passed: no invariant violated")
        return 0
    print(promote(args.file, name=args.name, check=not args.no_check))
    return 0
