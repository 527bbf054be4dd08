"""Rebuild fixtures/baselines/vllm-0.33.json from a full run, each reason from the case's
grounds: `python scripts/ground_baseline.py reports/compliance/results.json`.

Every tolerated non-PASS verdict (INFO and UNSUPPORTED excepted) becomes an entry whose
reason is the case's basis and note followed by the checked citations (path:line
`snippet`) of the frontend's own implementation, so the reason says which vLLM lines show
the divergence and tests/test_grounds.py verifies them. Issue links and expiry dates of
entries that persist are kept; new entries expire in 180 days.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.cases.grounds import Grounds, Impl  # noqa: E402
from harness.cases.index import wire_specs  # noqa: E402
from harness.results.baseline import Baseline, BaselineEntry  # noqa: E402
from harness.results.schema import read_results  # noqa: E402

BASELINE = Path(__file__).resolve().parent.parent / "fixtures" / "baselines" / "vllm-0.33.json"
OWN = {"vllm-py": (Impl.PYTHON, Impl.ENGINE), "vllm-rs": (Impl.RUST, Impl.ENGINE)}


def reason_for(grounds: Grounds, frontend: str) -> str:
    impls = OWN.get(frontend, tuple(Impl))
    cites = [c for c in grounds.cites if c.impl in impls] or list(grounds.cites)
    note = grounds.note or "both 0.33.0 frontends hold the rule"
    return (f"[{grounds.basis.value}] {note}. vLLM 0.33.0: "
            + "; ".join(c.render() for c in cites))


def main(argv: list[str]) -> int:
    results = read_results(argv[0])
    old = Baseline.load(str(BASELINE))
    specs = wire_specs()
    expires = (dt.date.today() + dt.timedelta(days=180)).isoformat()
    entries: dict[tuple[str, str], BaselineEntry] = {}
    for result in sorted(results, key=lambda r: (r.case_id, r.frontend)):
        if result.verdict.value in ("PASS", "INFO", "UNSUPPORTED", "NOT-RUN"):
            continue
        spec = specs.get(result.case_id)
        before = old.get(result.case_id, result.frontend)
        if spec is not None and spec[0].grounds is not None:
            reason = reason_for(spec[0].grounds, result.frontend)
        elif before is not None:
            reason = before.reason
        else:
            raise SystemExit(f"{result.case_id}[{result.frontend}]: no grounds, no reason")
        entries[(result.case_id, result.frontend)] = BaselineEntry(
            result.case_id, result.frontend, result.verdict.value, reason,
            before.issue if before else "docs/compliance.md#divergences",
            before.expires if before and before.verdict == result.verdict.value else expires)
    Baseline(entries).save(str(BASELINE))
    print(f"{len(entries)} entries (was {len(old.entries)})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
