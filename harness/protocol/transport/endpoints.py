"""Private endpoints: ipc paths in a 0700 temp dir per owner, so parallel workers never collide."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from types import TracebackType

from harness.hygiene import ownership


class PrivateIpcDir:
    """A 0700 temp directory that hands out `ipc://` addresses and removes itself.

    Paths stay short (unix socket paths are limited to ~107 bytes).
    """

    def __init__(self, prefix: str = "cw-") -> None:
        self.path = tempfile.mkdtemp(prefix=prefix)
        os.chmod(self.path, 0o700)
        ownership.LIVE_IPC_DIRS.add(self.path)
        ownership.record_dir(self.path)  # a later run removes it if this process dies

    def path_for(self, name: str) -> str:
        """A fresh filesystem path inside the directory (for raw unix listeners too)."""
        return os.path.join(self.path, f"{name}-{uuid.uuid4().hex[:8]}")

    def address(self, name: str) -> str:
        return "ipc://" + self.path_for(name)

    def cleanup(self) -> None:
        PrivateIpcDir.remove(self.path)

    @staticmethod
    def remove(path: str) -> None:
        """Remove one of the live dirs (also a backstop's way, after an interrupt)."""
        shutil.rmtree(path, ignore_errors=True)
        ownership.LIVE_IPC_DIRS.discard(path)
        ownership.forget_dir(path)

    def __enter__(self) -> PrivateIpcDir:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()


class ReservedTcpPort:
    """A loopback TCP port held for a listener another component binds later.

    Handing out a port that was merely free a moment ago (bind to 0, close) leaves a window
    in which anything else on the machine that binds port 0 (another xdist worker's frontend
    or mock engine, vLLM's DP coordinator binding `tcp://127.0.0.1:0`) may be given the same
    port; engines told to connect there then talk to a stranger. This keeps the port bound,
    with SO_REUSEADDR and never listening, until `release()`: the kernel hands it to no
    port-0 bind meanwhile, and the intended owner (ZMQ, Rust's std and tokio all set
    SO_REUSEADDR on listeners) can still bind and listen on it. Connections to it are refused
    until the owner listens, so connecting peers just retry.
    """

    live: set[int] = set()  # ports reserved and not yet released (for leak checks)

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, 0))
        except OSError:
            self._sock.close()
            raise
        self.port = int(self._sock.getsockname()[1])
        ReservedTcpPort.live.add(self.port)

    def release(self) -> None:
        """Stop holding the port (idempotent): once its owner listens, or when it never will."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            ReservedTcpPort.live.discard(self.port)

    def __enter__(self) -> ReservedTcpPort:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
