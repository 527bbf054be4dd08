"""The README's numbers and the CLI's help come from the code (issue #24).

"468 wire cases (and 20 component cases)" and "198 deliberately broken variants" are
checked against the case index (the collected suite) and the mutant registry, and
`corewire run --help` must list every spec form the README's table lists, with defaults.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from harness.cases.index import case_specs
from harness.mutation.registry import mutants

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_case_counts_in_the_readme_are_the_suites() -> None:
    found = re.search(r"(\d+) wire cases \(and (\d+) component cases\)", README)
    assert found, "the README no longer states the case counts"
    specs = case_specs()
    wire = sum(1 for spec, _ in specs.values() if spec.area != "components")
    assert (int(found.group(1)), int(found.group(2))) == (wire, len(specs) - wire)


def test_the_wire_count_is_what_pytest_collects() -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "conformance"),
                           "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    items = [line for line in proc.stdout.splitlines() if "::" in line]
    found = re.search(r"(\d+) wire cases", README)
    assert found and len(items) == int(found.group(1)), proc.stdout[-1000:]


def test_mutant_count_in_the_readme_is_the_registry() -> None:
    found = re.search(r"\*\*Mutants\*\*: (\d+) deliberately broken variants", README)
    assert found and int(found.group(1)) == len(mutants())


def test_every_frontend_form_is_in_the_readme_table_and_run_help() -> None:
    rows = re.findall(r"^\| `([^`]+)`", README, re.MULTILINE)
    forms = {row.split("'")[0].split("NAME")[0].split("UNIT")[0].split("X")[0]
             for row in rows}
    assert {"kv:", "ec:", "subprocess:", "mutant:", "vllm-rs@", "reference-subprocess",
            "vllm-py"} <= forms, forms
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0
    for form in ("kv:", "ec:", "subprocess:", "mutant:NAME", "vllm-rs@X", "[NAME=]SPEC",
                 "reference-subprocess", "vllm-py"):
        assert form in text, form
    for default in ("default auto: 6 per CPU", "(default: reports)", "(default: reference)",
                    "(default: vllm-0.33", "6 reports not written", "7 a frontend could not start"):
        assert default in text, default
