"""vLLM 0.33.0's own sources, read from its sdist, to check the grounds cases cite.

The sdist holds both implementations (`vllm/` and the Rust frontend under `rust/`). It is
downloaded once from PyPI into `<cache>/sdists/` (sha256 checked against the digest
fixtures/profiles/vllm-0.33.0.json recorded when the profile was generated) and read in
place: nothing is extracted, nothing of it is imported or committed.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
import urllib.request
from functools import lru_cache
from pathlib import Path

from harness.artefacts.vllm_dist import VllmArtifactError, _locked, cache_dir
from harness.cases.grounds import WINDOW, Cite
from harness.locations import fixture

PROFILE = fixture("profiles", "vllm-0.33.0.json")
PYPI_RELEASE_JSON = "https://pypi.org/pypi/vllm/{version}/json"
_SPACE = re.compile(r"\s+")


def _recorded_sdist() -> tuple[str, str, str]:
    """(version, filename, sha256) of the sdist the 0.33.0 profile was generated from."""
    data = json.loads(PROFILE.read_text())
    return data["vllm_version"], data["sdist"]["filename"], data["sdist"]["sha256"]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def sdist_path() -> Path:
    """The cached vLLM 0.33.0 sdist, downloaded from PyPI the first time (~47 MB)."""
    version, filename, sha256 = _recorded_sdist()
    target = cache_dir() / "sdists" / filename
    with _locked(target.parent / ".lock"):
        if target.exists() and _sha256(target) == sha256:
            return target
        try:
            with urllib.request.urlopen(PYPI_RELEASE_JSON.format(version=version),
                                        timeout=60) as resp:
                urls = [f["url"] for f in json.load(resp)["urls"] if f["filename"] == filename]
            if not urls:
                raise VllmArtifactError(f"PyPI lists no {filename}")
            part = target.with_suffix(".part")
            with urllib.request.urlopen(urls[0], timeout=600) as resp, part.open("wb") as out:
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
        except OSError as exc:
            raise VllmArtifactError(f"could not download {filename} from PyPI: {exc}") from exc
        if _sha256(part) != sha256:
            part.unlink()
            raise VllmArtifactError(f"{filename}: sha256 differs from the recorded {sha256}")
        part.rename(target)
    return target


class SourceTree:
    """The text files of one sdist, by path inside the release (read lazily, then kept)."""

    def __init__(self, sdist: Path) -> None:
        self._sdist = sdist
        self._files: dict[str, list[str]] | None = None

    def _load(self) -> dict[str, list[str]]:
        if self._files is None:
            files: dict[str, list[str]] = {}
            with tarfile.open(self._sdist, "r:gz") as tar:
                for member in tar:
                    if not member.isfile() or not member.name.endswith((".py", ".rs",
                                                                        ".proto")):
                        continue
                    rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
                    handle = tar.extractfile(member)
                    if handle is not None:
                        files[rel] = handle.read().decode("utf-8", "replace").splitlines()
            self._files = files
        return self._files

    def lines(self, path: str) -> list[str] | None:
        return self._load().get(path)

    def check(self, cite: Cite) -> str | None:
        """None when the snippet occurs within WINDOW lines of the cited line; else why not."""
        lines = self.lines(cite.path)
        if lines is None:
            return f"{cite.path}: no such file in the vLLM 0.33.0 sdist"
        if not 1 <= cite.line <= len(lines):
            return f"{cite.path}:{cite.line}: the file has {len(lines)} lines"
        want = _SPACE.sub(" ", cite.snippet).strip()
        lo, hi = max(1, cite.line - WINDOW), min(len(lines), cite.line + WINDOW)
        for number in range(lo, hi + 1):
            if want in _SPACE.sub(" ", lines[number - 1]):
                return None
        where = [n for n, text in enumerate(lines, 1) if want in _SPACE.sub(" ", text)]
        hint = f" (it is at line {', '.join(map(str, where[:5]))})" if where else \
            " (nowhere in the file)"
        return f"{cite.path}:{cite.line}: `{cite.snippet}` is not within {WINDOW} lines" + hint


@lru_cache(maxsize=1)
def vllm_0_33_sources() -> SourceTree:
    return SourceTree(sdist_path())
