"""Bad input is one clear usage error before any case runs; a harness fault in one case is
that case's ERROR, never a lost row (issue: no verdict lost, no process leaked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cases.context import transcript_file_name
from harness.frontends.table import check_spec

ROOT = Path(__file__).resolve().parent.parent


def run_pytest(tmp: Path, *args: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-p",
            "no:cacheprovider", "--report-dir", str(tmp), *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args, says", [
    (["--frontend", "nosuch"], "unknown frontend 'nosuch'"),
    (["--frontend", "mutant:nosuch"], "unknown mutant 'nosuch'"),
    (["--frontend", "subprocess:"], "names nothing"),
    (["--frontend", "kv:nosuch"], "unknown KV worker 'nosuch'"),
    (["--frontend", "ec:mutant:nosuch"], "unknown EC scheduler mutant 'nosuch'"),
    (["--frontend", "vllm-rs@0.21.0"], "vllm 0.21.0 ships no Rust frontend"),
    (["--frontend", "vllm-rs@0.99.0"], "no protocol profile for vllm 0.99.0"),
    (["--timescale", "-1"], "--timescale must be a positive factor"),
    (["--timescale", "0"], "--timescale must be a positive factor"),
    (["--baseline", "no/such/baseline.json"], "no such file"),
    (["--profile", "vllm-0.9.9"], "unknown protocol profile 'vllm-0.9.9'"),
])
def test_usage_errors_exit_4_with_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    proc = run_pytest(tmp_path, "-k", "abort.drop.single", *args)
    assert proc.returncode == 4, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert says in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "results.json").exists()  # nothing ran


def test_check_spec_accepts_every_documented_form() -> None:
    for spec in ("reference", "reference-subprocess", "vllm-rs", "vllm-rs@0.22.1", "vllm-py",
                 "subprocess:./my-driver --verbose", "mutant:duplicate_abort", "kv:reference",
                 "kv:vllm-nixl", "kv:mutant:skips_neighbours", "ec:vllm",
                 "ec:mutant:never_retries"):
        check_spec(spec)


@pytest.mark.parametrize("resolve, spec, says", [
    ("core", "mutant:nosuch", "unknown mutant 'nosuch'"),
    ("core", "mutant:", "core spec 'mutant:' names nothing after 'mutant:'"),
    ("core", "nomodule", "expected reference, mutant:NAME or module:Attr"),
    ("core", "mutant:legacy_wakeup_sent", "that mutant's bug is in the I/O layer"),
    ("kv", "mutant:nosuch", "unknown KV worker mutant 'nosuch'"),
    ("kv", "vllm", "unknown KV worker 'vllm': use reference, vllm-nixl or mutant:NAME"),
    ("ec", "vllm-nixl", "unknown EC scheduler 'vllm-nixl': use reference, vllm or mutant:NAME"),
])
def test_every_spec_family_is_parsed_by_the_registry(resolve: str, spec: str, says: str
                                                     ) -> None:
    """Stateful cores and component units go through `registry.parse_spec` like frontends:
    the same forms, the same errors."""
    from harness.components import ec_scheduler_factory, kv_worker_factory
    from harness.stateful import resolve_core

    chosen = {"core": resolve_core, "kv": kv_worker_factory, "ec": ec_scheduler_factory}
    with pytest.raises(ValueError) as info:
        chosen[resolve](spec)
    assert says in str(info.value)


def test_component_units_resolve_through_the_registry() -> None:
    from harness.components import (
        ec_scheduler_factory,
        kv_worker_factory,
        reference_factory,
    )
    from harness.components.ec_mutants import MUTANTS as EC_MUTANTS
    from harness.components.ec_reference import reference_ec_factory
    from harness.components.kv_mutants import MUTANTS as KV_MUTANTS
    from harness.frontends.reference.core import ReferenceFrontendCore
    from harness.mutation.registry import mutants
    from harness.stateful import resolve_core

    assert kv_worker_factory("reference") is reference_factory
    assert kv_worker_factory("mutant:skips_neighbours") is KV_MUTANTS["skips_neighbours"]
    assert ec_scheduler_factory("reference") is reference_ec_factory
    assert ec_scheduler_factory("mutant:never_retries") is EC_MUTANTS["never_retries"]
    assert resolve_core("") is resolve_core("reference") is ReferenceFrontendCore
    assert resolve_core("mutant:duplicate_abort") is mutants()["duplicate_abort"].core
    assert resolve_core("harness.frontends.reference.core:ReferenceFrontendCore"
                        ) is ReferenceFrontendCore


def test_every_component_unit_location_resolves() -> None:
    """The slots name their units as "module:attribute" (imported on use): each must exist.
    Importing the adapter modules does not import vLLM."""
    from harness.components import EC_SCHEDULERS, KV_WORKERS
    from harness.components.units import _load

    for slot in (KV_WORKERS, EC_SCHEDULERS):
        for where in [*slot.units.values(), slot.mutants, *slot.preloads.values()]:
            assert callable(_load(where)) or isinstance(_load(where), dict), where


def test_transcript_file_names_survive_any_frontend_spec() -> None:
    name = transcript_file_name("abort.drop.single", "subprocess:./.venv/bin/python -m x")
    assert "/" not in name and " " not in name
    assert name.startswith("abort.drop.single[") and name.endswith("].json")


def test_slash_in_subprocess_command_keeps_every_verdict(tmp_path: Path) -> None:
    """The README's own `subprocess:./my-driver` form: a crashing driver's ERROR verdicts
    reach results.json with their transcripts (they used to vanish: FileNotFoundError)."""
    python = os.path.relpath(sys.executable, ROOT)
    if not python.startswith("."):
        python = "./" + python
    frontend = f"subprocess:{python} -m harness.frontends.subprocess.program"
    # A slice of streaming cases (every one calls generate, so every one meets the crash):
    # the whole area grew past 150 cases, each paying a driver start for the same check.
    proc = run_pytest(tmp_path, "-k", "streaming.finish. or streaming.text.detokenized",
                      "--frontend", frontend,
                      env={"COREWIRE_DRIVER_FAULT": "crash_on:generate"})
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "INTERNALERROR" not in proc.stdout + proc.stderr
    records = json.loads((tmp_path / "results.json").read_text())["results"]
    collected = [line for line in proc.stdout.splitlines() if "streaming." in line]
    # Named by the program's init reply (harness/frontends/naming.py), not by the path.
    assert records and all(r["frontend"] == "reference-subprocess" for r in records)
    graded = {r["verdict"] for r in records}
    assert graded <= {"ERROR", "PASS", "UNSUPPORTED", "NON-STRICT", "INFO", "FAIL"}
    assert "ERROR" in graded or "FAIL" in graded, collected[:5]
    for r in records:
        if r["verdict"] != "PASS" and r["evidence"]["transcript_file"]:
            assert Path(r["evidence"]["transcript_file"]).exists()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.run.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("content", ["not json at all", '{"results": [{"id": 1}]}', "[]"])
def test_diff_of_a_malformed_file_is_one_line(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    proc = run_cli("diff", str(bad), str(bad))
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert proc.stderr.startswith("corewire diff: cannot read its input")
    assert "Traceback" not in proc.stderr


def test_diff_of_a_missing_file_is_one_line(tmp_path: Path) -> None:
    proc = run_cli("diff", str(tmp_path / "nope.json"), str(tmp_path / "nope.json"))
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr


def test_unwritable_report_dir_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = run_cli("run", "--report-dir", str(blocker / "reports"), "-k", "abort.drop.single")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert proc.stderr.startswith("corewire run: --report-dir") and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args", [["run", "--bogus"], ["run", "--timescale", "fast"],
                                  ["nosuchcommand"], []])
def test_bad_arguments_are_usage_errors_not_interruptions(args: list[str]) -> None:
    """argparse's own exit code 2 is `interrupted` in corewire (docs/cli.md): 4 instead."""
    proc = run_cli(*args)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "error:" in proc.stderr and "Traceback" not in proc.stderr


def test_pytest_k_abort_at_the_root_runs_the_abort_cases(tmp_path: Path) -> None:
    """The mission's command: plain `pytest -k abort` in a checkout runs conformance cases
    (the reference frontend by default) and prints their verdicts, not corewire's self-tests."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-k", "abort.drop.single", "--report-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "corewire verdicts" in proc.stdout and "PASS=1 " in proc.stdout, proc.stdout
    rows = json.loads((tmp_path / "results.json").read_text())["results"]
    assert [(r["id"], r["frontend"]) for r in rows] == [("abort.drop.single", "reference")]
