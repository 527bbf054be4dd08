"""What a frontend driver may use of the engines it is started against: `EngineSide`.

Three kinds of engine groups stand behind a frontend (the scriptable mock engines, vLLM's real
engine core behind a recording proxy, and test-only compositions of both), and every driver
(in-process, subprocess, vllm-rs, vllm-py) starts against any of them. Drivers type against
this protocol, never a concrete group, so a new engine kind is one class that fits it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class EngineEndpoint(Protocol):
    """One engine as a driver sees it: its DP rank (its identity on the wire)."""

    @property
    def rank(self) -> int: ...


class EngineSide(Protocol):
    """An engine group: which start-up the case asked for, and how to start the engines.

    `handshake`: the frontend must own HELLO / INIT / READY (then `start_handshake`), else
    the frontend binds and the engines connect (`start_bootstrapped`). `coordinated`: the
    frontend must also own a wave-coordinating DP coordinator and name it in INIT. A driver
    that cannot do what these ask refuses to start; it never falls back.
    """

    handshake: bool
    coordinated: bool

    @property
    def engines(self) -> Sequence[EngineEndpoint]: ...

    @property
    def stats_address(self) -> str | None:
        """The DP-stats XPUB a frontend subscribes to (None: no coordinator)."""
        ...

    def start_bootstrapped(self, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        """Connect every engine to the addresses the frontend bound (one pair per client)."""
        ...

    def start_handshake(self, address: str, *, local: bool = True, headless: bool = False,
                        timeout: float = 30.0) -> None:
        """Each engine does HELLO / INIT / READY against the frontend's handshake ROUTER."""
        ...
