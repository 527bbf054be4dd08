"""One conformance run's state, held by its pytest config (never by a module global).

The plugin builds a `RunState` in pytest_configure from the user's options, keeps it
in `config.stash` and registers it as a plugin of that config, so two sessions in one
process (pytester's in-process runs, a session started inside another) never see each
other's results, failing items or time scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from harness.frontends.naming import NamedFrontend
from harness.frontends.run_config import RunConfig
from harness.results.baseline import Baseline
from harness.results.records import CaseResult
from harness.results.schema import decode_result
from harness.results.startup import Stop
from harness.run.failfast import StartFailures

PROPERTY = "corewire_result"  # the call report's attribute: a case's encoded result


@dataclass(eq=False)  # a pluggy plugin: hashed by identity
class RunState:
    """What one run knows: its options (read once) and what its cases produced."""

    config: RunConfig  # the run's settings (for its first frontend: `for_frontend`)
    baseline: Baseline | None
    worker: bool  # an xdist worker: it ships results to the controller, writes no report
    results: list[CaseResult] = field(default_factory=list)
    failing: dict[tuple[str, str], str] = field(default_factory=dict)  # -> why it fails
    partial: str | None = None  # why the run stopped early, once it has ended
    # Errors outside any case (a leak found at session end, a fixture fault): nodeid, phase
    # and message, for the one line each the terminal summary gives them.
    outside: list[str] = field(default_factory=list)
    # Report files that could not be written (disk full, size limit): path, reason, errno
    # (harness/results/failsafe.py); the run then exits REPORTS_NOT_WRITTEN.
    not_written: list[str] = field(default_factory=list)
    # The run's frontends by name (harness/frontends/naming.py; empty: `reference`).
    frontends: list[NamedFrontend] = field(default_factory=list)
    failfast: StartFailures | None = None  # the shared start-failure record
    stops: list[Stop] = field(default_factory=list)  # frontends stopped (at session end)
    verbose: bool = False  # -v: the summary lists every non-PASS item

    def spec_of(self, frontend: str) -> str:
        """The spec that runs under the name `frontend` (a component label is its own)."""
        return next((f.spec for f in self.frontends if f.name == frontend), frontend)

    def failing_by_name(self) -> dict[str, str]:
        """`case[frontend]` -> why it fails the run (the reports' key)."""
        return {f"{case}[{frontend}]": why
                for (case, frontend), why in sorted(self.failing.items())}

    def clear(self) -> None:
        self.results.clear()
        self.failing.clear()
        self.outside.clear()
        self.not_written.clear()
        self.partial = None

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Runs on the xdist controller too: collect every case result exactly once (the
        one decode between a case and the reports).

        Runs after JUnit has taken the captured evidence (system-out); the terminal then
        drops it, so a failing case is one line there, not pages of transcript."""
        value = getattr(report, PROPERTY, None)
        if report.when != "call" and report.failed:
            self.outside.append(f"{report.nodeid} ({report.when}): {_crash_message(report)}")
        if report.when != "call" or value is None:
            return
        result = decode_result(value)
        self.results.append(result)
        if report.failed:  # the run fails on it: say why (stale / expired baseline too)
            self.failing[(result.case_id, result.frontend)] = str(report.longrepr)
        if not self.worker:  # a worker ships the evidence to the controller
            report.sections = [s for s in report.sections if not s[0].startswith("Captured")]


def _crash_message(report: pytest.TestReport) -> str:
    """The exception line of a failed report (pytest's own summary cuts it to the width)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None) or str(report.longrepr).strip()
    return " ".join(message.split())


RUN_STATE = pytest.StashKey[RunState]()


def run_state_of(config: pytest.Config) -> RunState:
    """The run state of `config` (built in the plugin's pytest_configure)."""
    return config.stash[RUN_STATE]
