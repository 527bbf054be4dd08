"""A reference frontend core with every engine registered: the start of the pure-core tests."""

from __future__ import annotations

from collections.abc import Sequence

from harness.frontends.reference.core import ReferenceFrontendCore
from harness.protocol.transport.sockets import engine_identity
from harness.protocol.wire import DEFAULT_CODEC
from mock_engines.engine import MockEngineCore
from mock_engines.script import EngineScript, default_ready


def ready_core(ranks: Sequence[int] = (0, 1)) -> ReferenceFrontendCore:
    """A core that read each engine's ready payload (as the mock engines send it)."""
    core = ReferenceFrontendCore(list(ranks), codec=DEFAULT_CODEC)
    for rank in ranks:
        engine = MockEngineCore(rank, EngineScript(ready=default_ready(rank, len(ranks))),
                                dp_size=len(ranks), codec=DEFAULT_CODEC)
        core.on_ready(engine_identity(rank), engine.ready_payload())
    assert core.registered
    return core
