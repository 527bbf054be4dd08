"""Everything a conformance case is written with, in one import.

`from harness.cases.authoring import *` names no more than this module's `__all__`: the
case declaration, the context a case drives, the driver's surface, grounds, the mock
engines' scripts and the helpers cases share. A case needing something rarer (a component
rig, a wire struct by name) imports it from its home.
"""

from __future__ import annotations

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import (
    Basis,
    Grounds,
    both,
    defect,
    differ,
    engine,
    only,
    py,
    recommendation,
    rs,
)
from harness.cases.helpers import (
    UTILITY_GIVE_UP_S,
    hold,
    names_engine,
    prompt,
    request_for,
    requests_for,
    require_refused_later,
    routed_engine,
    same_value,
    trickle,
)
from harness.frontends.api import (
    Capability,
    FrontendError,
    Sampling,
    StartupError,
    StartupHang,
    StreamHandle,
    UnsupportedOperation,
)
from harness.protocol.vocab import EOS_TOKEN_ID, detokenize
from harness.protocol.wire import messages
from harness.results.records import Level
from mock_engines.group import EngineGroup, MockEngine
from mock_engines.script import (
    DEFAULT_MAX_MODEL_LEN,
    Die,
    Emit,
    EmitArrays,
    EngineScript,
    Finish,
    FinishedOnly,
    Garbage,
    Rule,
    StatsOnly,
    Step,
    UtilityReply,
    any_request,
    by_prompt,
    default_ready,
    stream,
)

__all__ = [
    "DEFAULT_MAX_MODEL_LEN", "EOS_TOKEN_ID", "UTILITY_GIVE_UP_S", "Basis", "Capability",
    "CaseContext", "Die", "Emit", "EmitArrays", "EngineGroup", "EngineScript", "Finish",
    "FinishedOnly", "FrontendError", "Garbage", "Grounds", "Level", "MockEngine", "Rule",
    "Sampling", "StartupError", "StartupHang", "StatsOnly", "Step", "StreamHandle",
    "UnsupportedOperation", "UtilityReply", "any_request", "both", "by_prompt", "case",
    "default_ready", "defect", "detokenize", "differ", "engine", "hold", "messages",
    "names_engine", "only", "prompt", "py", "recommendation", "request_for", "requests_for",
    "require_refused_later", "routed_engine", "rs", "same_value", "stream", "trickle",
]
