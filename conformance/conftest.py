"""Conformance sessions, too, must leave no process, socket, ipc dir or thread behind."""

from harness.hygiene.leak_fixture import no_leaks_at_session_end

__all__ = ["no_leaks_at_session_end"]
