"""Grounds: the vLLM 0.33.0 source lines a rule stands on, and the level they earn.

A case's requirement is only as good as the code that implies it. Every wire case carries
`Grounds`: citations into the vLLM 0.33.0 sdist (`path:line` plus a short snippet quoted
from that line), one list per implementation (the Python frontend `vllm/`, the Rust
frontend `rust/`, and the engine side where the engine relies on the rule), and a `Basis`
that says what those citations establish. The level rule (docs/spec.md, checked by
tests/test_grounds.py) is applied from the basis alone:

- MUST: `both` (each 0.33.0 frontend holds the behaviour; citations in both), or `defect`
  (one holds it and the other's deviation is a defect: a hang, a crash, lost or corrupted
  data, an engine left in a wrong state; the note says which and why), or `only` (only one
  frontend has the feature at all, e.g. streaming-input sessions, which vllm-rs 0.33.0
  lacks; it holds the rule and an engine citation shows the engine relies on it).
- SHOULD: `differ` (the implementations deliberately differ; the note names both
  behaviours), or `recommendation` (neither holds it; corewire's advice). Never MUST.
  Also a `both` rule whose value nothing reads (a default no engine relies on): the case
  would pass on any frontend that leaves the field alone, so it earns no MUST.
- INFO: any basis.

Citations are checked mechanically against the sdist
(harness.cases.vllm_sources): the snippet must
occur on the cited line or within `WINDOW` lines of it, so a citation that drifts or never
said what we claim fails make test.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

WINDOW = 3  # lines either side of the cited line where the snippet may sit
VLLM_GROUNDS_VERSION = "0.33.0"


class Impl(str, enum.Enum):
    """Whose code a citation is from."""

    PYTHON = "python"  # vllm/ : AsyncLLM, core_client, the DP coordinator
    RUST = "rust"  # rust/ : vllm-rs, its engine-core client and server
    ENGINE = "engine"  # vllm/v1/engine/core.py and friends: the engine side relies on it


class Basis(str, enum.Enum):
    """What the citations establish, and so which level the rule may have."""

    BOTH = "both"
    DEFECT = "defect"
    ONLY = "only"
    DIFFER = "differ"
    RECOMMENDATION = "recommendation"


ALLOWED_LEVELS: dict[Basis, frozenset[str]] = {
    Basis.BOTH: frozenset({"MUST", "SHOULD", "INFO"}),
    Basis.DEFECT: frozenset({"MUST", "SHOULD", "INFO"}),
    Basis.ONLY: frozenset({"MUST", "SHOULD", "INFO"}),
    Basis.DIFFER: frozenset({"SHOULD", "INFO"}),
    Basis.RECOMMENDATION: frozenset({"SHOULD", "INFO"}),
}

_REF = re.compile(r"^(?P<path>[\w./-]+):(?P<line>\d+)$")


@dataclass(frozen=True)
class Cite:
    """One line of vLLM 0.33.0 that implies (part of) a rule."""

    impl: Impl
    path: str  # inside the sdist: vllm/v1/engine/core_client.py, rust/src/...
    line: int
    snippet: str  # quoted from the line (one line, whitespace-insensitive)

    def render(self) -> str:
        return f"{self.path}:{self.line} `{self.snippet}`"


class GroundsError(ValueError):
    """A grounds declaration that cannot be right whatever the sources say."""


def _cite(impl: Impl, ref: str, snippet: str) -> Cite:
    found = _REF.match(ref)
    if found is None:
        raise GroundsError(f"citation {ref!r} is not path:line")
    if not snippet.strip() or "\n" in snippet:
        raise GroundsError(f"{ref}: the snippet must be one non-empty line")
    return Cite(impl, found["path"], int(found["line"]), snippet.strip())


def py(ref: str, snippet: str) -> Cite:
    """A line of vLLM's Python frontend (AsyncLLM, core_client, coordinator)."""
    return _cite(Impl.PYTHON, ref, snippet)


def rs(ref: str, snippet: str) -> Cite:
    """A line of vLLM's Rust frontend (rust/src/...)."""
    return _cite(Impl.RUST, ref, snippet)


def engine(ref: str, snippet: str) -> Cite:
    """A line of the engine side (vllm/v1/engine/core.py, ...) that relies on the rule."""
    return _cite(Impl.ENGINE, ref, snippet)


@dataclass(frozen=True)
class Grounds:
    """The citations behind one rule and what they establish."""

    basis: Basis
    cites: tuple[Cite, ...]
    note: str = ""

    def __post_init__(self) -> None:
        if not self.cites:
            raise GroundsError("grounds need at least one citation")
        impls = {c.impl for c in self.cites}
        if self.basis in (Basis.BOTH, Basis.DIFFER) and not {Impl.PYTHON, Impl.RUST} <= impls:
            raise GroundsError(f"basis {self.basis.value} needs a Python and a Rust citation")
        if self.basis is not Basis.BOTH and not self.note.strip():
            raise GroundsError(f"basis {self.basis.value} needs a note saying why")
        if self.basis is Basis.ONLY and (Impl.ENGINE not in impls
                                         or not {Impl.PYTHON, Impl.RUST} & impls):
            raise GroundsError("basis only needs a frontend citation and an engine citation "
                               "(the engine relies on the rule)")

    def of(self, impl: Impl) -> tuple[Cite, ...]:
        return tuple(c for c in self.cites if c.impl is impl)

    def render(self) -> str:
        """One line for results.json's `source`: the checked citations, by implementation."""
        parts = []
        for impl in Impl:
            cites = self.of(impl)
            if cites:
                parts.append(f"{impl.value}: " + ", ".join(c.render() for c in cites))
        text = f"vllm {VLLM_GROUNDS_VERSION} [{self.basis.value}] " + "; ".join(parts)
        return f"{text} -- {self.note}" if self.note else text


def both(*cites: Cite, note: str = "") -> Grounds:
    """Both 0.33.0 frontends hold the rule (a MUST may stand on this)."""
    return Grounds(Basis.BOTH, cites, note)


def defect(*cites: Cite, note: str) -> Grounds:
    """One frontend holds the rule; the other's deviation is a defect (say which, and the
    damage: a hang, a crash, lost or corrupted data, an engine left in a wrong state)."""
    return Grounds(Basis.DEFECT, cites, note)


def only(*cites: Cite, note: str) -> Grounds:
    """Only one frontend has the feature (the other has no such surface); it holds the rule
    and the engine relies on it (cite the engine line)."""
    return Grounds(Basis.ONLY, cites, note)


def differ(*cites: Cite, note: str) -> Grounds:
    """The frontends deliberately differ (name both behaviours): at most SHOULD."""
    return Grounds(Basis.DIFFER, cites, note)


def recommendation(*cites: Cite, note: str) -> Grounds:
    """Neither frontend holds the rule; corewire recommends it: at most SHOULD."""
    return Grounds(Basis.RECOMMENDATION, cites, note)
