"""Scriptable mock engines speaking vLLM 0.33.0's engine-core framing on real ZMQ sockets."""

from mock_engines.engine import MockEngineCore
from mock_engines.group import EngineGroup, MockCoordinator, MockEngine
from mock_engines.runner import Bootstrapped, Handshake
from mock_engines.script import (
    Die,
    Emit,
    EmitArrays,
    EngineScript,
    Finish,
    FinishedOnly,
    Garbage,
    Rule,
    StatsOnly,
    UtilityReply,
    any_request,
    by_id,
    by_index,
    by_prompt,
    default_ready,
    endless,
    stream,
)
from mock_engines.transcript import MergedTranscript, Record, Transcript

__all__ = [
    "Bootstrapped", "Die", "Emit", "EmitArrays", "EngineGroup", "EngineScript", "Finish",
    "FinishedOnly", "Garbage", "StatsOnly",
    "Handshake", "MergedTranscript", "MockCoordinator", "MockEngine", "MockEngineCore",
    "Record", "Rule", "Transcript", "UtilityReply", "any_request", "by_id", "by_index",
    "by_prompt", "default_ready", "endless", "stream",
]
