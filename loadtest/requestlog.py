"""One line per request, written by the locustfile when the REQUEST_LOG variable (loadtest.env) names a file.

Locust's own results are totals and per-second aggregates; a chaos run needs each request's
time and outcome to tell which fault a failure followed. A line is tab-separated:
start (unix s), response time (ms), HTTP status (0: no answer, e.g. refused or timed out),
failed (0/1), reason (failures only: the answer's body or the client error, one line, truncated)
and, on a client error only, a sixth field: its class (`error_class`).

A client error is a request the client gave up on without a whole HTTP answer, classed by what the
client raised, its errno first:
  reset    ECONNRESET, EPIPE, ECONNABORTED, or the connection closed before the answer's end
           (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected,
           geventhttpclient's HTTPConnectionClosed and EmptyResponse)
  refused  ECONNREFUSED: nothing listening, or the listen backlog full
  timeout  the client's own timeout (socket.timeout / TimeoutError, ETIMEDOUT, gevent.Timeout)
  other    anything else (a malformed answer, ...)
locust's FastHttpUser (geventhttpclient) wraps some of them (RetriesExceeded, whose `original` is
the error): the chain (`original`, `__cause__`, `__context__`) is followed. A log line without the
class (an older log, or a client that said only a text) is classed by its reason's words.
Kept free of locust: importing locust monkey-patches the process.
"""
from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

REASON_CHARS = 160
ERROR_CLASSES = ("reset", "refused", "timeout", "other")
RESET_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})
# Closed before a whole answer: geventhttpclient's and http.client's names for it.
RESET_TYPES = frozenset({"HTTPConnectionClosed", "EmptyResponse", "RemoteDisconnected", "IncompleteRead"})
TIMEOUT_TYPES = frozenset({"Timeout", "timeout", "ReadTimeout", "ConnectTimeout", "ReadTimeoutError"})
# The words of a reason, for lines without a class: first match wins.
REASON_WORDS = (("refused", ("refused",)),
                ("timeout", ("timed out", "timeout")),
                ("reset", ("reset", "broken pipe", "connection closed", "closed connection", "remote end closed",
                           "disconnected", "empty response", "aborted")))


@dataclass(frozen=True)
class RequestRecord:
    start: float  # unix seconds, when the request was sent
    response_ms: float
    status: int  # 0: no HTTP answer
    failed: bool
    reason: str = ""
    error: str = ""  # a client error's class (ERROR_CLASSES); "": none recorded

    @property
    def end(self) -> float:
        """Unix seconds when the answer (or the error) arrived."""
        return self.start + self.response_ms / 1e3

    @property
    def client_error(self) -> str:
        """This request's client error class, "" when it got a whole HTTP answer: the recorded
        class, or for no answer (status 0) without one, its reason's words' (`reason_class`)."""
        return self.error or (reason_class(self.reason) if self.status == 0 else "")


def _chain(exc: BaseException | None, limit: int = 8):
    """exc, then what it wraps: geventhttpclient's `original`, the cause, the context."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < limit:
        seen.add(id(exc))
        yield exc
        inner = getattr(exc, "original", None)
        exc = inner if isinstance(inner, BaseException) else (exc.__cause__ or exc.__context__)


def _class_of(exc: BaseException) -> str | None:
    if isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED:
        return "refused"
    if isinstance(exc, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)) \
            or getattr(exc, "errno", None) in RESET_ERRNOS or type(exc).__name__ in RESET_TYPES:
        return "reset"
    if isinstance(exc, TimeoutError) or getattr(exc, "errno", None) == errno.ETIMEDOUT \
            or type(exc).__name__ in TIMEOUT_TYPES:
        return "timeout"
    return None


def error_class(exc: BaseException | None) -> str:
    """The class of a client error (ERROR_CLASSES) from what the client raised: by errno and type
    along the chain of wrapped errors, else by its words; "" for no error."""
    if exc is None:
        return ""
    for inner in _chain(exc):
        found = _class_of(inner)
        if found:
            return found
    return reason_class(" ".join(str(inner) for inner in _chain(exc)))


def reason_class(reason: str) -> str:
    """A client error's class from its text alone: "other" when no word says."""
    text = reason.lower()
    return next((name for name, words in REASON_WORDS if any(word in text for word in words)), "other")


def one_line(text: str, limit: int = REASON_CHARS) -> str:
    """Whitespace (tabs and newlines included) collapsed, cut to `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def format_record(record: RequestRecord) -> str:
    """One line: five fields, and a sixth, the error class, on a client error only."""
    return (f"{record.start:.6f}\t{record.response_ms:.3f}\t{record.status}\t{int(record.failed)}\t"
            f"{one_line(record.reason) if record.failed else ''}"
            + (f"\t{record.error}" if record.error else "") + "\n")


def parse_line(line: str) -> RequestRecord | None:
    """The record on one line; None for a line cut short (the writer was killed mid-line)."""
    parts = line.rstrip("\n").split("\t")
    if len(parts) not in (5, 6) or (len(parts) == 6 and parts[5] not in ERROR_CLASSES):
        return None
    try:
        return RequestRecord(float(parts[0]), float(parts[1]), int(parts[2]), parts[3] == "1", parts[4],
                             parts[5] if len(parts) == 6 else "")
    except ValueError:
        return None


def read_request_log(path: Path) -> list[RequestRecord]:
    """Every complete record in the file, in the order written ([] when there is no file)."""
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [record for record in map(parse_line, text.splitlines()) if record is not None]
