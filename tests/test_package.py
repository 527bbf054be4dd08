"""corewire as a package: built, installed into a fresh virtualenv, run from elsewhere.

A port author installs corewire into the port's own CI (README, "CI recipes"), so the
distribution must carry everything a run needs (the cases, the fixtures, its pytest
dependencies) and its pytest plugins must leave every other pytest session alone.

One build and one install per session (`installed`, shared by the xdist workers through a
lock): `python -m build --no-isolation` (the sdist, then the wheel from the sdist, so
both are checked) from a copy of the checkout, then a fresh `python -m venv` and `pip
install WHEEL` with its dependencies from the package index (no dev extras). For speed
the venv is made without pip and this environment's pip installs into it (`pip --python
VENV`, pip itself included so the recipes' `python -m pip` works), with `--no-compile`
(modules compile when first imported); pip's cache applies. Every command then runs in
an unrelated temporary directory with no PYTHONPATH, so only the installed corewire can
answer.

Marker `package`: it needs the package index; `-m "not package"` deselects it offline.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import locations
from harness.run import cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# What the build copies: the checkout without its environments, caches and outputs.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "venv", "__pycache__", "*.pyc",
                                     "*.egg-info", "build", "dist", "reports", ".cache",
                                     ".whl", "mutants", ".hypothesis", ".pytest_cache",
                                     ".mypy_cache", ".ruff_cache")
BUILD_TIMEOUT = 300
INSTALL_TIMEOUT = 600  # a fresh venv and the dependencies (matplotlib, grpcio ...) from PyPI
RUN_TIMEOUT = 300
# pytest-timeout counts fixture setup: the test that builds and installs needs both bounds.
INSTALLED_TEST_TIMEOUT = BUILD_TIMEOUT + INSTALL_TIMEOUT + 2 * RUN_TIMEOUT
# The port the recipes gate: the example port (a standalone driver program, pyzmq and
# msgspec only), copied into the recipe's directory as the port's repository and run by
# the recipe's own COREWIRE_FRONTEND ("subprocess:python driver.py").
EXAMPLE_PORT = ROOT / "fixtures" / "example_port" / "driver.py"
RECIPE_BEGIN = "# corewire-recipe: begin"
RECIPE_END = "# corewire-recipe: end"


@dataclass(frozen=True)
class Installed:
    """A fresh virtualenv with the wheel built from this checkout installed."""

    wheel: Path
    venv: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def env(self) -> dict[str, str]:
        """This process's environment with the venv first on PATH and nothing that would
        import the checkout instead of the installed package."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "PYTEST_ADDOPTS", "VIRTUAL_ENV",
                            "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
                            "PYTEST_CURRENT_TEST")}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.venv)
        return env

    def run(self, argv: list[str], cwd: Path, timeout: float = RUN_TIMEOUT
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=cwd, env=self.env(), capture_output=True, text=True,
                              timeout=timeout)


def _check(proc: subprocess.CompletedProcess[str], what: str) -> None:
    if proc.returncode != 0:
        raise AssertionError(f"{what}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")


def _build_wheel(out: Path) -> Path:
    """sdist, then the wheel from the sdist, from a copy of the checkout (the build writes
    its egg-info beside the sources, and the checkout is not ours to write)."""
    source = out / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES, symlinks=True)
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                           str(out / "dist"), str(source)], capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT)
    if proc.returncode != 0 and "No module named build" in proc.stderr:
        raise AssertionError("`build` is not installed: pip install -e '.[dev]' (make venv)")
    _check(proc, "python -m build")
    wheels = sorted((out / "dist").glob("corewire-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _install(root: Path) -> Installed:
    wheel = _build_wheel(root)
    venv = root / "venv"
    _check(subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                          capture_output=True, text=True, timeout=INSTALL_TIMEOUT),
           "python -m venv")
    installed = Installed(wheel, venv)
    _check(installed.run([sys.executable, "-m", "pip", "--python",
                          str(installed.bin / "python"), "install", "-q", "--no-compile",
                          "--disable-pip-version-check", "pip", str(wheel)], cwd=root,
                         timeout=INSTALL_TIMEOUT), "pip install WHEEL")
    return installed


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Built and installed once per session: xdist workers share the session's base temp
    directory and take turns on a lock, so the second one finds the first one's venv."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    root = base / "corewire-package"
    root.mkdir(exist_ok=True)
    record = root / "installed.json"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            for leftover in ("source", "dist", "venv"):  # a failed attempt's
                shutil.rmtree(root / leftover, ignore_errors=True)
            made = _install(root)
            record.write_text(json.dumps({"wheel": str(made.wheel), "venv": str(made.venv)}))
        data = json.loads(record.read_text())
    return Installed(Path(data["wheel"]), Path(data["venv"]))


def _results(report_dir: Path) -> list[dict[str, object]]:
    rows = json.loads((report_dir / "results.json").read_text())["results"]
    assert isinstance(rows, list)
    return rows


def _assert_abort_run(report_dir: Path, frontend: str) -> None:
    """A complete report set of the abort area, every case graded PASS."""
    assert (report_dir / "junit.xml").is_file() and (report_dir / "report.html").is_file()
    rows = _results(report_dir)
    assert len(rows) > 40, len(rows)  # the abort area: 52 cases today
    assert {str(r["id"]).split(".")[0] for r in rows} == {"abort"}
    assert {(r["frontend"], r["verdict"]) for r in rows} == {(frontend, "PASS")}


# ------------------------------------------------------------------ no network needed


def test_the_package_list_names_every_package_of_the_tree() -> None:
    """pyproject lists the packages (a package mapped onto fixtures/ cannot be discovered):
    every directory of Python modules under harness, mock_engines and conformance is
    listed, so none is missing from an installed corewire."""
    from setuptools.config.pyprojecttoml import read_configuration  # the build backend

    config = read_configuration(ROOT / "pyproject.toml")["tool"]["setuptools"]
    listed = set(config["packages"])
    tree = {".".join(d.relative_to(ROOT).parts)
            for top in ("harness", "mock_engines", "conformance")
            for d in [ROOT / top, *(ROOT / top).rglob("*")]
            if d.is_dir() and d.name != "__pycache__"
            and (any(d.glob("*.py")) or any(d.glob("*.proto")))}
    assert listed == tree | {"harness.fixtures"}
    assert config["package-dir"] == {"harness.fixtures": "fixtures"}


def test_missing_cases_are_named_not_an_empty_selection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An install without the cases says so (exit 4, one line) before pytest starts,
    instead of "the selection matched no case" (exit 5)."""
    monkeypatch.setattr(locations, "IMPORT_ROOT", tmp_path)
    code = cli.main(["run", "--report-dir", str(tmp_path / "reports"), "-k", "abort"])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "conformance cases are not installed" in err and str(tmp_path) in err
    assert len(err.strip().splitlines()) == 1


def test_the_checkout_finds_its_own_fixtures_and_cases() -> None:
    assert locations.fixtures_dir() == ROOT / "fixtures"
    assert locations.require_cases_dir() == ROOT / "conformance"
    assert locations.require_fixture("tiny-model", "config.json").is_file()


# ------------------------------------------------------------------ built and installed


@pytest.mark.package
@pytest.mark.timeout(INSTALLED_TEST_TIMEOUT)
def test_the_wheel_carries_the_cases_and_the_fixtures(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    for name in ("conformance/__init__.py", "conformance/conftest.py",
                 "conformance/abort/test_drop.py", "conformance/components/test_ec_deferral.py",
                 "harness/run/corewire_run.ini", "harness/locations.py",
                 "harness/fixtures/tiny-model/config.json",
                 "harness/fixtures/tiny-model/tokenizer.json",
                 "harness/fixtures/tiny-lora/adapter_config.json",
                 "harness/fixtures/profiles/vllm-0.33.0.json",
                 "harness/fixtures/baselines/vllm-0.33.json",
                 "harness/fixtures/wire/abort.json"):
        assert name in names, name
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    # Every checked-in fixture travels (the whole folder is package data).
    fixtures = {f"harness/fixtures/{p.relative_to(ROOT / 'fixtures').as_posix()}"
                for p in (ROOT / "fixtures").rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
    assert fixtures <= names, sorted(fixtures - names)[:10]


@pytest.mark.package
@pytest.mark.timeout(INSTALLED_TEST_TIMEOUT)
def test_the_installed_corewire_is_the_one_that_answers(installed: Installed,
                                                        tmp_path: Path) -> None:
    """Not the checkout: harness, the cases and the fixtures resolve inside the venv, and
    no development dependency was installed."""
    code = ("import json, harness, conformance, harness.locations as l, importlib.util as u;"
            "print(json.dumps([harness.__file__, conformance.__file__, str(l.fixtures_dir()),"
            " u.find_spec('hypothesis') is None, u.find_spec('xdist') is not None]))")
    proc = installed.run([str(installed.bin / "python"), "-c", code], cwd=tmp_path)
    _check(proc, "python -c")
    harness_file, cases_file, fixtures, no_hypothesis, xdist = json.loads(proc.stdout)
    for path in (harness_file, cases_file, fixtures):
        assert Path(path).is_relative_to(installed.venv), path
    assert Path(fixtures).name == "fixtures" and Path(fixtures).parent.name == "harness"
    assert no_hypothesis and xdist


@pytest.mark.package
@pytest.mark.timeout(INSTALLED_TEST_TIMEOUT)
def test_corewire_run_from_an_unrelated_directory(installed: Installed,
                                                  tmp_path: Path) -> None:
    proc = installed.run([str(installed.bin / "corewire"), "run", "--frontend", "reference",
                          "-m", "abort", "-n", "2", "--report-dir", "X"], cwd=tmp_path)
    _check(proc, "corewire run")
    _assert_abort_run(tmp_path / "X", "reference")


@pytest.mark.package
@pytest.mark.timeout(INSTALLED_TEST_TIMEOUT)
def test_plain_pytest_with_a_corewire_option_runs_the_installed_cases(
        installed: Installed, tmp_path: Path) -> None:
    """No path given: `pytest --frontend X` runs corewire's cases, not the cwd."""
    (tmp_path / "test_not_a_case.py").write_text("def test_never_collected():\n"
                                                 "    raise AssertionError\n")
    proc = installed.run([str(installed.bin / "pytest"), "--frontend", "reference", "-m", "abort",
                          "--report-dir", "Y", "--junitxml=Y/junit.xml", "-n", "2",
                          "-p", "no:cacheprovider"], cwd=tmp_path)
    _check(proc, "pytest --frontend reference")
    _assert_abort_run(tmp_path / "Y", "reference")


UNRELATED_SUITE = '''
import signal
import sys


def test_signal_handlers_are_pythons_own():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_no_development_dependency_or_case_was_imported():
    assert "hypothesis" not in sys.modules
    assert "harness.stateful" not in sys.modules
    assert not [m for m in sys.modules if m.startswith("conformance")]
'''


def _normalized(out: str) -> list[str]:
    """pytest's output less what differs between two runs of one suite (timings, the
    header's plugin list)."""
    lines = [line for line in out.splitlines() if not line.startswith("plugins:")]
    return [re.sub(r"\d+\.\d+s", "T", line) for line in lines]


@pytest.mark.package
@pytest.mark.timeout(INSTALLED_TEST_TIMEOUT)
def test_an_unrelated_suite_runs_as_if_corewire_were_absent(installed: Installed,
                                                            tmp_path: Path) -> None:
    """The plugins are loaded into every pytest session of the venv; a session that asks
    for no corewire option and no case must pass unchanged: the same output as with both
    plugins disabled, no signal handler, no report written or cleared."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_unrelated.py").write_text(UNRELATED_SUITE)
    reports = suite / "reports"  # corewire's default report dir: left alone
    reports.mkdir()
    for name in ("results.json", "junit.xml", "report.html"):
        (reports / name).write_text("theirs")
    argv = [str(installed.bin / "pytest"), "-p", "no:cacheprovider", "-rA"]
    with_corewire = installed.run(argv, cwd=suite)
    _check(with_corewire, "the unrelated suite")
    without = installed.run([*argv, "-p", "no:corewire", "-p", "no:corewire_replay"],
                            cwd=suite)
    _check(without, "the unrelated suite without corewire's plugins")
    assert "2 passed" in with_corewire.stdout
    assert _normalized(with_corewire.stdout) == _normalized(without.stdout)
    assert with_corewire.stderr == without.stderr == ""
    assert "corewire" not in "\n".join(_normalized(with_corewire.stdout))
    assert sorted(p.name for p in reports.iterdir()) == ["junit.xml", "report.html",
                                                          "results.json"]
    assert {(reports / n).read_text() for n in ("results.json", "junit.xml")} == {"theirs"}
    assert {p.name for p in suite.iterdir()} <= {"test_unrelated.py", "reports", "__pycache__"}
    # An empty session is pytest's own exit 5, with no corewire summary line either.
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = installed.run([str(installed.bin / "pytest"), "-p", "no:cacheprovider"], cwd=empty)
    assert proc.returncode == 5, proc.stdout[-2000:]
    assert "corewire" not in "\n".join(_normalized(proc.stdout)) + proc.stderr
    assert not list(empty.iterdir())  # no report dir, nothing written


# ------------------------------------------------------------------ README's CI recipes


@dataclass(frozen=True)
class Recipe:
    steps: str  # the shell lines between the corewire-recipe markers, as bash runs them
    variables: dict[str, str]  # the COREWIRE_* defaults the recipe declares


def recipes() -> dict[str, Recipe]:
    """README's CI recipes, by CI system."""
    found: dict[str, Recipe] = {}
    for block in re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S):
        if RECIPE_BEGIN not in block:
            continue
        system = "github" if "runs-on:" in block else "gitlab" if "script:" in block else "?"
        body = block.split(RECIPE_BEGIN, 1)[1].split(RECIPE_END, 1)[0]
        lines = [line.strip() for line in body.strip().splitlines()]
        steps = "\n".join(line[2:] if line.startswith("- ") else line for line in lines if line)
        variables = dict(re.findall(r'^\s+(COREWIRE_\w+): "(.*)"$', block, re.M))
        found[system] = Recipe(steps, variables)
    return found


def test_both_recipes_are_found_and_install_a_package() -> None:
    found = recipes()
    assert sorted(found) == ["github", "gitlab"]
    for recipe in found.values():
        assert 'pip install "$COREWIRE_SPEC"' in recipe.steps
        assert "corewire run" in recipe.steps
        # Not inside corewire's checkout: no make, no checkout venv.
        assert "make " not in recipe.steps and ".venv/" not in recipe.steps
        assert set(recipe.variables) == {"COREWIRE_SPEC", "COREWIRE_FRONTEND", "COREWIRE_ARGS"}
        assert recipe.variables["COREWIRE_FRONTEND"] == "subprocess:python driver.py"


@pytest.mark.package
@pytest.mark.timeout(INSTALLED_TEST_TIMEOUT)
@pytest.mark.parametrize("system", ["github", "gitlab"])
def test_the_ci_recipe_gates_a_port_from_its_own_repository(installed: Installed,
                                                            tmp_path: Path,
                                                            system: str) -> None:
    """The recipe's shell steps, as the CI would run them in the port's checkout (a
    directory holding the example port's driver.py), installing the wheel built from this
    checkout (COREWIRE_SPEC) and running the recipe's own COREWIRE_FRONTEND."""
    recipe = recipes()[system]
    frontend = recipe.variables["COREWIRE_FRONTEND"]
    shutil.copy(EXAMPLE_PORT, tmp_path / "driver.py")
    env = {**installed.env(), "COREWIRE_SPEC": str(installed.wheel),
           "COREWIRE_FRONTEND": frontend, "COREWIRE_ARGS": "-k abort.drop.single -n 0"}
    proc = subprocess.run(["bash", "-eu", "-o", "pipefail", "-c", recipe.steps], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    _check(proc, f"the {system} recipe")
    report_dir = tmp_path / "corewire-reports"
    assert (report_dir / "junit.xml").is_file()
    rows = _results(report_dir)
    assert rows and {r["verdict"] for r in rows} == {"PASS"}, rows
    assert len({r["frontend"] for r in rows}) == 1
