"""A refused request: an HTTP status and a one-line reason (shared by the codec and its readers)."""

from __future__ import annotations

REASON_CHARS = 200  # a reason quotes at most this much of an exception message


class RequestError(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (at most REASON_CHARS), else its type's name."""
    lines = str(exc).strip().splitlines()
    return lines[0][:REASON_CHARS] if lines else type(exc).__name__
