"""How the vllm-py driver reports what vLLM raises and logs, for grading and diagnostics.

vLLM's exceptions often carry no text of their own (EngineGenerateError and friends), so
`_describe` adds the cause; `_LogTail` keeps the last vLLM log records for a case's
diagnostics. Both live apart from the driver (driver.py), which only uses them.
"""

from __future__ import annotations

import logging
from collections import deque

LOG_LINES = 60  # vLLM log records kept for diagnostics()


def _describe(exc: BaseException) -> str:
    """`Type: message`, plus the cause (EngineGenerateError and friends carry no text)."""
    text = f"{type(exc).__name__}: {exc}".rstrip(": ")
    cause = exc.__cause__ or exc.__context__
    if cause is not None and not str(exc):
        text += f" (from {type(cause).__name__}: {cause})"
    return text


class _LogTail(logging.Handler):
    """Keeps the last vLLM log records (with exception text) for diagnostics()."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: deque[str] = deque(maxlen=LOG_LINES)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:
            text = str(record.msg)
        if record.exc_info and record.exc_info[1] is not None:
            text += f" [{_describe(record.exc_info[1])}]"
        self.lines.append(f"{record.levelname} {record.name}: {text}")
