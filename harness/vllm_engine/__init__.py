"""The vLLM-core engine: vLLM 0.33.0's real engine core behind the mock engines' interface.

`VllmCoreGroup` runs vLLM's own `EngineCoreProc` (on CPU with `StubExecutor`, or on a
GPU with a real model) behind a `RecordingProxy`, so conformance cases and fidelity checks
can compare what mock engines do with what vLLM does. Importing this package does not import
vLLM; only the engine server process (and `stub_executor`) does.
"""

from harness.vllm_engine.engine_group import VllmCoreEngine, VllmCoreGroup
from harness.vllm_engine.engine_server import (
    SERVER_START_TIMEOUT,
    EngineUnavailable,
    VllmCoreError,
    check_available,
    engine_server,
    shutdown_servers,
)
from harness.vllm_engine.proxy import RecordingProxy

__all__ = ["SERVER_START_TIMEOUT", "EngineUnavailable", "RecordingProxy", "VllmCoreEngine",
           "VllmCoreError", "VllmCoreGroup", "check_available", "engine_server",
           "shutdown_servers"]
