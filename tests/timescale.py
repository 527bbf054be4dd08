"""The self-tests' time scale: read once from $COREWIRE_TIMESCALE (a test is an entry
point, like the plugin), handed to the drivers and cases a test builds itself."""

from __future__ import annotations

import os

from harness.frontends.run_config import RunConfig
from harness.protocol.timing import Timescale

TIMESCALE = Timescale.from_environment(os.environ)
scaled = TIMESCALE.scaled
# The run settings of the cases a test runs itself (run_case's `config`).
RUN_CONFIG = RunConfig(timescale=TIMESCALE)
