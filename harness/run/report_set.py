"""The run's report set at session end (results.json, junit.xml, report.html, the baseline
update) and the terminal lines about what could not be written or matched."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pytest

from harness.results.baseline import Baseline
from harness.results.schema import RunMeta
from harness.results.startup import EXIT_FRONTEND_STOPPED
from harness.run import interrupts, shard
from harness.run.options import (
    filtered,
    frontend_profiles,
)
from harness.run.state import RunState


def write_report_set(session: pytest.Session, exitstatus: int, run: RunState
                      ) -> None:
    """results.json and report.html on the controller; a file that cannot be written is
    recorded in `run.not_written` (with transcripts the cases could not write), never
    raised: the verdicts are still printed and the session still torn down."""
    config = session.config
    results = run.results
    partial = run.partial = partial_reason(exitstatus)
    run.stops = run.failfast.stops() if run.failfast is not None else []
    if run.stops and partial is None:
        session.exitstatus = EXIT_FRONTEND_STOPPED
    this_shard = shard.configured_shard(config)
    if this_shard is not None and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED \
            and getattr(config, "_corewire_counts", (0, 0))[0] > 0:
        session.exitstatus = pytest.ExitCode.OK  # the selection ran, just not here
    if not results and partial is None and this_shard is None:
        return
    from harness.results.junit import write_junit
    from harness.results.writer import write_reports

    results.sort(key=lambda r: (r.case_id, r.frontend))
    report_dir = config.getoption("report_dir")
    run_meta = RunMeta(
        shard=None if this_shard is None else [this_shard.index, this_shard.count],
        selection=shard.selection_meta(config),
        failing={f"{case}[{frontend}]": why
                 for (case, frontend), why in sorted(run.failing.items())},
        # Errors outside any case (a leak found at session end) fail the run too.
        failed_outside_cases=max(0, session.testsfailed - len(run.failing)))
    from harness.results.failsafe import TRANSCRIPT_NOT_WRITTEN, ReportsNotWritten, describe

    if run.stops:
        run_meta.stopped = list(run.stops)
    run.not_written += [note[len(TRANSCRIPT_NOT_WRITTEN):] for r in results
                        for note in r.evidence.notes if note.startswith(TRANSCRIPT_NOT_WRITTEN)]
    try:
        write_reports(results, report_dir, run.config.profile, partial, run_meta,
                      frontend_profiles(run))
    except ReportsNotWritten as exc:
        run.not_written += exc.failures
    junit_path = os.path.join(report_dir, "junit.xml")
    try:
        write_junit(results, report_dir, run.failing_by_name(), run.outside,
                    {"frontends": " ".join(sorted({r.frontend for r in results}))})
    except OSError as exc:  # whole or absent: the partial file goes
        with contextlib.suppress(OSError):
            os.remove(f"{junit_path}.partial-{os.getpid()}")
        run.not_written.append(describe(junit_path, exc))
    if config.getoption("update_baseline") and partial is None and not run.stops:
        # (a stopped frontend's NOT-RUN cases would leave its baseline without them)
        path = config.getoption("baseline")
        try:
            Baseline.from_results(results).save(path)
        except OSError as exc:
            run.not_written.append(describe(path, exc))


def partial_reason(exitstatus: int) -> str | None:
    signal_name = interrupts.interrupted_by()
    if signal_name is not None:
        return f"interrupted by {signal_name}"
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        return "interrupted"
    return None


def not_written_lines(tr: Any, failures: list[str]) -> None:
    from harness.results.failsafe import REPORTS_NOT_WRITTEN

    tr.write_line(f"REPORTS NOT WRITTEN (exit {REPORTS_NOT_WRITTEN}): {len(failures)} "
                  f"file(s) of the report set could not be written; the verdicts above "
                  f"are this run's only record of them:", red=True, bold=True)
    for failure in failures[:20]:
        tr.write_line(f"  {failure}", red=True)
    if len(failures) > 20:
        tr.write_line(f"  ... and {len(failures) - 20} more", red=True)


def unmatched_baseline_lines(config: pytest.Config, run: RunState) -> list[str]:
    """Baseline entries this run could have used but did not (not a failure): in an
    unfiltered, uninterrupted run, entries of a frontend that ran naming no case it ran
    (a renamed or removed case); in any run, entries of frontends not in the run, which is
    how a frontend renamed since (an old absolute-path spec) shows."""
    from harness.results.baseline import unmatched_entries

    if run.baseline is None or run.partial is not None:
        return []
    unmatched = unmatched_entries(run.baseline, run.results)
    lines = [] if filtered(config) else [
        f"UNMATCHED BASELINE {e.case}[{e.frontend}] ({e.verdict}): stale, no such item in "
        f"this run (not a failure); remove or rename the entry" for e in unmatched.stale]
    if unmatched.other_frontends:
        named = ", ".join(f"{name!r} ({count})"
                          for name, count in sorted(unmatched.other_frontends.items()))
        ran = ", ".join(sorted({r.frontend for r in run.results}))
        lines.append(f"baseline entries for frontends not in this run (this run: {ran}): "
                     f"{named}; a frontend renamed since keys its entries by its old name")
    return lines
