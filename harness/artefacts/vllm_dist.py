"""Locate the real vLLM 0.33.0 artifacts that the harness drives: the Rust frontend binary, the
Python package, and the tiny model directory both frontends load.

Stdlib only, and nothing here imports ``vllm`` (that import takes ~10 s): presence is probed with
``importlib.util.find_spec`` and ``importlib.metadata``, which only read the filesystem.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from harness.locations import fixture

VLLM_VERSION = "0.33.0"
WHEEL_MEMBER = "vllm/vllm-rs"
ENV_BINARY = "COREWIRE_VLLM_RS"
ENV_CACHE = "COREWIRE_CACHE"


class VllmArtifactError(RuntimeError):
    """A vLLM artifact the harness needs is missing, unusable, or could not be fetched."""


def _is_executable_file(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _vllm_package_dir() -> Path | None:
    """The installed ``vllm`` package directory, found without importing it."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    # A namespace package (a stray ``vllm/`` directory on sys.path) has no origin: not vLLM.
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return None
    return Path(spec.origin).parent


def installed_vllm_version() -> str | None:
    """The version of the installed ``vllm`` distribution (metadata only), or None."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_importable() -> bool:
    """Whether ``import vllm`` would find a package; used to skip the vllm lane cheaply."""
    return _vllm_package_dir() is not None


def cache_dir() -> Path:
    """Where fetched artifacts live: ``$COREWIRE_CACHE`` or ``~/.cache/corewire``."""
    root = os.environ.get(ENV_CACHE)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "corewire"


def tiny_model_dir() -> Path:
    """The checked-in weightless model directory (fixtures/tiny-model) that both real frontends
    load for config and tokenizer, so nothing is downloaded at run time."""
    path = fixture("tiny-model")
    if not (path / "config.json").is_file() or not (path / "tokenizer.json").is_file():
        raise VllmArtifactError(
            f"tiny model fixture missing at {path}: reinstall corewire (its wheel carries "
            "the fixtures), or in a checkout regenerate it with "
            "'python scripts/make_tiny_model.py'"
        )
    return path


def tiny_lora_dir() -> Path:
    """The checked-in weightless LoRA adapter directory (fixtures/tiny-lora): the one path a
    LoRA case asks a frontend to load, and the only one the vllm-rs driver allows its binary to
    load from (VLLM_RUNTIME_LORA_ALLOWED_PATH_PREFIXES). Canonical, because vllm-rs sends the
    canonical path to the engines."""
    path = fixture("tiny-lora").resolve()
    if not (path / "adapter_config.json").is_file():
        raise VllmArtifactError(f"LoRA adapter fixture missing at {path}: reinstall corewire "
                                "(its wheel carries the fixtures)")
    return path


def vllm_rs_binary() -> Path:
    """Path to vLLM 0.33.0's Rust frontend (``vllm-rs``), fetched once if need be.

    Order: ``$COREWIRE_VLLM_RS`` (an explicit choice, so it must be usable); else the binary
    shipped inside an installed vllm 0.33.0 package; else the member ``vllm/vllm-rs`` of the
    vllm 0.33.0 wheel, extracted into ``<cache_dir>/vllm-0.33.0/vllm-rs`` (the wheel is
    downloaded with pip the first time; later calls are a cache hit). The binary needs neither
    torch nor the vllm Python package.
    """
    override = os.environ.get(ENV_BINARY)
    if override:
        path = Path(override).expanduser()
        if not _is_executable_file(path):
            raise VllmArtifactError(f"{ENV_BINARY}={override!r} is not an executable file")
        return path.resolve()

    pkg = _vllm_package_dir()
    if pkg is not None and installed_vllm_version() == VLLM_VERSION:
        candidate = pkg / "vllm-rs"
        if _is_executable_file(candidate):
            return candidate

    target = cache_dir() / f"vllm-{VLLM_VERSION}" / "vllm-rs"
    if _is_executable_file(target):
        return target
    with _locked(target.parent / ".lock"):
        if _is_executable_file(target):  # another process fetched it while we waited
            return target
        _fetch_from_wheel(target)
    return target


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive inter-process lock, so parallel test workers download the wheel once."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _fetch_from_wheel(target: Path) -> None:
    """Download the vllm wheel (336 MB) into a temp dir beside ``target`` and extract the binary
    with an atomic rename; the wheel itself is deleted afterwards."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".wheel-", dir=target.parent) as tmp:
        print(
            f"corewire: downloading vllm=={VLLM_VERSION} wheel (~336 MB) to extract "
            f"{WHEEL_MEMBER} into {target.parent} (one time only)",
            file=sys.stderr,
            flush=True,
        )
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            f"vllm=={VLLM_VERSION}",
            "-d",
            tmp,
        ]
        try:
            subprocess.run(cmd, check=True, stdout=sys.stderr)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise VllmArtifactError(
                f"could not download vllm=={VLLM_VERSION} ({' '.join(cmd)}): {exc}; set "
                f"{ENV_BINARY} to an existing vllm-rs binary or install vllm=={VLLM_VERSION}"
            ) from exc
        wheels = sorted(Path(tmp).glob(f"vllm-{VLLM_VERSION}-*.whl"))
        if not wheels:
            raise VllmArtifactError(f"pip download left no vllm-{VLLM_VERSION} wheel in {tmp}")
        partial = target.parent / f".{target.name}.partial-{os.getpid()}"
        try:
            with zipfile.ZipFile(wheels[0]) as wheel:
                try:
                    src = wheel.open(WHEEL_MEMBER)
                except KeyError as exc:
                    raise VllmArtifactError(
                        f"{wheels[0].name} has no member {WHEEL_MEMBER}"
                    ) from exc
                with src, open(partial, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            mode = partial.stat().st_mode
            partial.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            os.replace(partial, target)
        except (OSError, zipfile.BadZipFile) as exc:
            raise VllmArtifactError(
                f"could not extract {WHEEL_MEMBER} from {wheels[0]}: {exc}"
            ) from exc
        finally:
            partial.unlink(missing_ok=True)
