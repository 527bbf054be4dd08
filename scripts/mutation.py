"""`make mutation`: mutmut over the reference frontend, killed by the conformance suite.

    scripts/mutation.py run      fresh `mutmut run` (timed), then `report` and `sample`
    scripts/mutation.py recheck  re-run only the mutants the last run did not kill, against
                                 today's suite (mutmut's cache keeps every other verdict)
    scripts/mutation.py recheck-new  the mutants still alive, against only the cases added
                                 since the full run (the only ones that can change them)
    scripts/mutation.py report   docs/mutation.md from the results in mutants/
    scripts/mutation.py sample   re-record fixtures/mutation/sample.json (for make test)
    scripts/mutation.py watchdog the wall-clock bound alone, beside a run started elsewhere
    scripts/mutation.py audit    re-run a seeded sample of the last run's kills alone (a
                                 kill that does not repeat makes the run's score suspect)

mutmut (config: [tool.mutmut] in pyproject.toml) copies the project into mutants/, runs the
suite once against `--frontend reference` to learn which case calls which function, then
runs for each mutant only the cases that call its function, stopping at the first kill.
Survivors are judged in fixtures/mutation/equivalent.json (keyed by function and changed
lines, so the judgement outlives mutmut's renumbering); the report is regenerated, never
edited by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.mutation.sample import (  # noqa: E402
    CORE_PATH,
    SampleError,
    SampleMutant,
    function_lines,
    run_sample,
    save_sample,
)

SOURCE_DIR = "harness/frontends/reference"
EQUIVALENT = ROOT / "fixtures" / "mutation" / "equivalent.json"
REPORT = ROOT / "docs" / "mutation.md"
RUN_INFO = ROOT / "mutants" / "corewire-run.json"
SAMPLE_SIZE = 16
# mutmut bounds each mutant's CPU time only (SIGXCPU). A mutant that blocks idle -- e.g. a
# frontend left unclosed whose zmq context, collected later, waits forever in term() --
# would hold its child for good and the run would never end. The watchdog gives every
# child the same kind of bound in wall-clock time and ends it with SIGXCPU, which mutmut
# counts as a timeout (detected), exactly as for a CPU-bound hang.
WALL_BOUND_S = 600.0
KILLED = {1, 3}  # pytest: tests failed / internal error (mutmut counts both as a kill)
TIMEOUT = {24, -24, 36, 152, 255}
NO_TESTS = {5, 33}


@dataclass(frozen=True)
class MutantResult:
    name: str  # mutmut's name, e.g. harness.frontends.reference.core.xǁCǁmethod__mutmut_3
    path: str  # source file, relative to the project
    function: str  # Class.method or function
    removed: tuple[str, ...]  # changed lines of the original (stripped)
    added: tuple[str, ...]  # what the mutant has instead
    diff: str
    exit_code: int | None

    @property
    def status(self) -> str:
        if self.exit_code in KILLED:
            return "killed"
        if self.exit_code in TIMEOUT:
            return "timeout"
        if self.exit_code in NO_TESTS:
            return "no tests"
        if self.exit_code == 0:
            return "survived"
        return "not checked" if self.exit_code is None else f"suspicious ({self.exit_code})"

    @property
    def key(self) -> str:
        """Stable identity: the function and the changed lines, not mutmut's number."""
        return "\n".join([f"{self.path}::{self.function}", *(f"- {r}" for r in self.removed),
                          *(f"+ {a}" for a in self.added)])


def function_of(name: str) -> str:
    """xǁClassǁmethod__mutmut_3 -> Class.method; x_function__mutmut_3 -> function."""
    generated = name.rpartition(".")[2].rpartition("__mutmut_")[0]
    if generated.startswith("xǁ"):
        return ".".join(generated[2:].split("ǁ"))
    return generated.removeprefix("x_")


def load_results() -> list[MutantResult]:
    """Every mutant of the last run, with its diff, read through mutmut's own API."""
    os.chdir(ROOT)  # mutmut reads pyproject.toml and mutants/ relative to the cwd
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    results = []
    for path in sorted(Path(SOURCE_DIR).glob("*.py")):
        meta_path = Path("mutants") / f"{path}.meta"
        if not meta_path.exists():
            continue
        meta: dict[str, Any] = json.loads(meta_path.read_text())
        for name, code in sorted(meta["exit_code_by_key"].items(), key=_natural):
            diff = get_diff_for_mutant(name, path=str(path))
            body = diff.splitlines()[3:]  # past ---, +++ and @@
            results.append(MutantResult(
                name, str(path), function_of(name),
                tuple(line[1:].strip() for line in body if line.startswith("-")),
                tuple(line[1:].strip() for line in body if line.startswith("+")),
                diff, code))
    return results


def _natural(item: tuple[str, Any]) -> tuple[str, int]:
    stem, _, number = item[0].rpartition("__mutmut_")
    return stem, int(number or 0)


def load_equivalent() -> dict[str, str]:
    """key -> why the mutant cannot be told apart from the reference by any client (or,
    for a conformant variant, why the contract allows what a client can tell apart)."""
    entries: list[dict[str, Any]] = json.loads(EQUIVALENT.read_text())["equivalent"]
    return {"\n".join([e["function"], *e["change"]]): e["reason"] for e in entries}


def load_conformant() -> set[str]:
    """Keys of the judgements that are conformant variants, not strict equivalents."""
    entries: list[dict[str, Any]] = json.loads(EQUIVALENT.read_text())["equivalent"]
    return {"\n".join([e["function"], *e["change"]]) for e in entries
            if e.get("kind") == "conformant"}


def _mutant_children() -> dict[int, float]:
    """pid -> start time (seconds since boot) of every live mutmut child on this machine."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not (entry / "cmdline").read_bytes().startswith(b"mutmut: "):
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        found[int(entry.name)] = int(fields[19]) / ticks  # field 22: starttime
    return found


def watchdog(stop: threading.Event, bound: float = WALL_BOUND_S) -> list[int]:
    """SIGXCPU to every mutmut child older than `bound` wall-clock seconds, until `stop`."""
    stopped: list[int] = []
    while not stop.wait(5.0):
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        for pid, started in _mutant_children().items():
            if uptime - started > bound and pid not in stopped:
                try:
                    os.kill(pid, signal.SIGXCPU)
                except ProcessLookupError:
                    continue
                stopped.append(pid)
                print(f"watchdog: mutant child {pid} over {bound:.0f} s wall clock: SIGXCPU",
                      file=sys.stderr)
    return stopped


def _mutmut(children: int, names: list[str]) -> tuple[int, dict[str, Any]]:
    """One timed `mutmut run` (all mutants, or only `names`); what the report says of it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_HOST_IP="127.0.0.1")
    started = time.monotonic()
    stop = threading.Event()
    stopped: list[int] = []
    guard = threading.Thread(target=lambda: stopped.extend(watchdog(stop)), daemon=True)
    guard.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children",
                               str(children), *names], cwd=ROOT, env=env)
    finally:
        stop.set()
        guard.join(10.0)
    seconds = time.monotonic() - started
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    print(f"mutmut run: {seconds:.0f}s, exit {proc.returncode}")
    return proc.returncode, {"seconds": round(seconds), "children": children,
                             "cpus": os.cpu_count(), "commit": commit,
                             "wall_bound_stops": len(stopped),
                             "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


AUDIT_SIZE = 30


def audit_kills(size: int = AUDIT_SIZE) -> dict[str, Any]:
    """Re-run a seeded sample of the mutants the run counted as killed, one at a time, each
    against every case that reaches its function. A kill that does not repeat was a case
    failing for another reason (on a loaded machine: a timing window missed), and then
    every kill of the run is suspect: a run on 2 busy CPUs once scored 99.2 % where the same
    mutants survive alone."""
    import random
    stats: dict[str, Any] = json.loads((ROOT / "mutants" / "mutmut-stats.json").read_text())
    by_function: dict[str, list[str]] = stats["tests_by_mangled_function_name"]
    killed = [r.name for r in load_results() if r.status == "killed"]
    sample = sorted(random.Random(20261127).sample(killed, min(size, len(killed))))
    repeated, lost = 0, []
    for name in sample:
        tests = sorted(by_function.get(name.rpartition("__mutmut_")[0], []))
        if _run_mutant_on(name, tests, 600.0) in KILLED | TIMEOUT:
            repeated += 1
        else:
            lost.append(name)
    print(f"kill audit: {repeated} of {len(sample)} sampled kills repeat", flush=True)
    return {"sampled": len(sample), "repeated": repeated, "lost": lost}


def cmd_run(children: int) -> int:
    shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    code, info = _mutmut(children, [])
    if code == 0:
        info["audit"] = audit_kills()
    RUN_INFO.write_text(json.dumps(info))
    if code != 0:
        return code
    if info["audit"]["lost"]:
        cmd_report()
        print("kill audit failed: some kills did not repeat alone; the run is not a "
              "score (re-run on a quiet machine)", file=sys.stderr)
        return 3
    return cmd_report() or cmd_sample()


def cmd_recheck(children: int) -> int:
    """Re-run the mutants the last run left alive against today's suite.

    Sound only while the mutated sources are unchanged since that run and cases were added,
    not weakened: a killed mutant stays killed. mutmut 3.8.1 regenerates a source file that
    changed (or merely has a newer mtime, as after a `git pull`) whole and drops every
    verdict in it, so after such a change this is a full run of that file.
    """
    if not RUN_INFO.exists():
        print("no previous run in mutants/: use `scripts/mutation.py run`", file=sys.stderr)
        return 4
    info: dict[str, Any] = json.loads(RUN_INFO.read_text())
    # First the mutants without a verdict: those of functions changed since (mutmut resets
    # them when it regenerates) and any new ones; mutmut skips every decided mutant.
    code, changed = _mutmut(children, [])
    if code != 0:
        return code
    equivalent = load_equivalent()
    alive = [r.name for r in load_results()
             if r.status not in ("killed", "timeout") and r.key not in equivalent]
    print(f"recheck: {len(alive)} mutants not killed so far")
    code, recheck = _mutmut(children, alive)
    recheck["seconds"] += changed["seconds"]
    info.setdefault("rechecks", []).append({**recheck, "mutants": len(alive)})
    RUN_INFO.write_text(json.dumps(info))
    if code != 0:
        return code
    return cmd_report() or cmd_sample()


def _collected_ids(commit: str) -> set[str]:
    """The conformance item ids of `commit` (a temporary worktree, collection only)."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="corewire-ids-") as tmp:
        subprocess.run(["git", "worktree", "add", "-q", "--detach", tmp, commit], cwd=ROOT,
                       check=True)
        try:
            out = subprocess.run(
                [sys.executable, "-m", "pytest", "conformance", "--collect-only", "-q",
                 "-p", "no:cacheprovider", "-p", "no:xdist", "--frontend", "reference",
                 "-m", "not components"], cwd=tmp, capture_output=True, text=True,
                env=dict(os.environ, PYTHONPATH=tmp)).stdout
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", tmp], cwd=ROOT,
                           check=False)
    return {line.strip() for line in out.splitlines() if "::" in line}


def _run_mutant_on(name: str, tests: list[str], bound: float) -> int:
    """mutmut's own kill test for one mutant, on `tests` only: the trampolined copy in
    mutants/, MUTANT_UNDER_TEST, the pyproject's pytest arguments, stop at the first kill."""
    import tomllib
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    argv = [sys.executable, "-m", "pytest", "--rootdir=.", "--tb=native", "-x", "-q",
            *tests, *cfg["pytest_add_cli_args"]]
    env = dict(os.environ, MUTANT_UNDER_TEST=name, VLLM_HOST_IP="127.0.0.1",
               PYTHONPATH=str(ROOT / "mutants"))
    try:
        return subprocess.run(argv, cwd=ROOT / "mutants", env=env, capture_output=True,
                              timeout=bound).returncode
    except subprocess.TimeoutExpired:
        return 24  # over the bound: a hang, counted as mutmut counts SIGXCPU


def cmd_recheck_new(workers: int, unchecked: bool = False) -> int:
    """Each mutant the full run left alive, against only the cases added since its commit.

    Sound because the mutated code is unchanged (mutmut's own `recheck` step re-ran the
    functions that changed) and the old cases did not kill it: only a new case can. The
    verdicts are written into mutmut's results, so `report` counts them like any other.
    """
    from concurrent.futures import ThreadPoolExecutor

    info: dict[str, Any] = json.loads(RUN_INFO.read_text())
    old = _collected_ids(info["commit"])
    stats: dict[str, Any] = json.loads((ROOT / "mutants" / "mutmut-stats.json").read_text())
    by_function: dict[str, list[str]] = stats["tests_by_mangled_function_name"]
    equivalent = load_equivalent()
    todo: list[tuple[str, list[str]]] = []
    for r in load_results():
        if unchecked != (r.status == "not checked"):
            continue  # --unchecked: the mutants of functions changed since, whole suite
        if r.status in ("killed", "timeout") or r.key in equivalent:
            continue
        covering = by_function.get(r.name.rpartition("__mutmut_")[0], [])
        tests = sorted(t for t in covering if unchecked or t not in old)
        if tests:
            todo.append((r.name, tests))
    print(f"recheck-new: {len(todo)} mutants" + (" never run (changed functions), every "
          "covering case" if unchecked else f" alive, cases added since {info['commit']}"),
          flush=True)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        codes = list(pool.map(lambda job: _run_mutant_on(job[0], job[1], 600.0), todo))
    verdicts = {name: code for (name, _), code in zip(todo, codes, strict=True)}
    for meta_path in (ROOT / "mutants").glob(f"{SOURCE_DIR}/*.py.meta"):
        meta = json.loads(meta_path.read_text())
        keys = meta["exit_code_by_key"]
        keys.update({k: verdicts[k] for k in keys if k in verdicts})
        meta_path.write_text(json.dumps(meta))
    seconds = time.monotonic() - started
    killed = sum(1 for c in codes if c in KILLED or c in TIMEOUT)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    info.setdefault("rechecks", []).append({
        "kind": "changed functions" if unchecked else "new cases", "commit": commit,
        "mutants": len(todo), "killed": killed,
        "seconds": round(seconds), "workers": workers,
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
    RUN_INFO.write_text(json.dumps(info))
    print(f"recheck-new: {killed} of {len(todo)} killed in {seconds:.0f}s")
    return cmd_report()


def cmd_report() -> int:
    import mutmut

    results = load_results()
    equivalent = load_equivalent()
    info: dict[str, Any] = json.loads(RUN_INFO.read_text()) if RUN_INFO.exists() else {}
    counts = Counter(r.status for r in results)
    unchecked = [r for r in results if r.status == "not checked"]  # a stopped run
    survivors = [r for r in results if r.status not in ("killed", "timeout", "not checked")]
    judged_equivalent = [r for r in survivors if r.key in equivalent]
    conformant = load_conformant()
    variants = [r for r in judged_equivalent if r.key in conformant]
    detected = counts["killed"] + counts["timeout"]
    scored = len(results) - len(unchecked) - len(judged_equivalent)
    score = 100.0 * detected / scored if scored else 0.0
    strict = 100.0 * detected / (scored + len(variants)) if scored + len(variants) else 0.0
    stale = sorted(set(equivalent) - {r.key for r in results})
    lines = [
        "# Mutation testing of the reference frontend",
        "",
        "Generated by `make mutation` (scripts/mutation.py) from a fresh "
        f"mutmut {mutmut.__version__} run over `{SOURCE_DIR}/`, killed by the conformance "
        "suite against `--frontend reference` (`-m \"not components\"`). Do not edit: "
        "judge survivors in `fixtures/mutation/equivalent.json` and re-run.",
        "",
        f"**Score: {score:.1f} %** of non-equivalent mutants killed "
        f"({detected} of {scored}; {len(results)} mutants, {len(judged_equivalent)} judged "
        f"equivalent, {len(variants)} of them conformant variants"
        + (f", {len(unchecked)} not checked: their functions changed after the run and "
           "they were not re-run" if unchecked else "") + ").",
        "",
        f"Strict score, counting the {len(variants)} conformant variants (a client can tell "
        "them apart; the contract allows both) as survivors: "
        f"**{strict:.1f} %** ({detected} of {scored + len(variants)}).",
        "",
        "| status | mutants |", "|---|---|",
        *(f"| {status} | {n} |" for status, n in sorted(counts.items())),
        "",
    ]
    if info:
        lines += [f"Full run: {info['seconds']} s wall clock with {info['children']} mutmut "
                  f"children on {info['cpus']} CPUs (finished {info['finished']}"
                  + (f", commit {info['commit']}" if info.get("commit") else "") + ")."
                  + (f" {info['note']}" if info.get("note") else ""), ""]
        if info.get("audit"):
            audit = info["audit"]
            lines += [f"Kill audit: {audit['repeated']} of {audit['sampled']} kills, sampled "
                      "with a fixed seed and re-run alone against every case reaching their "
                      "function, repeat"
                      + (f"; **not repeated: {', '.join(audit['lost'])}** (the run's kills "
                         "are suspect)" if audit["lost"] else "") + ".", ""]
        for again in info.get("rechecks", []):
            if again.get("kind") == "changed functions":
                lines += [f"Recheck (`scripts/mutation.py recheck-new --unchecked`) at commit "
                          f"{again['commit']}: the {again['mutants']} mutants of functions "
                          "changed since the full run (mutmut regenerated them), each "
                          "against every case that reaches its function: "
                          f"{again['killed']} killed, {again['seconds']} s with "
                          f"{again['workers']} workers (finished {again['finished']})."
                          + (f" {again['note']}" if again.get("note") else ""), ""]
                continue
            if again.get("kind") == "new cases":
                lines += [f"Recheck (`scripts/mutation.py recheck-new`) at commit "
                          f"{again['commit']}: each of the {again['mutants']} mutants still "
                          "alive, run against only the cases added since the full run that "
                          "reach its function (the old ones did not kill it, and its code is "
                          f"unchanged): {again['killed']} killed, {again['seconds']} s with "
                          f"{again['workers']} workers (finished {again['finished']}).", ""]
                continue
            lines += [f"Recheck (`make mutation-recheck`) at commit {again['commit']}: "
                      "first every mutant without a verdict (those of functions changed "
                      "since the full run, which mutmut resets), then the "
                      f"{again['mutants']} mutants still alive, against that commit's "
                      f"suite: {again['seconds']} s (finished {again['finished']}). Every "
                      "other verdict is the full run's: the code of its function is "
                      "unchanged and cases were only added.", ""]
    lines += _history_summary()
    lines += METHOD + _per_function_table(results, equivalent)
    lines += ["## Surviving mutants", "",
              "Every mutant no case killed: **equivalent** (no client can tell it from the "
              "reference; the reason says why), a **conformant variant** (a client can tell "
              "it apart, but the contract allows both: an id format, an error's wording, a "
              "tie-break) or **not killed yet** (a case is missing).",
              ""]
    for r in survivors:
        verdict = (f"conformant variant: {equivalent[r.key]}" if r.key in conformant
                   else f"equivalent: {equivalent[r.key]}" if r.key in equivalent
                   else f"**not killed yet** ({r.status})")
        lines += [f"### `{r.name.rpartition('.')[2]}` ({r.path})", "", verdict, "",
                  "```diff", *r.diff.splitlines()[2:], "```", ""]
    if stale:
        lines += ["## Stale equivalence judgements", "",
                  "No mutant of this run matches these entries (the code changed):", ""]
        lines += [f"- `{key.splitlines()[0]}`: {' / '.join(key.splitlines()[1:])}"
                  for key in stale]
    REPORT.write_text("\n".join(lines).rstrip() + "\n")
    print(f"score {score:.1f} % ({detected}/{scored}; strict {strict:.1f} %); "
          f"{len(survivors)} survivors, {len(judged_equivalent)} equivalent -> {REPORT}")
    return 0


HISTORY_BEFORE = ROOT / "fixtures" / "history-mutants.json"
HISTORY_AFTER = ROOT / "fixtures" / "history-mutants-after.json"


def _history_summary() -> list[str]:
    """The unseen-bug check beside the score: bug classes from vLLM's own history as
    mutants, caught before and after their cases (docs/mutation-history.md has the detail)."""
    if not (HISTORY_BEFORE.exists() and HISTORY_AFTER.exists()):
        return []
    before = json.loads(HISTORY_BEFORE.read_text())["mutants"]
    after = json.loads(HISTORY_AFTER.read_text())["mutants"]
    names = [n for n in before if n in after]

    def count(record: dict[str, Any], cls: str) -> int:
        return sum(1 for n in names if record[n]["class"] == cls)

    commits = sorted({after[n]["commit"] for n in names})
    rows = [(label, count(before, cls), count(after, cls))
            for label, cls in (("caught by a MUST case", "MUST"),
                               ("caught only at SHOULD", "SHOULD only"),
                               ("fired, not caught", "not caught"),
                               ("never fired", "not fired"))]
    must = count(after, "MUST")
    return ["## Bug classes from vLLM's history", "",
            f"The score measures the suite against mutants of our own code. The unseen-bug "
            f"check: {len(names)} bug classes taken from vLLM's issues and pull requests, "
            "each written as a mutant before the cases that catch it "
            "(docs/mutation-history.md; fixtures/history-mutants.json before, "
            f"fixtures/history-mutants-after.json after, commit {', '.join(commits)}): "
            f"**{must} of {len(names)} caught by a MUST case after "
            f"({100.0 * must / len(names):.1f} %)**, {rows[0][1]} before.", "",
            "| | before | after |", "|---|---|---|",
            *(f"| {label} | {b} | {a} |" for label, b, a in rows), ""]


METHOD = [
    "## How it runs", "",
    "- mutmut copies the project into `mutants/` with every mutant compiled in behind a "
    "trampoline, runs the suite once to learn which cases call which function, then runs "
    "for each mutant only those cases, with `-x` (stop at the first kill), in children "
    "forked from the warm process (no re-import per mutant).",
    "- A mutant is killed when a case grades it FAIL, ERROR, TIMEOUT or NON-STRICT, as in "
    "the hand-written kill matrix: `-p harness.mutation.strict` turns the item of a "
    "NON-STRICT verdict (a SHOULD case that caught it) from skipped into failed.",
    "- Timing windows keep their default scale: a lower `COREWIRE_TIMESCALE` would be "
    "faster but can change verdicts. The cases wait on sockets and timers, so 4 children "
    "on 2 CPUs pay. A mutant still running after 2 x 4 x (its cases' clean duration "
    "+ 5 s) is stopped and counted as detected (a hang).",
    "- \"no tests\": no case calls the function, so the mutant cannot be killed. mutmut "
    "does not mutate decorated functions (properties) or class-level dataclass fields.",
    "",
]


def _per_function_table(results: list[MutantResult], equivalent: dict[str, str]
                        ) -> list[str]:
    rows: dict[str, Counter[str]] = {}
    for r in results:
        status = "equivalent" if r.key in equivalent and r.status != "killed" else r.status
        rows.setdefault(f"{Path(r.path).stem}.{r.function}", Counter())[status] += 1
    lines = ["## Per function", "", "| function | mutants | killed | equivalent | not killed |",
             "|---|---|---|---|---|"]
    for fn, c in sorted(rows.items()):
        total = sum(c.values())
        killed = c["killed"] + c["timeout"]
        lines.append(f"| {fn} | {total} | {killed} | {c['equivalent']} | "
                     f"{total - killed - c['equivalent']} |")
    return lines + [""]


def cmd_sample() -> int:
    """Pick SAMPLE_SIZE killed one-line mutants of core.py (one per function, spread over
    the functions), find the case that kills each, check it alone kills, record them."""
    stats: dict[str, Any] = json.loads((ROOT / "mutants" / "mutmut-stats.json").read_text())
    durations: dict[str, float] = stats["duration_by_test"]
    core_lines = (ROOT / CORE_PATH).read_text().splitlines()
    by_function: dict[str, list[MutantResult]] = {}
    for r in load_results():
        if r.path != CORE_PATH or r.status != "killed" or len(r.removed) != 1 \
                or len(r.added) != 1:
            continue
        try:
            body = [core_lines[i].strip() for i in function_lines(core_lines, r.function)]
        except SampleError:  # the function moved out of core.py (or away) since the run
            continue
        if body.count(r.removed[0]) == 1:  # a patch that applies without ambiguity
            by_function.setdefault(r.function, []).append(r)
    functions = sorted(by_function)
    step = max(1, len(functions) / SAMPLE_SIZE)
    chosen = sorted({functions[int(i * step)] for i in range(min(SAMPLE_SIZE, len(functions)))})
    picked: list[SampleMutant] = []
    for fn in chosen:
        mutant = by_function[fn][len(by_function[fn]) // 2]
        mangled = mutant.name.rpartition("__mutmut_")[0]
        tests = sorted(stats["tests_by_mangled_function_name"].get(mangled, []),
                       key=lambda t: (durations.get(t, 0.0), t))
        picked.append(SampleMutant(mutant.name.rpartition(".")[2], fn, mutant.removed[0],
                                   mutant.added[0], tests))
    found = run_sample(ROOT, picked, find_killer=True)
    killers = {name: v.killer for name, v in found.items() if v.killed and v.killer}
    narrowed = [SampleMutant(s.name, s.function, s.old, s.new, [killers[s.name]])
                for s in picked if s.name in killers]
    confirmed = run_sample(ROOT, narrowed)
    kept = [s for s in narrowed if confirmed[s.name].killed]
    kept_names = {s.name for s in kept}
    for s in picked:
        if s.name not in kept_names:
            detail = confirmed[s.name].detail if s.name in confirmed else found[s.name].detail
            print(f"sample: {s.name} left out: {detail}", file=sys.stderr)
    save_sample(ROOT, kept)
    print(f"sample: {len(kept)} mutants recorded in fixtures/mutation/sample.json")
    return 0 if len(kept) >= 10 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "recheck", "recheck-new", "report", "sample",
                                            "watchdog", "audit"])
    parser.add_argument("--children", type=int, default=4,
                        help="mutmut children (the cases wait on sockets and timers)")
    parser.add_argument("--unchecked", action="store_true",
                        help="recheck-new: the mutants never run (functions changed since "
                             "the full run), against every case reaching them")
    args = parser.parse_args()
    if args.command == "run":
        return cmd_run(args.children)
    if args.command == "recheck":
        return cmd_recheck(args.children)
    if args.command == "recheck-new":
        return cmd_recheck_new(args.children, args.unchecked)
    if args.command == "audit":  # the kill audit alone, for the last run (recorded)
        info = json.loads(RUN_INFO.read_text())
        info["audit"] = audit_kills()
        RUN_INFO.write_text(json.dumps(info))
        return 3 if info["audit"]["lost"] else cmd_report()
    if args.command == "watchdog":  # for a run started without this script's guard
        stopped = watchdog(threading.Event())
        print(f"watchdog: {len(stopped)} children stopped")
        return 0
    return cmd_report() if args.command == "report" else cmd_sample()


if __name__ == "__main__":
    sys.exit(main())
