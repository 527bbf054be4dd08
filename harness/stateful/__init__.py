"""Stateful fuzzing of the frontend role: random interleavings, invariants after every step.

One public concern per module (as hypothesis keeps its own stateful testing):

* invariants.py  -- the catalogue of rules the machine checks, by stable name
* model.py       -- `WireModel`: what the frontend owes each stream and engine, moved along
                    the shared request lifecycle (harness/protocol/lifecycle.py)
* probe.py       -- the core's wire boundary, observed for the model
* worlds.py      -- the in-memory world (`SansIOWorld`) and the `World` interface;
  socket_world.py   the real-ZMQ world (`SocketWorld`)
* plan.py        -- packed draws and the engine-side scripts they stand for
* machine.py     -- `FrontendMachine`, the hypothesis RuleBasedStateMachine
* run.py         -- `run_stateful` under hypothesis; core specs
* replays.py     -- replay files: write, load, replay, promote to regressions
* settings.py    -- example counts and the "nightly" profile (registered when asked for)
* cli.py         -- ``python -m harness.stateful run|replay|promote``

The names tests and tools use are re-exported here.
"""

from harness.stateful.invariants import INVARIANTS, InvariantViolation
from harness.stateful.machine import RULES, FrontendMachine
from harness.stateful.model import RequestModel, WireModel
from harness.stateful.replays import (
    DEFAULT_REPLAY_DIR,
    REGRESSIONS_DIR,
    REPLAY_FORMAT,
    STATEFUL_DIR_ENV,
    core_name,
    load_replay,
    promote,
    regression_files,
    replay,
    replay_dir,
    replay_steps,
    write_replay,
)
from harness.stateful.run import SEED_ENV, resolve_core, run_stateful
from harness.stateful.settings import (
    EXAMPLES_ENV,
    NIGHTLY,
    STOP_STRINGS_ENV,
    register_profiles,
    stateful_settings,
    stop_strings_enabled,
)
from harness.stateful.worlds import TRANSPORTS, SansIOWorld, World

__all__ = [
    "DEFAULT_REPLAY_DIR", "EXAMPLES_ENV", "INVARIANTS", "NIGHTLY", "REGRESSIONS_DIR",
    "REPLAY_FORMAT", "RULES", "SEED_ENV", "STATEFUL_DIR_ENV", "STOP_STRINGS_ENV",
    "TRANSPORTS", "FrontendMachine", "InvariantViolation", "RequestModel", "SansIOWorld",
    "WireModel", "World", "core_name", "load_replay", "promote", "register_profiles",
    "regression_files", "replay", "replay_dir", "replay_steps", "resolve_core",
    "run_stateful", "stateful_settings", "stop_strings_enabled", "write_replay",
]
