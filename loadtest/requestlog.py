"""One line per request, written by the locustfile when the REQUEST_LOG variable (loadtest.env) names a file.

Locust's own results are totals and per-second aggregates; a chaos run needs each request's
time and outcome to tell which fault a failure followed. A line is tab-separated:
start (unix s), response time (ms), HTTP status (0: no answer, e.g. refused or timed out),
failed (0/1), reason (failures only: the answer's body or the client error, one line, truncated).
Kept free of locust: importing locust monkey-patches the process.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REASON_CHARS = 160


@dataclass(frozen=True)
class RequestRecord:
    start: float  # unix seconds, when the request was sent
    response_ms: float
    status: int  # 0: no HTTP answer
    failed: bool
    reason: str = ""

    @property
    def end(self) -> float:
        """Unix seconds when the answer (or the error) arrived."""
        return self.start + self.response_ms / 1e3


def one_line(text: str, limit: int = REASON_CHARS) -> str:
    """Whitespace (tabs and newlines included) collapsed, cut to `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def format_record(record: RequestRecord) -> str:
    return (f"{record.start:.6f}\t{record.response_ms:.3f}\t{record.status}\t{int(record.failed)}\t"
            f"{one_line(record.reason) if record.failed else ''}\n")


def parse_line(line: str) -> RequestRecord | None:
    """The record on one line; None for a line cut short (the writer was killed mid-line)."""
    parts = line.rstrip("\n").split("\t")
    if len(parts) != 5:
        return None
    try:
        return RequestRecord(float(parts[0]), float(parts[1]), int(parts[2]), parts[3] == "1", parts[4])
    except ValueError:
        return None


def read_request_log(path: Path) -> list[RequestRecord]:
    """Every complete record in the file, in the order written ([] when there is no file)."""
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [record for record in map(parse_line, text.splitlines()) if record is not None]
