"""A fixed sample of mutmut's mutants of the reference core, re-checked by `make test`.

The full mutmut run (`make mutation`) takes many minutes; this keeps a handful of the
mutants it generated and killed as one-line patches against core.py
(fixtures/mutation/sample.json). Each is applied to a private copy of the `harness`
package, and the case recorded as its killer must still fail it: a case that lost its
power, or a reference core that drifted from the recorded lines, shows up in seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

CORE_PATH = "harness/frontends/reference/core.py"
SAMPLE_FILE = "fixtures/mutation/sample.json"
REGENERATE_HINT = "regenerate with `make mutation` (or scripts/mutation.py sample after a run)"
FAILING = ("FAIL", "ERROR", "TIMEOUT", "NON-STRICT")


class SampleError(Exception):
    """A recorded mutant no longer applies to core.py (the code it changes moved)."""


@dataclass(frozen=True)
class SampleMutant:
    name: str  # mutmut's generated name, for the record
    function: str  # Class.method or function in core.py
    old: str  # the one line it changes, stripped
    new: str  # what the mutant has instead, stripped
    tests: list[str] = field(default_factory=list)  # node ids: the killer first


@dataclass(frozen=True)
class SampleVerdict:
    killed: bool
    detail: str
    killer: str | None = None


def function_lines(lines: Sequence[str], function: str) -> range:
    """Line indexes of `function`'s body (Class.method or a module-level function)."""
    *owner, name = function.split(".")
    start, indent = 0, ""
    if owner:
        start = _find(lines, f"class {owner[0]}", 0, "", function)
        indent = "    "
    header = _find(lines, f"def {name}(", start, indent, function)
    end = header + 1
    while end < len(lines) and (not lines[end].strip()
                                or _indent(lines[end]) > len(indent)):
        end += 1
    return range(header + 1, end)


def _find(lines: Sequence[str], prefix: str, start: int, indent: str, function: str) -> int:
    for i in range(start, len(lines)):
        if lines[i].startswith(indent + prefix) or \
                lines[i].startswith(indent + "async " + prefix):
            return i
    raise SampleError(f"{function}: no '{prefix}' in {CORE_PATH}; {REGENERATE_HINT}")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def apply(source: str, mutant: SampleMutant) -> str:
    """core.py with the mutant's one line replaced; SampleError unless it matches once."""
    lines = source.splitlines(keepends=True)
    hits = [i for i in function_lines(lines, mutant.function)
            if lines[i].strip() == mutant.old]
    if len(hits) != 1:
        raise SampleError(f"{mutant.name}: {mutant.function} has {len(hits)} lines "
                          f"'{mutant.old}' (expected one); {REGENERATE_HINT}")
    line = lines[hits[0]]
    lines[hits[0]] = line[:_indent(line)] + mutant.new + "\n"
    return "".join(lines)


def run_one(root: Path, mutant: SampleMutant, *, find_killer: bool,
            timeout: float = 300.0) -> SampleVerdict:
    """Apply the mutant to a copy of `harness` and run its tests against the reference;
    with find_killer, all its tests in order until the first kill, else the first only."""
    with tempfile.TemporaryDirectory(prefix="corewire-mutation-") as tmp:
        copy = Path(tmp) / "harness"
        shutil.copytree(root / "harness", copy,
                        ignore=shutil.ignore_patterns("__pycache__"))
        # The harness finds its fixtures (tiny model, LoRA adapter) beside its package.
        (Path(tmp) / "fixtures").symlink_to(root / "fixtures", target_is_directory=True)
        try:
            patched = apply((root / CORE_PATH).read_text(), mutant)
        except SampleError as exc:
            return SampleVerdict(False, str(exc))
        (Path(tmp) / CORE_PATH).write_text(patched)
        tests = mutant.tests if find_killer else mutant.tests[:1]
        if not tests:
            return SampleVerdict(False, f"{mutant.name}: no recorded test")
        reports = Path(tmp) / "reports"
        argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                "-p", "no:xdist", "-p", "harness.mutation.strict", "--frontend", "reference",
                "--report-dir", str(reports), *(str(root / t) for t in tests)]
        # From the copy's directory: `python -m` puts the cwd first on sys.path, so the
        # patched `harness` wins; the suite itself is still read from `root`.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, str(root)]))
        proc = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True,
                              timeout=timeout)
        failing = _failing_cases(reports / "results.json")
        if failing:
            case = failing[0]
            killer = next((t for t in tests if t.split("::", 1)[1].startswith(case + "[")),
                          None)
            return SampleVerdict(True, f"{case} failed it", killer)
        return SampleVerdict(False, f"{mutant.name} ({mutant.function}: '{mutant.old}' -> "
                                    f"'{mutant.new}') survived {len(tests)} test(s), pytest "
                                    f"exit {proc.returncode}: {proc.stdout[-800:]}")


def _failing_cases(results: Path) -> list[str]:
    if not results.exists():
        return []
    doc = json.loads(results.read_text())
    return [r["id"] for r in doc["results"] if r["verdict"] in FAILING]


def run_sample(root: Path, sample: Sequence[SampleMutant], *, find_killer: bool = False,
               workers: int = 2) -> dict[str, SampleVerdict]:
    """Every sample mutant, `workers` at a time (the cases mostly wait on sockets)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        verdicts = pool.map(lambda s: run_one(root, s, find_killer=find_killer), sample)
        return {s.name: v for s, v in zip(sample, verdicts, strict=True)}


def load_sample(root: Path) -> list[SampleMutant]:
    doc = json.loads((root / SAMPLE_FILE).read_text())
    return [SampleMutant(**entry) for entry in doc["mutants"]]


def save_sample(root: Path, sample: Sequence[SampleMutant]) -> None:
    entries = [asdict(s) for s in sample]
    path = root / SAMPLE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"generated_by": "scripts/mutation.py sample; do not edit",
                                "source": CORE_PATH, "mutants": entries}, indent=1) + "\n")
