"""Fetch the Rust frontend binary (`vllm/vllm-rs`) of any vLLM release, without the wheel.

A vLLM wheel is 260-340 MB; the binary inside is 12-22 MB compressed. We read only what we
need by HTTP range requests: the zip's tail (end of central directory, ZIP64 records when
present), the central directory, then the one member's local header and deflated bytes, which
are inflated as they arrive and checked against the central directory's CRC-32 and size. The
result is cached per release (atomic rename), so a second call costs one `stat`.

Stdlib only; nothing here imports vllm. Every failure is one of three typed errors with a
one-line message: no such release, a release without vllm-rs (0.20.x, 0.21.x), network.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import sys
import urllib.error
import urllib.parse
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

from harness.artefacts.vllm_dist import VllmArtifactError, _locked

PYPI = "https://pypi.org"
ENV_INDEX = "COREWIRE_PYPI"  # another JSON-API index (a mirror); tests point it at localhost
MEMBER = "vllm/vllm-rs"
NETWORK_TIMEOUT = 60.0  # seconds per HTTP request
CHUNK = 4 << 20  # bytes per range request while streaming the member
TAIL = 64 * 1024 + 22  # EOCD (22) + the longest zip comment
_WHEEL = re.compile(r"^vllm-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?-[^-]+-[^-]+-"
                    r"(?P<platform>[^-]+)\.whl$")

_EOCD = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_EOCD = b"PK\x06\x06"
_CENTRAL = b"PK\x01\x02"
_LOCAL = b"PK\x03\x04"


class ReleaseFetchError(VllmArtifactError):
    """The binary of a release could not be had (the subclass says why)."""


class NoSuchRelease(ReleaseFetchError):
    """The index has no such vLLM release (or no x86_64 manylinux wheel of it)."""


class NoRustFrontend(ReleaseFetchError):
    """The release's wheel ships no `vllm/vllm-rs` (0.20.x and 0.21.x)."""


class FetchNetworkError(ReleaseFetchError):
    """The index or the wheel could not be read over the network."""


class BadWheel(ReleaseFetchError):
    """The wheel's zip structures or the member's bytes are not what they claim."""


@dataclass(frozen=True)
class ZipEntry:
    """One central-directory record: what a member claims to be and where it lies."""

    name: str
    method: int
    crc32: int
    compressed_size: int
    size: int
    local_header_offset: int


def cache_root() -> Path:
    """`$COREWIRE_CACHE`, else `${XDG_CACHE_HOME:-~/.cache}/corewire`."""
    explicit = os.environ.get("COREWIRE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "corewire"


def cached_binary_path(version: str) -> Path:
    return cache_root() / "vllm-rs" / version / "vllm-rs"


# ---------------------------------------------------------------------- HTTP


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One GET: (status, lower-cased headers, body); 4xx/5xx come back, not raised."""
    request = urllib.request.Request(url, headers={"User-Agent": "corewire", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=NETWORK_TIMEOUT) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, b""
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FetchNetworkError(f"cannot reach {url}: {reason}") from None


class RangeReader:
    """Random access to a remote file by `Range: bytes=a-b` requests (206 required)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.size = -1

    def tail(self, length: int) -> bytes:
        """The last `length` bytes (fewer if the file is shorter); learns the file size."""
        status, headers, body = _get(self.url, {"Range": f"bytes=-{length}"})
        self._check(status, 0, len(body))
        match = re.match(r"bytes \d+-\d+/(\d+)", headers.get("content-range", ""))
        if not match:
            raise FetchNetworkError(f"{self.url}: range answer without a total size "
                                    f"(Content-Range {headers.get('content-range')!r})")
        self.size = int(match.group(1))
        return body

    def read(self, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        status, _, body = _get(self.url, {"Range": f"bytes={offset}-{offset + length - 1}"})
        self._check(status, length, len(body))
        return body

    def _check(self, status: int, wanted: int, got: int) -> None:
        if status == 200:
            raise FetchNetworkError(f"{self.url}: the server ignores range requests (200)")
        if status != 206:
            raise FetchNetworkError(f"{self.url}: HTTP {status} to a range request")
        if wanted and got != wanted:
            raise FetchNetworkError(f"{self.url}: asked for {wanted} bytes, got {got}")


# ---------------------------------------------------------------------- the index


def _release_files(version: str, index: str) -> tuple[str, list[dict[str, object]]]:
    """(base URL the file URLs are relative to, the release's file records)."""
    url = f"{index}/pypi/vllm/{version}/json"
    status, _, body = _get(url)
    if status == 404:  # some mirrors serve only the project document
        url = f"{index}/pypi/vllm/json"
        status, _, body = _get(url)
        if status == 200:
            releases = _json(url, body).get("releases")
            if not isinstance(releases, dict) or version not in releases:
                raise NoSuchRelease(f"vllm {version} is not a release on {index}")
            return url, _records(releases[version])
    if status == 404:
        raise NoSuchRelease(f"vllm {version} is not a release on {index}")
    if status != 200:
        raise FetchNetworkError(f"{url}: HTTP {status}")
    return url, _records(_json(url, body).get("urls"))


def _records(value: object) -> list[dict[str, object]]:
    """The file records of a release document (anything malformed is skipped)."""
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def _json(url: str, body: bytes) -> dict[str, object]:
    try:
        doc = json.loads(body)
    except ValueError:
        raise FetchNetworkError(f"{url}: answer is not JSON") from None
    if not isinstance(doc, dict):
        raise FetchNetworkError(f"{url}: answer is not a JSON object")
    return doc


def wheel_url(version: str, index: str | None = None) -> str:
    """The x86_64 manylinux wheel of `version` (highest build tag, as pip would pick)."""
    index = (index or os.environ.get(ENV_INDEX) or PYPI).rstrip("/")
    base, files = _release_files(version, index)
    best: tuple[int, str] | None = None
    for record in files:
        name, url = record.get("filename"), record.get("url")
        if not isinstance(name, str) or not isinstance(url, str):
            continue
        match = _WHEEL.match(name)
        if not match or match["version"] != version:
            continue
        if not match["platform"].startswith("manylinux") or "x86_64" not in match["platform"]:
            continue
        build = int(re.match(r"\d+", match["build"] or "0").group())  # type: ignore[union-attr]
        if best is None or build > best[0]:
            best = (build, urllib.parse.urljoin(base, url))
    if best is None:
        raise NoSuchRelease(f"vllm {version} has no x86_64 manylinux wheel on {index}")
    return best[1]


# ---------------------------------------------------------------------- the zip


def central_directory(reader: RangeReader) -> list[ZipEntry]:
    """Every central-directory record, read from the zip's tail (ZIP64 aware)."""
    tail = reader.tail(TAIL)
    tail_start = reader.size - len(tail)
    at = tail.rfind(_EOCD)
    if at < 0 or len(tail) - at < 22:
        raise BadWheel(f"{reader.url}: no end-of-central-directory record")
    (_, _, _, _, count, cd_size, cd_offset, _) = struct.unpack("<4sHHHHIIH", tail[at:at + 22])
    if count == 0xFFFF or 0xFFFFFFFF in (cd_size, cd_offset):
        loc = tail[at - 20:at] if at >= 20 else b""
        if not loc.startswith(_ZIP64_LOCATOR):
            raise BadWheel(f"{reader.url}: ZIP64 fields without a ZIP64 locator")
        (record_offset,) = struct.unpack("<Q", loc[8:16])
        record = reader.read(record_offset, 56)
        if not record.startswith(_ZIP64_EOCD):
            raise BadWheel(f"{reader.url}: bad ZIP64 end-of-central-directory record")
        count, cd_size, cd_offset = struct.unpack("<QQQ", record[32:56])
    if cd_offset >= tail_start:
        directory = tail[cd_offset - tail_start:cd_offset - tail_start + cd_size]
    else:
        directory = reader.read(cd_offset, cd_size)
    return _parse_directory(directory, count, reader.url)


def _parse_directory(data: bytes, count: int, url: str) -> list[ZipEntry]:
    entries: list[ZipEntry] = []
    pos = 0
    for _ in range(count):
        if data[pos:pos + 4] != _CENTRAL or len(data) < pos + 46:
            raise BadWheel(f"{url}: central directory record {len(entries)} is damaged")
        (method, _, _, crc, csize, usize, nlen, xlen, clen, _, _, _,
         offset) = struct.unpack("<HHHIIIHHHHHII", data[pos + 10:pos + 46])
        name = data[pos + 46:pos + 46 + nlen].decode("utf-8", "replace")
        extra = data[pos + 46 + nlen:pos + 46 + nlen + xlen]
        usize, csize, offset = _zip64_sizes(extra, usize, csize, offset)
        entries.append(ZipEntry(name, method, crc, csize, usize, offset))
        pos += 46 + nlen + xlen + clen
    return entries


def _zip64_sizes(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    """Replace 0xFFFFFFFF fields by the ZIP64 extra field's 8-byte values, in order."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, size = struct.unpack("<HH", extra[pos:pos + 4])
        if tag == 0x0001:
            values = list(struct.unpack(f"<{size // 8}Q", extra[pos + 4:pos + 4 + size // 8 * 8]))
            fields = [usize, csize, offset]
            for i, value in enumerate(fields):
                if value == 0xFFFFFFFF and values:
                    fields[i] = values.pop(0)
            return fields[0], fields[1], fields[2]
        pos += 4 + size
    return usize, csize, offset


def extract_member(reader: RangeReader, entry: ZipEntry, target: Path) -> None:
    """Stream `entry` into `target` (inflating raw deflate), then check size and CRC-32."""
    header = reader.read(entry.local_header_offset, 30)
    if not header.startswith(_LOCAL):
        raise BadWheel(f"{reader.url}: no local header for {entry.name}")
    nlen, xlen = struct.unpack("<HH", header[26:30])
    start = entry.local_header_offset + 30 + nlen + xlen
    if entry.method == 8:
        inflater = zlib.decompressobj(-15)
    elif entry.method != 0:
        raise BadWheel(f"{reader.url}: {entry.name} uses compression method {entry.method}")
    crc, written = 0, 0
    with open(target, "wb") as out:
        for offset in range(0, entry.compressed_size, CHUNK):
            raw = reader.read(start + offset, min(CHUNK, entry.compressed_size - offset))
            try:
                data = inflater.decompress(raw) if entry.method == 8 else raw
            except zlib.error as exc:
                raise BadWheel(f"{reader.url}: {entry.name} does not inflate: {exc}") from None
            crc, written = zlib.crc32(data, crc), written + len(data)
            out.write(data)
        if entry.method == 8:
            rest = inflater.flush()
            crc, written = zlib.crc32(rest, crc), written + len(rest)
            out.write(rest)
    if written != entry.size:
        raise BadWheel(f"{reader.url}: {entry.name} inflated to {written} bytes, the central "
                       f"directory says {entry.size}")
    if crc != entry.crc32:
        raise BadWheel(f"{reader.url}: {entry.name} CRC-32 {crc:08x}, the central directory "
                       f"says {entry.crc32:08x}")


def fetch_member(url: str, member: str, target: Path, version: str = "?") -> None:
    """`member` of the zip at `url` into `target` atomically, executable."""
    reader = RangeReader(url)
    entries = {e.name: e for e in central_directory(reader)}
    entry = entries.get(member)
    if entry is None:
        raise NoRustFrontend(f"vllm {version} ships no Rust frontend ({member} is not in "
                             f"{url.rsplit('/', 1)[-1]}); vllm-rs exists from 0.22.0")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.parent / f".{target.name}.partial-{os.getpid()}"
    try:
        extract_member(reader, entry, partial)
        partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def release_binary(version: str, index: str | None = None) -> Path:
    """The `vllm-rs` binary of vLLM `version`, fetched once into the cache."""
    target = cached_binary_path(version)
    if target.is_file() and os.access(target, os.X_OK):
        return target
    with _locked(target.parent / ".lock"):
        if target.is_file() and os.access(target, os.X_OK):
            return target  # another process fetched it while we waited
        url = wheel_url(version, index)
        print(f"corewire: fetching {MEMBER} of vllm {version} by range requests "
              f"into {target.parent} (one time only)", file=sys.stderr, flush=True)
        fetch_member(url, MEMBER, target, version)
    return target


__all__ = ["BadWheel", "FetchNetworkError", "NoRustFrontend", "NoSuchRelease",
           "ReleaseFetchError", "RangeReader", "ZipEntry", "cache_root", "cached_binary_path",
           "central_directory", "extract_member", "fetch_member", "release_binary",
           "wheel_url"]
