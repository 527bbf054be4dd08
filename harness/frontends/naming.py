"""Stable names for a run's frontends: what JUnit, results.json, diff, merge, baselines and
the terminal key on, so a port keeps its name (and its baseline) whatever checkout or
machine starts it.

A `--frontend` value is `SPEC` or `NAME=SPEC` (`myport=subprocess:./driver --flag`).

* `NAME=SPEC`: NAME (letters, digits, `_.@+-`, at most 64; the first a letter or digit).
* a plain `subprocess:CMD`: the `name` its driver program answers to `init` (sanitised),
  learned by one probe start before collection (`probe_name`); when the program does not
  answer, a short form of CMD without directories (`/ci/x/bin/my-driver --v` ->
  `my-driver_--v`).
* any other spec is its own name (`reference`, `vllm-rs@0.23.0`, `mutant:NAME`, `kv:...`):
  none of them holds a path.

Names are unique in a run: two explicit names alike are a usage error; a learned name
already taken falls back to the short form, then gets `-2`, `-3` in `--frontend` order.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.frontends.run_config import RunConfig
from harness.frontends.table import parse_frontend

EXPLICIT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.@+-]{0,63})=(.+)$", re.DOTALL)
NAME_CHARS = re.compile(r"[^A-Za-z0-9_.@+:-]+")
MAX_NAME = 64
SHORT_FORM_CHARS = 40  # a longer short form is cut here and gets a digest of the whole
PROBE_S = 20.0  # how long the probe waits for `init`'s reply (x the run's time scale)


@dataclass(frozen=True)
class NamedFrontend:
    """One `--frontend` of the run: the name every report uses and the spec that runs."""

    name: str
    spec: str

    @property
    def explicit(self) -> bool:
        return self.name != self.spec


def split_name(value: str) -> tuple[str | None, str]:
    """(`NAME`, `SPEC`) of `NAME=SPEC`; (None, value) for a bare spec. A spec never starts
    with `word=`: its prefixes end in `:` or `@`, and `=` inside a command comes after one."""
    found = EXPLICIT.match(value)
    if found is None:
        return None, value
    return found.group(1), found.group(2)


def spec_of(value: str) -> str:
    """The spec of a `--frontend` value (`NAME=` removed)."""
    return split_name(value)[1]


def sanitise(text: str) -> str:
    """A name made of NAME_CHARS: other runs of characters become `-`, no `::` (pytest's
    node-id separator), no leading or trailing punctuation, at most MAX_NAME characters."""
    name = NAME_CHARS.sub("-", text.strip())
    name = re.sub(r":{2,}", ":", name)
    return name[:MAX_NAME].strip("-._:")


def short_form(spec: str) -> str:
    """A stable name for a spec without its directories: the command's words, each path
    cut to its last part, joined by `_`; cut to SHORT_FORM_CHARS with a digest of the whole
    when longer. The same port started from another path keeps this name."""
    parsed = parse_frontend(spec)
    if parsed.kind != "subprocess":
        return sanitise(spec) or "frontend"
    try:
        words = shlex.split(parsed.argument)
    except ValueError:
        words = parsed.argument.split()
    parts = [sanitise(os.path.basename(w.rstrip("/")) if "/" in w else w) for w in words]
    whole = "_".join(p for p in parts if p) or "subprocess"
    if len(whole) <= SHORT_FORM_CHARS:
        return whole
    digest = hashlib.sha256(whole.encode()).hexdigest()[:6]
    return f"{whole[:SHORT_FORM_CHARS].rstrip('-._:')}-{digest}"


def needs_probe(spec: str) -> bool:
    """A plain `subprocess:CMD` is named by its program (`reference-subprocess` is not)."""
    return parse_frontend(spec).kind == "subprocess"


def resolve(values: Sequence[str], learn: Callable[[str], str | None]
            ) -> list[NamedFrontend]:
    """The named frontends of `--frontend` values, in their order; `learn(spec)` is the
    init name of a plain subprocess spec's program (None: it did not answer). ValueError
    (a usage error) for a bad or repeated explicit name."""
    named: list[NamedFrontend] = []
    taken: set[str] = set()
    for value in values:
        name, _spec = split_name(value)
        if name is None:
            continue
        if name in taken:
            raise ValueError(f"--frontend {value!r}: the name {name!r} is given twice")
        taken.add(name)
    for value in values:
        name, spec = split_name(value)
        if name is None:
            learned = sanitise(learn(spec) or "") if needs_probe(spec) else spec
            name = _unique(learned or short_form(spec), short_form(spec), taken)
            taken.add(name)
        named.append(NamedFrontend(name, spec))
    return named


def _unique(wanted: str, fallback: str, taken: set[str]) -> str:
    for candidate in (wanted, fallback):
        if candidate not in taken:
            return candidate
    number = 2
    while f"{fallback}-{number}" in taken:
        number += 1
    return f"{fallback}-{number}"


def probe_name(config: RunConfig) -> str | None:
    """Start the driver program of `config.frontend` once, ask `init` (one engine, nothing
    else) and stop it: its `name`, or None when it exits, breaks the protocol or stays silent for
    PROBE_S (scaled). Never raises: a program that cannot start is the cases' to grade."""
    import asyncio

    from harness.frontends.subprocess.driver import SubprocessDriver
    from harness.frontends.table import make_driver

    driver = make_driver(config)
    if not isinstance(driver, SubprocessDriver):
        return None
    try:
        return asyncio.run(driver.introduce(config.timescale.scaled(PROBE_S)))
    except Exception:  # the cases will meet the same fault and grade it
        return None
