"""The example port (fixtures/example_port/driver.py) against a slice of the suite, end to
end (`pytest conformance --frontend subprocess:...`), with its verdict profile asserted.

The slice covers each area the port implements (streaming and stop strings, aborts,
utilities, failure, DP routing and waves, registration) and one case of each thing it
declares away. The profile: PASS wherever the port declares what the case needs
(streaming.add_fields.greedy_eos_* included: they need protocol version 2), UNSUPPORTED
exactly where it does not (a capability it leaves out, or the handshake mode it declines),
and never FAIL, ERROR or TIMEOUT. Against the whole suite the port has the same profile
(every applicable case PASS, 2 INFO); the slice keeps this test near 30 s on 2 cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from harness.cases.index import wire_specs
from harness.results.records import Verdict

ROOT = Path(__file__).resolve().parent.parent
PORT = ROOT / "fixtures" / "example_port" / "driver.py"
FRONTEND = f"subprocess:{shlex.quote(sys.executable)} {shlex.quote(str(PORT))}"
BOUND_S = 120.0  # the whole run, pytest start-up included (about 30 s measured on 2 cores)

SLICE = [
    "streaming.add_fields.greedy_eos_1_engines", "streaming.add_fields.greedy_eos_2_engines",
    "streaming.add_fields.external_req_id_generated",
    "streaming.add_fields.external_req_id_client_chosen", "streaming.finish.stop",
    "streaming.finish.length", "streaming.finish_kinds.error_mid_2_engines",
    "streaming.finish_kinds.stop_eos_2_engines", "streaming.finish_kinds.abort_first_2_engines",
    "streaming.text.detokenized", "streaming.aux.multipart_outputs_2_engines",
    "streaming.shape.unknown_id_mid_batch", "streaming.stop_string.inside_chunk",
    "streaming.stop_string.in_final_output", "streaming.stop_edge.holds_back_1_4",
    "streaming.stop_edge.held_text_released_on_engine_abort",
    "streaming.request_error.message_reaches_client_after_tokens_2_engines",
    "streaming.finished_requests.without_final_output_not_aborted_after_tokens",
    "streaming.stop_min_tokens.spans_threshold",
    "streaming.refused.prompt_over_max_model_len_2_engines",
    "abort.drop.single", "abort.drop.explicit_rank", "abort.burst.exactly_once",
    "abort.explicit.mix", "abort.explicit_list.stale_between_2_engines",
    "abort.after_end.stop_string_drop", "abort.phase.before_add_read",
    "abort.stop_string.aborts_engine", "abort.dead_engine.no_abort",
    "utility.is_sleeping.wire_shape", "utility.collective_rpc.fan_out_once",
    "utility.collective_rpc.one_engine_fails", "utility.edges.disagreement_shows_values_3",
    "utility.reset_prefix_cache.and_four_last_false", "utility.cancel.late_reply_harmless",
    "utility.result.scalar_types", "utility.stray.eep_notification_dp",
    "utility.pass_through.kv_transfer_params",
    "failure.engine_dead.streams_fail", "failure.engine_dead.pending_utility_fails",
    "failure.sticky.not_msgpack_2_engines", "failure.sticky.missing_aux_frame_2_engines",
    "failure.socket_closed.bounded",
    "dp.is_sleeping.disagree", "dp.routing.explicit_rank",
    "dp.routing.least_loaded_3_engines_idle_1", "dp.routing.reported_load_2_engines",
    "dp.routing.rank_out_of_range_2_engines", "dp.wave.add_follows_newest_wave",
    "dp.utility.fan_out_once",
    "handshake.ready.max_model_len_min_2_engines", "handshake.ready.missing_max_model_len",
    "handshake.register.all_engines",
    # declared away by the port: UNSUPPORTED
    "abort.resumable.drop_mid_segment_1_engines", "streaming.inputs.prompt_embeds_inline",
    "streaming.resumable.continuation_matches_first_1_engines",
    "handshake.mode.hello_init_ready_2_engines",
]
# Cases that start the engines in handshake mode (ctx.start(handshake=True)), which the
# port declines in its init reply: not visible in a case's `needs`.
HANDSHAKE_MODE = {"handshake.mode.hello_init_ready_2_engines"}


def the_port() -> ModuleType:
    """The example port as a module (it imports pyzmq and msgspec only), for its
    declared capabilities."""
    spec = importlib.util.spec_from_file_location("example_port_driver", PORT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def expected_verdicts() -> dict[str, tuple[Verdict, str]]:
    """Each case of the slice: UNSUPPORTED (with the reason the message must name) where
    the port declares nothing for it, else PASS."""
    port = the_port()
    # `sampling` is no declaration: protocol version 2 grants it (init.model, sampling).
    declared = set(port.CAPABILITIES) | ({"sampling"} if port.VERSION >= 2 else set())
    specs = wire_specs()
    expected: dict[str, tuple[Verdict, str]] = {}
    for case_id in SLICE:
        lacking = sorted(c.value for c in specs[case_id][0].needs if c.value not in declared)
        if lacking:
            expected[case_id] = (Verdict.UNSUPPORTED, f"lacks {', '.join(lacking)}")
        elif case_id in HANDSHAKE_MODE:
            expected[case_id] = (Verdict.UNSUPPORTED, "handshake mode was requested")
        else:
            expected[case_id] = (Verdict.PASS, "")
    return expected


def test_the_port_stands_alone() -> None:
    """It is documentation for port authors: nothing of corewire, pyzmq and msgspec only."""
    source = PORT.read_text()
    imported = {line.split()[1].split(".")[0] for line in source.splitlines()
                if line.startswith(("import ", "from "))}
    assert imported <= {"__future__", "asyncio", "itertools", "json", "os", "sys", "time",
                        "traceback", "uuid", "collections", "dataclasses", "typing",
                        "msgspec", "zmq"}, imported


def test_the_example_port_verdict_profile(tmp_path: Path) -> None:
    expected = expected_verdicts()
    assert {v for v, _ in expected.values()} == {Verdict.PASS, Verdict.UNSUPPORTED}
    assert all(expected[f"streaming.add_fields.greedy_eos_{n}_engines"][0] is Verdict.PASS
               for n in (1, 2))
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(private_tmp)}
    env.pop("COREWIRE_DRIVER_FAULT", None)
    argv = [sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q", "-n", "2",
            "-p", "no:cacheprovider", "-k", " or ".join(f"{c}[" for c in SLICE),
            "--frontend", FRONTEND, "--report-dir", str(tmp_path / "reports")]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=env)
    elapsed = time.monotonic() - started
    output = proc.stdout[-4000:] + proc.stderr[-2000:]
    records = json.loads((tmp_path / "reports" / "results.json").read_text())["results"]
    seen = {r["id"]: r for r in records}
    assert sorted(seen) == sorted(expected), output  # the slice, exactly
    wrong = {case_id: (seen[case_id]["verdict"], seen[case_id]["message"][:300])
             for case_id, (verdict, reason) in expected.items()
             if Verdict(seen[case_id]["verdict"]) is not verdict
             or reason not in seen[case_id]["message"]}
    assert not wrong, wrong
    assert proc.returncode == 0, output
    assert elapsed < BOUND_S, f"{elapsed:.1f} s > {BOUND_S} s\n{output}"
    left = [p.name for p in private_tmp.iterdir() if not p.name.startswith("pytest-of-")]
    assert left == [], f"ipc or driver dirs left behind: {left}"  # xdist's basetemp aside
