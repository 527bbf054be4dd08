"""Which implementation of a component runs: the unit a spec names ("reference", vLLM's own
through its adapter, or "mutant:NAME"), chosen by `--frontend kv:NAME` / `ec:NAME` or the
component's environment variable -- read once into the run's RunConfig
(`component_unit(kind)`), which every caller hands in.

Why one class: the KV worker and the EC scheduler are chosen, checked, labelled and preloaded
the same way; only their units, mutant tables and variables differ. Specs are parsed by
`harness.frontends.spec.parse_spec` (the one parser of spec strings), and every unit is
imported lazily: the vLLM adapters cost tens of seconds.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from harness.frontends.spec import SpecGrammar, lookup, parse_spec

F = TypeVar("F")


@dataclass(frozen=True)
class ComponentSlot(Generic[F]):
    """One pluggable component: its units (name -> factory loader) and its mutants."""

    kind: str  # the `--frontend` prefix without its colon: "kv", "ec"
    title: str  # how errors name it: "KV worker"
    env: str  # the variable that names the unit under test
    # Where things live, as "module:attribute", imported only when used (the vLLM adapters
    # import vLLM): unit name -> its factory, the mutant table, unit name -> preload hook.
    units: Mapping[str, str]
    mutants: str
    preloads: Mapping[str, str] = field(default_factory=dict)

    @property
    def grammar(self) -> SpecGrammar:
        return SpecGrammar(self.title, tuple(self.units),
                           usage=f"{', '.join(self.units)} or mutant:NAME (--frontend "
                                 f"{self.kind}:NAME or ${self.env})")

    def label(self, unit: str) -> str:
        """The `[...]` part of a component case's test id."""
        return f"{self.kind}:{unit}"

    def factory(self, name: str) -> F:
        """The factory of unit `name`."""
        spec = parse_spec(name, self.grammar)
        if spec.kind == "mutant":
            return lookup(self._mutant_table(), spec.argument, f"{self.title} mutant")
        return cast(F, _load(self.units[spec.kind]))

    def check(self, name: str) -> None:
        """ValueError unless `name` is a unit (a mutant's name is checked; nothing heavy is
        imported)."""
        spec = parse_spec(name, self.grammar)
        if spec.kind == "mutant":
            lookup(self._mutant_table(), spec.argument, f"{self.title} mutant")

    def preload(self, name: str) -> None:
        """Pay the unit's slow imports up front (at collection), so no case spends its time
        bound on them."""
        hook = self.preloads.get(name)
        if hook is not None:
            cast(Callable[[], None], _load(hook))()

    def _mutant_table(self) -> Mapping[str, F]:
        return cast(Mapping[str, F], _load(self.mutants))


def _load(where: str) -> Any:
    """The object at "module:attribute" (the module imported now)."""
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute)


__all__ = ["ComponentSlot"]
