"""A run's options, read and checked once at configure: the usage errors (exit 4), the
run's settings (RunConfig), its frontends by name, its report dir's lock and its shared
start-failure record; what the plugin's pytest_configure assembles its run state from."""

from __future__ import annotations

import os

import pytest

from harness.frontends import naming
from harness.frontends.run_config import RunConfig, RunConfigError
from harness.frontends.table import parse_frontend
from harness.protocol.wire.profiles import ProtocolProfile
from harness.results.dirlock import ReportDirLock
from harness.run import failfast, selection, shard
from harness.run.state import RunState

REPORT_DIR_LOCK = pytest.StashKey[ReportDirLock]()


def writes_report_set(config: pytest.Config) -> bool:
    """A conformance session, or one given --report-dir: it owns a report set (a session
    of corewire's own tests, which runs conformance sessions of its own, does not)."""
    if config.getoption("collectonly"):
        return False  # lists cases, runs none: the dir's reports are left as they are
    given = any(a == "--report-dir" or a.startswith("--report-dir=")
                for a in config.invocation_params.args)
    return given or selection.conformance_only(config)


def lock_report_dir(config: pytest.Config) -> None:
    """Held by the controlling process for the whole run (harness/results/dirlock.py); a
    run already holding the dir makes this one a usage error naming it."""
    from harness.results.dirlock import ReportDirBusy, lock_report_dir

    report_dir = config.getoption("report_dir")
    try:
        config.stash[REPORT_DIR_LOCK] = lock_report_dir(report_dir)
    except ReportDirBusy as exc:
        raise pytest.UsageError(str(exc)) from None
    except OSError as exc:
        raise pytest.UsageError(f"--report-dir {report_dir}: {exc}") from None


def check_usage(config: pytest.Config) -> RunConfig:
    """Bad options are one clear usage error (exit 4) before any case runs; returns the
    run's settings (RunConfig: the one place --profile, --timescale and the component
    units are read and checked)."""
    specs = []
    for value in config.getoption("frontend"):
        name, spec = naming.split_name(value)
        specs.append(spec)
        try:
            if name is not None and parse_frontend(spec).is_component:
                raise ValueError(f"--frontend {value!r}: kv:/ec: units name themselves; "
                                 f"give {spec!r} without a name")
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    try:
        run_config = RunConfig.from_options(specs, config.getoption("profile"),
                                            config.getoption("timescale"), os.environ)
    except RunConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    shard.configured_shard(config)
    path = config.getoption("baseline")
    if path and not os.path.exists(path) and not config.getoption("update_baseline"):
        raise pytest.UsageError(f"--baseline {path}: no such file")
    return run_config


WORKER_FRONTENDS = "corewire_frontends"  # the named frontends, in a worker's workerinput


def named_frontends(config: pytest.Config, run_config: RunConfig
                     ) -> list[naming.NamedFrontend]:
    """The run's frontends by name: resolved once on the controller (a plain subprocess
    spec's program is asked its `init` name), handed to each xdist worker as they are, so
    every process collects the same items."""
    given = getattr(config, "workerinput", {}).get(WORKER_FRONTENDS)
    if given is not None:
        return [naming.NamedFrontend(name, spec) for name, spec in given]
    return naming.resolve(config.getoption("frontend"),
                          lambda spec: naming.probe_name(run_config.for_frontend(spec)))


def start_failures(config: pytest.Config) -> failfast.StartFailures:
    """The run's shared record of start failures: the controller's dir, in every worker."""
    directory = getattr(config, "workerinput", {}).get(failfast.WORKER_KEY)
    if directory is not None:
        return failfast.StartFailures(directory)
    return failfast.StartFailures.create()


def leave_junit_to_us(config: pytest.Config) -> None:
    """`--junitxml` naming the report dir's junit.xml: corewire writes that file (one
    system-out per case, verdict properties); pytest's plugin would write over it."""
    xmlpath = getattr(config.option, "xmlpath", None)
    ours = os.path.join(config.getoption("report_dir"), "junit.xml")
    if xmlpath and os.path.abspath(xmlpath) == os.path.abspath(ours):
        config.option.xmlpath = None


def terminal_is_ours(config: pytest.Config) -> None:
    """A conformance-only session: one line per non-PASS verdict (our summary) instead of
    pytest's failure pages; `--tb` / `-r` given on the command line still win."""
    if config.option.tbstyle == "auto":
        config.option.tbstyle = "no"
    if config.option.reportchars == "fE":  # pytest's default: keep errors outside cases
        config.option.reportchars = "E"  # (a leak found at session end, a fixture fault)


def filtered(config: pytest.Config) -> bool:
    return bool(config.getoption("keyword") or config.getoption("markexpr")
                or any("::" in arg for arg in config.args)
                or config.getoption("lf", False) or config.getoption("deselect", None)
                or config.getoption("shard", None))


def frontend_profiles(run: RunState) -> dict[str, ProtocolProfile]:
    """The profile each wire frontend's engines spoke (its RunConfig's engine profile, as
    every case's context used it); component units speak no wire protocol."""
    configs = [run.config.for_frontend(f.spec) for f in run.frontends]
    return {f.name: c.engine_profile for f, c in zip(run.frontends, configs, strict=True)
            if not c.parsed.is_component}
