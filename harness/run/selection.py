"""Which items a conformance session runs: frontends, component cases and `-k`.

* `--frontend kv:NAME` / `ec:NAME` name a component under test, not a frontend: wire cases
  never run against them, and component cases run only when components are asked for
  (such a spec, `-m` naming `components`, or a path into `conformance/components`).
* The plugin acts only in a session that asks for corewire (`corewire_requested`): a
  corewire option given, or a path into the cases. Any other pytest session in a
  virtualenv where corewire is installed runs as if the plugin were absent.
* A session that asks for corewire by option but names no path (`pytest --frontend X`)
  runs corewire's cases, the checked-out or installed ones (`point_at_cases`).
* `-k` selects cases by their own names (case id, function, module, area and level
  markers), never because the frontend in `[...]` contains the word: `-k abort` with
  `--frontend mutant:duplicate_abort` selects the abort cases, not every case. A `-k` word
  with `[` in it is matched against the whole test id, frontend included.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
from _pytest.mark import KeywordMatcher
from _pytest.mark.expression import Expression

from harness.frontends.naming import spec_of
from harness.frontends.run_config import RunConfig
from harness.frontends.spec import FrontendSpec
from harness.frontends.table import parse_frontend
from harness.locations import (
    MissingInstallError,
    cases_dir,
    is_installed_layout,
    require_cases_dir,
)

COMPONENTS_DIR = cases_dir() / "components"
# Each corewire option and the value it has when not given (pytest_addoption's defaults).
OPTION_DEFAULTS: dict[str, object] = {
    "frontend": [], "timescale": None, "report_dir": "reports", "baseline": None,
    "profile": None, "update_baseline": False, "shard": None}


def _options_given(config: pytest.Config) -> bool:
    return any(config.getoption(name, default) != default
               for name, default in OPTION_DEFAULTS.items())


def _arg_paths(config: pytest.Config) -> list[Path]:
    """The session's path arguments as absolute paths (node ids cut at `::`; a --pyargs
    module name found without importing it where possible)."""
    paths: list[Path] = []
    for arg in config.args:
        head = arg.split("::", 1)[0]
        path = Path(head)
        if config.option.pyargs and not path.exists():
            try:
                spec = importlib.util.find_spec(head)
            except (ImportError, ValueError):
                spec = None
            if spec is not None and spec.submodule_search_locations:
                path = Path(next(iter(spec.submodule_search_locations)))
            elif spec is not None and spec.origin:
                path = Path(spec.origin)
        paths.append(path.resolve())
    return paths


def _reaches_cases(config: pytest.Config) -> bool:
    """A path argument inside the cases (or, in a checkout, a directory holding them)."""
    cases = cases_dir().resolve()
    for path in _arg_paths(config):
        if path == cases or cases in path.parents:
            return True
        # An installed corewire's cases sit in site-packages, which pytest does not
        # collect from a directory above it (a virtualenv): only a checkout's count.
        if not is_installed_layout() and path in cases.parents:
            return True
    return False


def corewire_requested(config: pytest.Config) -> bool:
    """Whether this session is corewire's: a corewire option given (`--frontend`,
    `--report-dir`, ...) or a path into the cases. Otherwise the plugin stays out of the
    way: no markers, no signal handlers, no report dir cleared or written, no output."""
    return _options_given(config) or _reaches_cases(config)


def why_no_case(config: pytest.Config) -> str:
    """The cause of an empty corewire session, for its one summary line."""
    if not _reaches_cases(config):
        return (f"no path given reaches corewire's cases ({cases_dir()}); name none to "
                f"run them")
    return "the selection matched no case"


def point_at_cases(config: pytest.Config) -> None:
    """`pytest --frontend X` with no path on the command line (pytest would search the
    current directory or the configured testpaths) runs corewire's cases instead, so a
    port's CI needs no path into site-packages. Named paths are left alone."""
    if config.args_source is pytest.Config.ArgsSource.ARGS or not _options_given(config) \
            or _reaches_cases(config):
        return
    try:
        config.args = [str(require_cases_dir())]
    except MissingInstallError as exc:
        raise pytest.UsageError(str(exc)) from None


def _specs(config: pytest.Config) -> list[FrontendSpec]:
    """The `--frontend` values' specs (`NAME=` removed), parsed (the plugin refused bad
    ones before this runs)."""
    return [parse_frontend(spec_of(s)) for s in config.getoption("frontend")]


def wire_frontends(config: pytest.Config) -> list[str]:
    """The names of the frontends wire cases run against (`reference` when none is
    named): the run's names (harness/frontends/naming.py), not the specs."""
    from harness.run.state import run_state_of

    named = run_state_of(config).frontends
    wire = [f.name for f in named if not parse_frontend(f.spec).is_component]
    return wire if wire or named else ["reference"]


def frontend_names(config: pytest.Config) -> list[str]:
    """Every frontend of the run by name (component specs by their text), sorted."""
    from harness.run.state import run_state_of

    return sorted(f.name for f in run_state_of(config).frontends) or ["reference"]


def component_labels(config: pytest.Config, case_id: str, default: str) -> list[str]:
    """The `[...]` labels a component case runs under: none unless components are asked
    for; the named ones of its kind (`kv:` or `ec:`), else its default label."""
    kind = parse_frontend(default).kind
    named = [s for s in _specs(config) if s.is_component]
    if named:  # `configure_components` made the named component the default
        return [default] if any(s.kind == kind for s in named) else []
    return [default] if _components_asked(config) else []


def preload_components(items: list[pytest.Item], run_config: RunConfig) -> None:
    """Pay the slow imports of the component units the selected component cases will run
    (vLLM's, tens of seconds) at collection, so no case spends its time bound on them."""
    from harness.components import component_kind, component_slot

    specs = [getattr(item, "corewire_spec", None) for item in items]
    kinds = {component_kind(s.case_id) for s in specs if s is not None and s.area == "components"}
    for kind in sorted(kinds):
        # A unit that cannot load fails each of its cases with the reason (an ERROR row
        # each), as it would without the preload; the session itself goes on.
        with contextlib.suppress(Exception):
            component_slot(kind).preload(run_config.component_unit(kind))


def _components_asked(config: pytest.Config) -> bool:
    markexpr = str(config.getoption("markexpr") or "")
    if "components" in markexpr and "not components" not in markexpr:
        return True
    for arg in config.args:
        path = Path(arg.split("::", 1)[0]).resolve()
        if path == COMPONENTS_DIR or COMPONENTS_DIR in path.parents:
            return True
    return False


def _case_names(item: pytest.Item) -> set[str]:
    """What `-k` may match on a conformance item: everything pytest uses except the
    frontend part of the item name (and the plugin's own attribute names)."""
    spec = item.corewire_spec  # type: ignore[attr-defined]
    names = {spec.case_id, getattr(item, "originalname", "").split("[", 1)[0]}
    function = getattr(item, "function", None)
    if function is not None:
        names.add(function.__name__)
        names.update(k for k in function.__dict__ if not k.startswith("__corewire"))
    for node in item.listchain()[1:-1]:  # module, packages (not the session)
        names.add(node.name)
    names.update(mark.name for mark in item.iter_markers())
    return names


class _CaseMatcher:
    def __init__(self, item: pytest.Item) -> None:
        self.names = [n.lower() for n in _case_names(item)]
        self.full = item.name.lower()

    def __call__(self, subname: str, /, **kwargs: Any) -> bool:
        subname = subname.lower()
        if "[" in subname:
            return subname in self.full
        return any(subname in name for name in self.names)


def deselect_by_keyword(items: list[pytest.Item], config: pytest.Config) -> None:
    """pytest's `-k`, with conformance items matched by `_case_names`. Clears the option
    so pytest's own `-k` pass (which would match the frontend too) keeps everything;
    `restore_keyword` puts it back once collection is done."""
    expression = config.option.keyword.lstrip()
    if not expression:
        return
    config._corewire_keyword = config.option.keyword  # type: ignore[attr-defined]
    config.option.keyword = ""
    try:
        expr = Expression.compile(expression)
    except SyntaxError as exc:
        raise pytest.UsageError(f"Wrong expression passed to '-k': {exc.text}: at column "
                                f"{exc.offset}: {exc.msg}") from None
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        matcher: Any = (_CaseMatcher(item) if hasattr(item, "corewire_spec")
                        else KeywordMatcher.from_item(item))
        (keep if expr.evaluate(matcher) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def restore_keyword(config: pytest.Config) -> None:
    saved = getattr(config, "_corewire_keyword", None)
    if saved is not None:
        config.option.keyword = saved


def conformance_only(config: pytest.Config) -> bool:
    """A session whose paths are all conformance suites (terminal output is ours)."""
    root = COMPONENTS_DIR.parent
    args = [Path(a.split("::", 1)[0]).resolve() for a in config.args] or [Path(os.getcwd())]
    return all(a == root or root in a.parents for a in args)
