"""Which items a conformance session runs: frontends, component cases and `-k`.

* `--frontend kv:NAME` / `ec:NAME` name a component under test, not a frontend: wire cases
  never run against them, and component cases run only when components are asked for
  (such a spec, `-m` naming `components`, or a path into `conformance/components`).
* `-k` selects cases by their own names (case id, function, module, area and level
  markers), never because the frontend in `[...]` contains the word: `-k abort` with
  `--frontend mutant:duplicate_abort` selects the abort cases, not every case. A `-k` word
  with `[` in it is matched against the whole test id, frontend included.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from _pytest.mark import KeywordMatcher
from _pytest.mark.expression import Expression

from harness.frontends.naming import spec_of
from harness.frontends.registry import COMPONENT_KINDS, FrontendSpec, parse_spec

COMPONENTS_DIR = Path(__file__).resolve().parent.parent / "conformance" / "components"


def _specs(config: pytest.Config) -> list[FrontendSpec]:
    """The `--frontend` values' specs (`NAME=` removed), parsed (the plugin refused bad
    ones before this runs)."""
    return [parse_spec(spec_of(s)) for s in config.getoption("frontend")]


def wire_frontends(config: pytest.Config) -> list[str]:
    """The names of the frontends wire cases run against (`reference` when none is
    named): the run's names (harness/frontends/naming.py), not the specs."""
    from harness.session import session_of

    named = session_of(config).frontends
    wire = [f.name for f in named if not parse_spec(f.spec).is_component]
    return wire if wire or named else ["reference"]


def frontend_names(config: pytest.Config) -> list[str]:
    """Every frontend of the run by name (component specs by their text), sorted."""
    from harness.session import session_of

    return sorted(f.name for f in session_of(config).frontends) or ["reference"]


def component_labels(config: pytest.Config, case_id: str, default: str) -> list[str]:
    """The `[...]` labels a component case runs under: none unless components are asked
    for; the named ones of its kind (`kv:` or `ec:`), else its default label."""
    kind = parse_spec(default).kind
    named = [s for s in _specs(config) if s.is_component]
    if named:  # `configure_components` made the named component the default
        return [default] if any(s.kind == kind for s in named) else []
    return [default] if _components_asked(config) else []


def configure_components(config: pytest.Config) -> None:
    """`--frontend kv:NAME` / `ec:NAME` select the component implementation (the same as
    `$COREWIRE_KV_WORKER` / `$COREWIRE_EC_SCHEDULER`); one of each kind per run."""
    from harness.components import component_slot

    specs = _specs(config)
    for kind in COMPONENT_KINDS:
        names = {s.argument for s in specs if s.kind == kind}
        if len(names) > 1:
            raise pytest.UsageError(f"one {kind}: component per run, got {sorted(names)}")
        if names:
            os.environ[component_slot(kind).env] = names.pop()


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
