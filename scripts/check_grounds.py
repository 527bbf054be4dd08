"""Check every wire case's grounds against the vLLM 0.33.0 sdist: `python scripts/check_grounds.py
[FILE ...]` (default: the whole suite). Exit 1 and one line per problem when any is wrong."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.cases.index import grounds_problems, wire_specs  # noqa: E402
from harness.cases.vllm_sources import vllm_0_33_sources  # noqa: E402


def main(argv: list[str]) -> int:
    specs = wire_specs(files=[Path(a) for a in argv] if argv else None)
    problems = grounds_problems(specs, vllm_0_33_sources())
    for line in problems:
        print(line)
    grounded = sum(1 for s, _ in specs.values() if s.grounds is not None)
    print(f"{len(specs)} cases, {grounded} with grounds, {len(problems)} problems",
          file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
