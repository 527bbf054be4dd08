"""Where corewire's own files are, in a source checkout and in an installed distribution.

Two layouts, one answer:

* **checkout**: `harness/`, `mock_engines/`, `conformance/` and `fixtures/` side by side
  in the repository root.
* **installed** (a wheel or sdist, pip): `harness/`, `mock_engines/` and `conformance/`
  side by side in site-packages; the repository's top-level `fixtures/` travels as the
  package data of `harness.fixtures` (pyproject's package-dir maps it), i.e.
  `site-packages/harness/fixtures/`.

So the cases are always the `conformance` package beside `harness` (`IMPORT_ROOT`), and
the fixtures are `harness/fixtures` when installed, else the checkout's `fixtures/`. Every
module that reads a fixture or looks for the cases asks here, never `Path(__file__)`
arithmetic of its own. Nothing here imports a case or reads a fixture.
"""

from __future__ import annotations

from pathlib import Path

# The directory that holds the `harness` package: the checkout root, or site-packages.
IMPORT_ROOT = Path(__file__).resolve().parent.parent
CASES_PACKAGE = "conformance"
_INSTALLED_FIXTURES = Path(__file__).resolve().parent / "fixtures"
_CHECKOUT_FIXTURES = IMPORT_ROOT / "fixtures"
# The file `corewire run` hands its pytest child (-c): its configuration, whatever
# project surrounds the installed cases.
RUN_INI = Path(__file__).resolve().parent / "run" / "corewire_run.ini"


class MissingInstallError(RuntimeError):
    """The cases or fixtures are not where this corewire expects them (a broken install,
    or a distribution built without them)."""


def fixtures_dir() -> Path:
    """The fixtures directory (tiny model, protocol profiles, baselines, LoRA adapter, wire
    vectors). Never raises: a missing directory is reported by whoever reads a fixture,
    naming this path (see `require_fixture`)."""
    if _INSTALLED_FIXTURES.is_dir():
        return _INSTALLED_FIXTURES
    return _CHECKOUT_FIXTURES


def fixture(*parts: str) -> Path:
    """A path inside the fixtures directory (which may not exist: see `require_fixture`)."""
    return fixtures_dir().joinpath(*parts)


def require_fixture(*parts: str) -> Path:
    """A fixture that must exist, else a MissingInstallError naming both places looked in."""
    path = fixture(*parts)
    if not path.exists():
        raise MissingInstallError(
            f"corewire fixture {'/'.join(parts)} not found (looked in {_INSTALLED_FIXTURES} "
            f"and {_CHECKOUT_FIXTURES}): reinstall corewire from a wheel or sdist that "
            f"includes its fixtures, or run from a source checkout")
    return path


def cases_dir() -> Path:
    """The directory of the conformance cases (the `conformance` package beside
    `harness`), whether or not it exists: `require_cases_dir` checks."""
    return IMPORT_ROOT / CASES_PACKAGE


def require_cases_dir() -> Path:
    """The cases directory, else a MissingInstallError saying why there are no cases."""
    path = cases_dir()
    if not (path / "__init__.py").is_file() or not any(path.glob("*/test_*.py")):
        raise MissingInstallError(
            f"corewire's conformance cases are not installed: no '{CASES_PACKAGE}' package "
            f"with case modules at {path} (beside harness at {IMPORT_ROOT / 'harness'}); "
            f"reinstall corewire from a wheel or sdist that includes them, or run from a "
            f"source checkout")
    return path


def is_installed_layout() -> bool:
    """Whether this corewire runs from an installed distribution (its fixtures are package
    data) rather than a source checkout."""
    return _INSTALLED_FIXTURES.is_dir()


__all__ = ["CASES_PACKAGE", "IMPORT_ROOT", "RUN_INI", "MissingInstallError", "cases_dir",
           "fixture", "fixtures_dir", "is_installed_layout", "require_cases_dir",
           "require_fixture"]
