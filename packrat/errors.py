"""The errors the layers share: a refused request (an HTTP status and a one-line reason), and each
stage's failure (a profile file, a measurement, a plan, the pool, TorchServe). Imports nothing of packrat."""

from __future__ import annotations

import json

REASON_CHARS = 200  # a reason quotes at most this much of an exception message


class RequestError(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def error_body(reason: str) -> bytes:
    """The JSON body every front end answers a refused or failed request with."""
    return json.dumps({"error": reason}).encode()


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (at most REASON_CHARS), else its type's name."""
    lines = str(exc).strip().splitlines()
    return lines[0][:REASON_CHARS] if lines else type(exc).__name__


LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}  # str.splitlines()'s


def one_line(reason: str) -> str:
    """A reason on one line: its line breaks (a client's own names quoted in it may hold them) as escapes."""
    return reason.translate(LINE_BREAKS)


class ServeError(RuntimeError):
    """TorchServe could not be started, or did not become ready."""


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the problem."""


class NoPlanError(ValueError):
    """No multiset of profiled points covers the batch within the threads."""


class PoolError(RuntimeError):
    """An instance could not start, or the pool is closed."""


class ProfilingError(RuntimeError):
    """A measurement process failed; the message says which point and why."""


class MoveFailed(RuntimeError):
    """A model could not move to the cores the node gave it; it serves where it was."""
