"""pytest plugin: ``--replay FILE`` turns stateful replay files into test items.

A failing stateful run (harness/stateful/) leaves a JSON replay file under
``reports/stateful/``; this plugin re-runs such files as ordinary pytest items, so a fix can
be checked with ``pytest --replay reports/stateful/<file>.json``:

* ``--replay FILE`` (repeatable) adds one item per file, ``replay::<file>``, which calls
  `harness.stateful.replay(FILE)`; it fails with the invariant the steps break. For a file
  outside the repository write ``--replay=FILE``: pytest takes a bare path argument into
  its rootdir search and would otherwise miss pyproject.toml.
* ``--replay-core SPEC`` replays against another core: ``reference`` (default),
  ``mutant:NAME`` (harness/mutation/registry.py), ``recorded`` (the core named in the
  file) or ``package.module:Attr``.
* Without path arguments, ``--replay`` runs only the replay items (the configured
  testpaths are deselected); with paths, both run.

``pytest --hypothesis-profile=nightly`` makes this plugin register the hypothesis profile
"nightly" (5000 examples) at configure time, before hypothesis's own plugin reads the
option (entry point ``corewire_replay = "harness.run.replay_plugin"``, or ``-p
harness.run.replay_plugin``); a "nightly" profile the session registered itself is left alone.
To keep a replay as a regression case: ``python -m harness.stateful promote FILE``.

hypothesis is a development dependency: this plugin is loaded into every pytest session
of a virtualenv where corewire is installed, so it imports `harness.stateful` (hence
hypothesis) only when ``--replay`` or that profile is asked for.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

NIGHTLY = "nightly"  # harness.stateful.settings.NIGHTLY, named here without importing it


def _stateful() -> ModuleType:
    """harness.stateful, imported when a replay runs (it needs hypothesis)."""
    from harness import stateful

    return stateful


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("corewire-replay", "corewire stateful replays")
    group.addoption("--replay", action="append", default=[], metavar="FILE",
                    help="re-run a stateful replay file as a test item (repeatable)")
    group.addoption("--replay-core", default="reference", metavar="SPEC",
                    help="core to replay against: reference (default), mutant:NAME, "
                         "recorded (the core named in the file) or module:Attr")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Register the "nightly" profile before hypothesis's plugin loads the one asked for
    (the option exists only where hypothesis's plugin is loaded)."""
    if config.getoption("hypothesis_profile", None) != NIGHTLY:
        return
    import hypothesis

    try:
        hypothesis.settings.get_profile(NIGHTLY)
    except hypothesis.errors.InvalidArgument:
        from harness.stateful.settings import register_profiles

        register_profiles()


class ReplayItem(pytest.Item):
    """One replay file, re-run through `harness.stateful.replay`."""

    def __init__(self, *, replay_path: Path, core_spec: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.replay_path = replay_path
        self.core_spec = core_spec

    def runtest(self) -> None:
        stateful = _stateful()
        spec = self.core_spec
        if spec == "recorded":
            spec = str(stateful.load_replay(self.replay_path).get("core") or "reference")
        stateful.replay(self.replay_path, stateful.resolve_core(spec))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str:
        exc = excinfo.value
        stateful = _stateful()
        if not isinstance(exc, stateful.InvariantViolation):
            return str(super().repr_failure(excinfo, style))
        lines = [f"replay {self.replay_path} against {self.core_spec}: {exc}",
                 f"rule: {stateful.INVARIANTS.get(exc.invariant, '?')}",
                 f"failed at step: {exc.failed_step}"]
        try:
            data = stateful.load_replay(self.replay_path)
        except (OSError, ValueError):
            return "\n".join(lines)
        if data.get("invariant"):
            lines.append(f"recorded failure: {data['invariant']}: {data.get('message')}")
        lines.append("steps:")
        lines += [f"  {i}: {step['rule']}({step['args']})" for i, step in
                  enumerate(data["steps"])]
        return "\n".join(lines)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.replay_path, None, f"replay {self.replay_path.name}"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    files: list[str] = config.getoption("replay")
    if not files:
        return
    replay_items: list[pytest.Item] = []
    for name in files:
        path = Path(name)
        if not path.is_file():
            raise pytest.UsageError(f"--replay {name}: no such file")
        replay_items.append(ReplayItem.from_parent(
            session, name=f"replay[{path.name}]", nodeid=f"replay::{name}",
            replay_path=path.resolve(), core_spec=config.getoption("replay_core")))
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        # `pytest --replay FILE`: the replay is the whole point; skip the testpaths.
        config.hook.pytest_deselected(items=list(items))
        items.clear()
    items.extend(replay_items)
