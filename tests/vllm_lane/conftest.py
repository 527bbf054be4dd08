"""The vllm lane: tests that import the real vLLM 0.33.0 package.

Every module here is skipped (with the reason, without being imported) where vLLM is not
installed, so the core suite runs anywhere; `make test` installs the lane. vLLM must be told
it runs on CPU before its first import, hence the environment defaults below.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")

_HERE = Path(__file__).resolve().parent
_VLLM_MISSING = importlib.util.find_spec("vllm") is None  # cheap: nothing is imported
_SKIP_REASON = ("vllm is not installed in this environment; the vllm lane needs vllm 0.33.0 "
                "(make venv-vllm)")


class _VllmMissing(pytest.Module):
    """Stands in for a lane module where vllm is absent: reported skipped, never imported
    (the modules may need other lane-only packages too)."""

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
        pytest.skip(_SKIP_REASON)


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector
                                ) -> pytest.Module | None:
    if _VLLM_MISSING:
        return _VllmMissing.from_parent(parent, path=module_path)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this directory `vllm` (for `-m vllm` / `-m "not vllm"`)."""
    for item in items:
        if _HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def vllm() -> ModuleType:
    """The imported vllm package (skips when present but not importable, e.g. no torch)."""
    try:
        return importlib.import_module("vllm")
    except Exception as exc:  # ImportError, or a broken install raising anything else
        pytest.skip(f"vllm is installed but cannot be imported: {exc!r}")
