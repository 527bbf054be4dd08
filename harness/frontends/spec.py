"""The one parser of spec strings: a whole name, or a prefix followed by an argument
(`mutant:NAME`, `subprocess:CMD`, `vllm-rs@X`). Frontends (harness/frontends/table.py),
component units (harness/components/units.py) and the stateful fuzzer's cores each bring
their own grammar; the parse is the same."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

MUTANT_PREFIX = "mutant:"
COMPONENT_KINDS = ("kv", "ec")  # a component unit under test, not a frontend

T = TypeVar("T")


@dataclass(frozen=True)
class SpecGrammar:
    """What one family of spec strings may be: whole names, and prefixes followed by an
    argument (`mutant:NAME`). Frontends, component units and stateful cores each have one."""

    what: str  # how an error names the spec: "frontend", "KV worker"
    known: tuple[str, ...]
    prefixes: tuple[str, ...] = (MUTANT_PREFIX,)
    usage: str = ""  # the forms, for the error line
    other: str | None = None  # the kind of any other text (None: any other text is an error)


@dataclass(frozen=True)
class FrontendSpec:
    """A spec (a `--frontend` value by default), parsed once: its kind and what follows the
    prefix."""

    text: str
    kind: str  # a known name, or a prefix without its separator: "subprocess", "mutant", ...
    argument: str = ""  # the command, mutant name, release or component unit

    @property
    def is_component(self) -> bool:
        """`kv:NAME` / `ec:NAME`: a component unit for the component cases, not a frontend."""
        return self.kind in COMPONENT_KINDS


def parse_spec(text: str, grammar: SpecGrammar) -> FrontendSpec:
    """Parse `text` by `grammar`. ValueError carries the line a user needs."""
    if text in grammar.known:
        return FrontendSpec(text, text)
    prefix = next((p for p in grammar.prefixes if text.startswith(p)), None)
    if prefix is None:
        if grammar.other is not None:
            return FrontendSpec(text, grammar.other, text)
        raise ValueError(f"unknown {grammar.what} {text!r}: use {grammar.usage}")
    argument = text[len(prefix):].strip()
    if not argument:
        raise ValueError(f"{grammar.what} {text!r} names nothing after {prefix!r}")
    return FrontendSpec(text, prefix.rstrip(":@"), argument)


def lookup(table: Mapping[str, T], name: str, what: str) -> T:
    """`table[name]`, or ValueError naming what is known (mutant tables, mostly)."""
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(table))}"
                         ) from None
