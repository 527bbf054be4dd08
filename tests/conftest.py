"""Harness self-tests: every session must end with no leaked process, socket or dir."""

from harness.hygiene.leak_fixture import no_leaks_at_session_end

__all__ = ["no_leaks_at_session_end"]
