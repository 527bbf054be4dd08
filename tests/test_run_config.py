"""RunConfig: a run's settings built and checked once at an entry point, then passed whole
(harness/frontends/run_config.py). What each setting resolves to, and the one line a bad
one gets."""

from __future__ import annotations

import pytest

from harness.frontends.run_config import RunConfig, RunConfigError
from harness.frontends.table import make_driver
from harness.protocol.timing import Timescale
from harness.protocol.wire.profiles import VLLM_0_33, get_profile


def test_the_engines_speak_the_runs_profile_else_the_frontends_own() -> None:
    assert RunConfig("reference").engine_profile is VLLM_0_33
    pinned = RunConfig("vllm-rs@0.23.0")
    assert pinned.frontend_profile == pinned.engine_profile == get_profile("vllm-0.23.0")
    forced = RunConfig("vllm-rs@0.23.0", get_profile("vllm-0.30.0"))
    assert (forced.engine_profile.name, forced.frontend_profile.name) == ("vllm-0.30.0",
                                                                           "vllm-0.23.0")
    # for_frontend keeps the run's settings, not the first frontend's own profile
    assert forced.for_frontend("reference").engine_profile.name == "vllm-0.30.0"
    assert pinned.for_frontend("reference").engine_profile is VLLM_0_33


def test_options_are_read_once_env_as_input_flags_first() -> None:
    env = {"COREWIRE_TIMESCALE": "2.5", "COREWIRE_KV_WORKER": "mutant:skips_neighbours"}
    config = RunConfig.from_options(["reference", "ec:reference"], None, None, env)
    assert config.timescale == Timescale(2.5)
    assert config.component_unit("kv") == "mutant:skips_neighbours"  # from the variable
    assert config.component_unit("ec") == "reference"  # from --frontend ec:reference
    flagged = RunConfig.from_options(["kv:reference"], "vllm-0.24.0", 3.0, env)
    assert flagged.timescale == Timescale(3.0) and flagged.component_unit("kv") == "reference"
    assert flagged.profile == get_profile("vllm-0.24.0")


@pytest.mark.parametrize(("frontends", "profile", "timescale", "env", "line"), [
    (["nonsense"], None, None, {}, "unknown frontend 'nonsense'"),
    (["reference"], "vllm-0.9.9", None, {}, "--profile: unknown protocol profile"),
    (["reference"], None, -1.0, {}, "--timescale must be a positive factor"),
    (["kv:reference", "kv:vllm-nixl"], None, None, {}, "one kv: component per run"),
    (["reference"], None, None, {"COREWIRE_EC_SCHEDULER": "mutant:nope"}, "nope"),
])
def test_a_bad_setting_is_one_line(frontends: list[str], profile: str | None,
                                   timescale: float | None, env: dict[str, str],
                                   line: str) -> None:
    with pytest.raises(RunConfigError, match=line.replace("(", r"\(")):
        RunConfig.from_options(frontends, profile, timescale, env)


def test_the_driver_is_built_from_the_config_with_its_time_scale() -> None:
    config = RunConfig("reference", timescale=Timescale(4.0))
    driver = make_driver(config)
    assert driver.timescale == Timescale(4.0)
    assert make_driver(RunConfig("vllm-rs@0.22.1")).name == "vllm-rs@0.22.1"


def test_a_unit_that_cannot_preload_leaves_its_cases_to_say_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The preload only saves time: its failure must not end the session (each case of the
    unit then fails with the reason, as without it)."""
    from types import SimpleNamespace

    from harness.cases.declaration import CaseSpec
    from harness.components.units import ComponentSlot
    from harness.results.records import Level
    from harness.run.selection import preload_components

    tried: list[str] = []

    def broken(self: ComponentSlot[object], name: str) -> None:
        tried.append(name)
        raise ImportError("no nixl here")

    monkeypatch.setattr(ComponentSlot, "preload", broken)
    spec = CaseSpec("components.kv_failure.x", Level.MUST, "r", "PR #1")
    items = [SimpleNamespace(corewire_spec=spec), SimpleNamespace()]
    preload_components(items, RunConfig(component_units={"kv": "vllm-nixl"}))  # type: ignore[arg-type]
    assert tried == ["vllm-nixl"]
