"""`corewire bench`: a frontend under load, measured with mock engines that are never the
bottleneck (mock_engines/loadgen.py). One module per scenario family: throughput, latency
(per-token, TTFT), control (abort storm, utility round trip, startup)."""

from harness.bench.frontend_under_load import BenchOptions
from harness.bench.model import BUSY_LIMIT, Row, Scenario
from harness.bench.runner import SCENARIOS, run_bench

__all__ = ["BUSY_LIMIT", "SCENARIOS", "BenchOptions", "Row", "Scenario", "run_bench"]
