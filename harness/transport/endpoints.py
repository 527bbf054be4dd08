"""Private endpoints: ipc paths in a 0700 temp dir per owner, so parallel workers never collide."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from types import TracebackType


class PrivateIpcDir:
    """A 0700 temp directory that hands out `ipc://` addresses and removes itself.

    Paths stay short (unix socket paths are limited to ~107 bytes).
    """

    live: set[str] = set()  # every directory not yet cleaned up (for leak checks)

    def __init__(self, prefix: str = "cw-") -> None:
        self.path = tempfile.mkdtemp(prefix=prefix)
        os.chmod(self.path, 0o700)
        PrivateIpcDir.live.add(self.path)

    def path_for(self, name: str) -> str:
        """A fresh filesystem path inside the directory (for raw unix listeners too)."""
        return os.path.join(self.path, f"{name}-{uuid.uuid4().hex[:8]}")

    def address(self, name: str) -> str:
        return "ipc://" + self.path_for(name)

    def cleanup(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        PrivateIpcDir.live.discard(self.path)

    def __enter__(self) -> PrivateIpcDir:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()
