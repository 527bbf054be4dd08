"""Generate docs/spec.md: the engine-core wire protocol as of vLLM 0.33.0
(harness.cases.spec_document).

    .venv/bin/python scripts/gen_spec.py            # rewrite docs/spec.md
    .venv/bin/python scripts/gen_spec.py --check    # exit 1 if docs/spec.md is stale

Reads the protocol profile, the case specs and the committed docs/compliance.md and
docs/history.md; needs no vLLM and no network.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.cases.index import wire_specs  # noqa: E402
from harness.cases.spec_document import render_spec  # noqa: E402

PROFILE = ROOT / "fixtures" / "profiles" / "vllm-0.33.0.json"
DOC = ROOT / "docs" / "spec.md"


def generate() -> str:
    specs = {case_id: spec for case_id, (spec, _) in wire_specs().items()}
    return render_spec(json.loads(PROFILE.read_text()), specs,
                       (ROOT / "docs" / "compliance.md").read_text(encoding="utf-8"),
                       (ROOT / "docs" / "history.md").read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="generate docs/spec.md")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if docs/spec.md differs from what would be generated")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        if not DOC.exists() or DOC.read_text(encoding="utf-8") != text:
            print(f"{DOC} is stale: run `make spec`", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
