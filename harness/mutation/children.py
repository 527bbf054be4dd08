"""pytest plugin for mutmut's children: each run writes its reports into a directory of its
own (loaded by [tool.mutmut] pytest_add_cli_args in pyproject.toml, `-p
harness.mutation.children`).

mutmut runs up to --max-children pytest sessions at once, all with the pyproject's one
--report-dir; one run owns a report dir (harness/results/dirlock.py), so every concurrent
child was refused (exit 4) and counted as a kill, on any mutant. Runs that read their own
reports afterwards (harness/mutation/sample.py) do not load this plugin.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """A subdirectory of --report-dir named by this run's pid, removed when it ends
    (nothing reads a mutmut child's reports: mutmut reads its exit code)."""
    base = config.getoption("report_dir", None)
    if base:
        config.option.report_dir = str(Path(base) / f"run-{os.getpid()}")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    own = config.getoption("report_dir", None)
    if own and Path(own).name == f"run-{os.getpid()}":
        shutil.rmtree(own, ignore_errors=True)
