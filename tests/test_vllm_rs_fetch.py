"""The vllm-rs fetcher reads one member of a remote wheel by range requests: here against small
zips served from a local http.server that honours Range (no internet)."""

from __future__ import annotations

import http.server
import io
import json
import os
import struct
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.frontends.vllm_rs import fetch

BINARY = bytes(range(256)) * 4096 + b"#!corewire test binary\n"  # ~1 MB, compresses well


def wheel_bytes(members: dict[str, bytes], *, stored: bool = False) -> bytes:
    buf = io.BytesIO()
    method = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(buf, "w", method) as zf:
        zf.writestr("vllm/__init__.py", b"# vllm\n")
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr("vllm-0.0.0.dist-info/RECORD", b"")
    return buf.getvalue()


class Index:
    """Files by path; a PyPI-like JSON API for the releases in `releases`."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.releases: dict[str, list[str]] = {}
        self.per_version_json = True  # False: only /pypi/vllm/json (a mirror)
        self.ranges = True  # False: the server ignores Range
        self.requests: list[str] = []

    def add_release(self, version: str, filename: str, data: bytes) -> None:
        self.files[f"/packages/{filename}"] = data
        self.releases.setdefault(version, []).append(filename)

    def document(self, path: str) -> bytes | None:
        def records(version: str) -> list[dict[str, object]]:
            return [{"filename": f, "url": f"../../packages/{f}"}
                    for f in self.releases[version]]
        if path == "/pypi/vllm/json":
            return json.dumps({"releases": {v: records(v) for v in self.releases}}).encode()
        parts = path.strip("/").split("/")
        if (self.per_version_json and len(parts) == 4 and parts[:2] == ["pypi", "vllm"]
                and parts[3] == "json" and parts[2] in self.releases):
            # relative to /pypi/vllm/X/json: one more level up
            body = {"urls": [{"filename": f, "url": f"../../../packages/{f}"}
                             for f in self.releases[parts[2]]]}
            return json.dumps(body).encode()
        return None


def serve(index: Index) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            index.requests.append(f"{self.path} {self.headers.get('Range', '')}")
            doc = index.document(self.path)
            if doc is not None:
                return self._send(200, doc)
            data = index.files.get(self.path)
            if data is None:
                return self._send(404, b"")
            spec = self.headers.get("Range")
            if not spec or not index.ranges:
                return self._send(200, data)
            first, last = spec.removeprefix("bytes=").split("-")
            if first == "":
                start, end = max(0, len(data) - int(last)), len(data) - 1
            else:
                start, end = int(first), min(int(last), len(data) - 1)
            self._send(206, data[start:end + 1],
                       {"Content-Range": f"bytes {start}-{end}/{len(data)}"})

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None
                  ) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Index]:
    idx = Index()
    idx.add_release("0.22.1", "vllm-0.22.1-cp38-abi3-manylinux_2_28_x86_64.whl",
                    wheel_bytes({"vllm/vllm-rs": BINARY}))
    idx.add_release("0.22.1", "vllm-0.22.1-cp38-abi3-manylinux_2_28_aarch64.whl",
                    wheel_bytes({"vllm/vllm-rs": b"wrong arch"}))
    idx.add_release("0.21.0", "vllm-0.21.0-cp38-abi3-manylinux_2_24_x86_64.whl",
                    wheel_bytes({}))
    idx.add_release("0.23.0", "vllm-0.23.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                    wheel_bytes({"vllm/vllm-rs": b"build 0"}, stored=True))
    idx.add_release("0.23.0", "vllm-0.23.0-2-cp38-abi3-manylinux_2_28_x86_64.whl",
                    wheel_bytes({"vllm/vllm-rs": b"build 2"}, stored=True))
    server, url = serve(idx)
    monkeypatch.setenv(fetch.ENV_INDEX, url)
    monkeypatch.setenv("COREWIRE_CACHE", str(tmp_path / "cache"))
    try:
        yield idx
    finally:
        server.shutdown()
        server.server_close()


def test_fetches_only_the_member_and_caches_it(index: Index, tmp_path: Path) -> None:
    path = fetch.release_binary("0.22.1")
    assert path == tmp_path / "cache" / "vllm-rs" / "0.22.1" / "vllm-rs"
    assert path.read_bytes() == BINARY
    assert os.access(path, os.X_OK)
    wheel_gets = [r for r in index.requests if r.startswith("/packages/")]
    assert wheel_gets and all(" bytes=" in r for r in wheel_gets)  # never the whole file
    assert not any(p.name.startswith(".") and "partial" in p.name for p in path.parent.iterdir())
    seen = len(index.requests)
    assert fetch.release_binary("0.22.1") == path  # a second call costs nothing
    assert len(index.requests) == seen


def test_picks_the_x86_64_wheel_with_the_highest_build(index: Index) -> None:
    assert fetch.release_binary("0.23.0").read_bytes() == b"build 2"


def test_mirror_without_per_version_documents(index: Index) -> None:
    index.per_version_json = False
    assert fetch.release_binary("0.22.1").read_bytes() == BINARY
    with pytest.raises(fetch.NoSuchRelease, match="vllm 9.9.9 is not a release"):
        fetch.wheel_url("9.9.9")


def test_no_such_release(index: Index) -> None:
    with pytest.raises(fetch.NoSuchRelease, match="vllm 9.9.9 is not a release"):
        fetch.release_binary("9.9.9")


def test_release_without_rust_frontend(index: Index, tmp_path: Path) -> None:
    with pytest.raises(fetch.NoRustFrontend, match="vllm 0.21.0 ships no Rust frontend"):
        fetch.release_binary("0.21.0")
    assert not (tmp_path / "cache" / "vllm-rs" / "0.21.0" / "vllm-rs").exists()


def test_network_failure_is_one_typed_line(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    with socket_closed_port() as port:
        monkeypatch.setenv(fetch.ENV_INDEX, f"http://127.0.0.1:{port}")
        monkeypatch.setenv("COREWIRE_CACHE", str(tmp_path))
        with pytest.raises(fetch.FetchNetworkError, match="cannot reach") as info:
            fetch.release_binary("0.22.1")
    assert "\n" not in str(info.value)


def test_server_ignoring_ranges_is_refused(index: Index) -> None:
    index.ranges = False
    with pytest.raises(fetch.FetchNetworkError, match="ignores range requests"):
        fetch.release_binary("0.22.1")


def test_crc_mismatch_is_refused_and_nothing_cached(index: Index, tmp_path: Path) -> None:
    name = "/packages/vllm-0.23.0-2-cp38-abi3-manylinux_2_28_x86_64.whl"
    index.files[name] = index.files[name].replace(b"build 2", b"build 3")  # stored bytes
    with pytest.raises(fetch.BadWheel, match="CRC-32"):
        fetch.release_binary("0.23.0")
    assert not (tmp_path / "cache" / "vllm-rs" / "0.23.0" / "vllm-rs").exists()


def test_truncated_member_is_refused(index: Index) -> None:
    """A central directory that claims more bytes than the member inflates to."""
    data = wheel_bytes({"vllm/vllm-rs": b"short"}, stored=True)
    at = data.find(b"vllm/vllm-rs", data.find(b"PK\x01\x02")) - 46  # its central record
    patched = bytearray(data)
    struct.pack_into("<I", patched, at + 24, 6)  # uncompressed size 5 -> 6
    index.files["/packages/vllm-0.22.1-cp38-abi3-manylinux_2_28_x86_64.whl"] = bytes(patched)
    with pytest.raises(fetch.BadWheel, match="inflated to 5 bytes"):
        fetch.release_binary("0.22.1")


def test_no_end_of_central_directory(index: Index) -> None:
    index.files["/packages/vllm-0.22.1-cp38-abi3-manylinux_2_28_x86_64.whl"] = b"x" * 5000
    with pytest.raises(fetch.BadWheel, match="no end-of-central-directory"):
        fetch.release_binary("0.22.1")


def test_zip64_end_records(index: Index) -> None:
    """65535+ members: the EOCD count saturates and the ZIP64 records say where to look."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for i in range(0xFFFF):
            zf.writestr(f"f/{i}", b"")
        zf.writestr("vllm/vllm-rs", BINARY)
    data = buf.getvalue()
    assert b"PK\x06\x06" in data[-200:]
    index.files["/packages/vllm-0.22.1-cp38-abi3-manylinux_2_28_x86_64.whl"] = data
    assert fetch.release_binary("0.22.1").read_bytes() == BINARY


def test_zip64_extra_field_replaces_saturated_sizes() -> None:
    extra = struct.pack("<HHQQQ", 0x0001, 24, 5_000_000_000, 4_000_000_000, 7_000_000_000)
    assert fetch._zip64_sizes(extra, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF) == (
        5_000_000_000, 4_000_000_000, 7_000_000_000)
    only_offset = struct.pack("<HHQ", 0x0001, 8, 7_000_000_000)
    assert fetch._zip64_sizes(only_offset, 10, 9, 0xFFFFFFFF) == (10, 9, 7_000_000_000)


class socket_closed_port:  # noqa: N801 (a context manager used like a function)
    """A loopback port nothing listens on."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        pass
