"""Users and what they met: how many a run has (B, 2B, 4 or an open loop's for a rate), a load run with
every request logged (or against an in-process engine), locust runs pooled, records counted by status,
client error, percentile and rate. Light: locust comes with a load; records need .start, .end,
.response_ms, .status and .client_error."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packrat.loadtest import LoadResult
    from packrat.loadtest.requestlog import RequestRecord

ERROR_CLASSES = ("reset", "refused", "timeout", "other")  # packrat.loadtest.requestlog's, kept light here
MAIN_STATUSES = ("200", "503", "504")
PACE_SLACK_S = 1.0  # open-loop users: rate × (deadline + this)


@dataclass(frozen=True)
class UsersPattern:
    """Locust users as a multiple of TorchServe's batch size B ("B", "2B") or a fixed count ("4")."""

    count: int
    per_batch: bool

    def users(self, batch: int) -> int:
        return self.count * batch if self.per_batch else self.count

    def __str__(self) -> str:
        if not self.per_batch:
            return str(self.count)
        return "B" if self.count == 1 else f"{self.count}B"


BATCH_USERS = UsersPattern(1, True)  # the default: enough requests in flight to fill each batch
_USERS_RE = re.compile(r"^(\d*)([bB]?)$")


def parse_users(text: str) -> list[UsersPattern]:
    """"B,2B,4" -> patterns, in order, duplicates dropped; ValueError on anything else."""
    patterns: list[UsersPattern] = []
    for part in text.split(","):
        match = _USERS_RE.match(part.strip())
        if not match or not (match[1] or match[2]):
            raise ValueError(f"{part.strip()!r} is not a users pattern like 4, B or 2B")
        count = int(match[1] or 1)
        if count < 1:
            raise ValueError(f"{part.strip()!r}: users must be >= 1")
        pattern = UsersPattern(count, bool(match[2]))
        if pattern not in patterns:
            patterns.append(pattern)
    return patterns


def users_for_batch(patterns: Sequence[UsersPattern | int], batch: int) -> list[tuple[int, str]]:
    """(users, pattern text) per pattern for this batch size; a count reached twice runs once."""
    runs: list[tuple[int, str]] = []
    for pattern in patterns:
        if isinstance(pattern, int):
            pattern = UsersPattern(pattern, False)
        if pattern.users(batch) not in [users for users, _ in runs]:
            runs.append((pattern.users(batch), str(pattern)))
    return runs


def open_loop_users(rate_rps: float, request_timeout_s: float, batch: int) -> int:
    """Users enough to send `rate_rps` with each answer taking the deadline and a second; at least B."""
    return max(batch, math.ceil(rate_rps * (request_timeout_s + PACE_SLACK_S)))


class EngineUsers:
    """In a with block, `users` closed-loop threads submitting `body` to an in-process engine as a front end
    does: `latencies_ms` of every answer, `failures` (not 200)."""

    def __init__(self, engine, users: int, body: tuple[bytes, str]):
        import threading

        self.engine, self.body = engine, body
        self.latencies_ms: list[float] = []
        self.failures = 0
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._threads = [threading.Thread(target=self._user, daemon=True) for _ in range(users)]

    def _user(self) -> None:
        import time

        from packrat.serving.pool.api import Request

        while not self._stop.is_set():
            started = time.perf_counter()
            self.engine.arrive()
            answer = self.engine.submit(Request(*self.body)).result()
            with self._lock:
                self.latencies_ms.append((time.perf_counter() - started) * 1e3)
                self.failures += not answer.ok

    def __enter__(self) -> EngineUsers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


def logged_load(url: str, model: str, users: int, seconds: float, where: Path, log: Path | None = None,
                **locust) -> list[RequestRecord]:
    """One locust run (`locust`: run_locust's other keywords), every request logged (`log`) and waited for."""
    from packrat.loadtest import run_locust
    from packrat.loadtest.requestlog import read_request_log

    log = log or where / "requests.tsv"
    run_locust(url, model, users, seconds, where, request_log=log, **locust)
    return read_request_log(log)


def pooled(results: Sequence[LoadResult], run_s: float) -> LoadResult:
    """Runs of `run_s` s as one: percentiles from summed histograms, answers per second of load (locust's rate
    overstates a run of few batches)."""
    from packrat.loadtest import LoadResult, percentile

    histogram: dict[float, int] = {}
    for result in results:
        for latency, count in result.response_times.items():
            histogram[latency] = histogram.get(latency, 0) + count
    timed = [sum(r.response_times.values()) for r in results]
    requests = sum(r.requests for r in results)
    seconds = len(results) * max(1, math.ceil(run_s))  # locust runs whole seconds
    return LoadResult(
        requests=requests, failures=sum(r.failures for r in results),
        p50_ms=percentile(histogram, 0.50), p95_ms=percentile(histogram, 0.95), p99_ms=percentile(histogram, 0.99),
        mean_ms=sum(r.mean_ms * n for r, n in zip(results, timed) if n) / sum(timed) if sum(timed) else math.nan,
        throughput_rps=requests / seconds, duration_s=seconds,
        start_time=min((r.start_time for r in results if r.start_time is not None), default=None),
        response_times=dict(sorted(histogram.items())), history=[row for r in results for row in r.history])


# ---- the records, counted ------------------------------------------------------------------------

def percentile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank q-quantile (0 < q ≤ 1) of `values`; None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def latencies(records: Iterable[RequestRecord], status: int) -> list[float]:
    return [r.response_ms for r in records if r.status == status and not r.client_error]


def by_status(records: Iterable[RequestRecord], failed_only: bool = False) -> dict[str, int]:
    """Requests (the failed ones only, with `failed_only`) by HTTP status ("0": no answer), commonest first."""
    return dict(Counter(str(r.status) for r in records if r.failed or not failed_only).most_common())


def status_classes(records: Iterable[RequestRecord]) -> dict:
    """Requests by outcome: "200", "503", "504", "other" status, "client_error" (no whole answer) and "errors"
    of those by class (reset, refused, timeout, other)."""
    counts: Counter = Counter()
    errors: Counter = Counter()
    for record in records:
        error = record.client_error
        if error:
            errors[error] += 1
        else:
            counts[str(record.status) if str(record.status) in MAIN_STATUSES else "other"] += 1
    return {**{status: counts[status] for status in MAIN_STATUSES}, "other": counts["other"],
            "client_error": sum(errors.values()),
            "errors": {name: errors[name] for name in ERROR_CLASSES if errors[name]}}


def answered(counts: Mapping) -> int:
    """Requests with a whole HTTP answer (of status_classes' counts)."""
    return sum(counts[s] for s in MAIN_STATUSES) + counts["other"]


def admitted(counts: Mapping) -> int:
    """Requests the server did not refuse 503: 200, 504, any other status and client errors."""
    return counts["200"] + counts["504"] + counts["other"] + counts["client_error"]


def share_504(counts: Mapping) -> float | None:
    """504s over the admitted; None when nothing was admitted."""
    taken = admitted(counts)
    return counts["504"] / taken if taken else None


def fmt_errors(counts: Mapping) -> str:
    """Client errors with their classes: "3 (reset 2, timeout 1)"; "0" for none."""
    errors = counts.get("errors") or {}
    return f"{counts['client_error']}" + (f" ({', '.join(f'{k} {v}' for k, v in errors.items())})" if errors else "")


def run_seconds(duration_s: float) -> int:
    """A phase's length as locust runs it: whole seconds, at least one."""
    return max(1, math.ceil(duration_s))


def answered_within(records: Sequence[RequestRecord], seconds: float, status: int = 200) -> int:
    """Answers of `status` that arrived within `seconds` of the first request's start."""
    if not records:
        return 0
    t0 = min(r.start for r in records)
    return sum(r.status == status and not r.client_error and r.end <= t0 + seconds for r in records)


def sent_within(records: Sequence[RequestRecord], seconds: float) -> int:
    """Requests sent within `seconds` of the first one's start."""
    if not records:
        return 0
    t0 = min(r.start for r in records)
    return sum(r.start <= t0 + seconds for r in records)


def in_windows(record: RequestRecord, windows: Sequence[tuple[float, float]]) -> bool:
    """Whether the request was in flight during, or sent within, any (start, end) window."""
    return any(record.start <= end and record.end >= start for start, end in windows)
