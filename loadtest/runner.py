"""Run the locustfile headless in a subprocess and read back exact results.

Counts and latencies come from locust's --json-file, written at shutdown with the final
stats (the --csv files are last written about a second before the end and undercount).
The per-second timeline comes from the --csv-full-history file.
"""
from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .env import (BODY_FILE, CONTENT_TYPE, HEADER_LENGTH, MODEL, RATE, REQUEST_LOG, REQUEST_PATH, RETRY_AFTER, SHAPE,
                  STEP_SECONDS, STEP_USERS, TIMEOUT_S, TOKEN)
from .histogram import percentile
from .steps import parse_steps, step_markers

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
OK_EXIT_CODES = (0, 1)  # 1 only says some requests failed; the JSON still counts them
HARD_LIMIT_SLACK_S = 60.0
STDERR_TAIL_LINES = 20


@dataclass(frozen=True)
class HistoryRow:
    """One line of locust's stats history, written about once a second."""

    timestamp: float  # unix seconds (whole seconds)
    users: int
    rps: float  # completed requests per second since the previous row
    p50_ms: float  # over about the last second (see locustfile), whole ms; NaN before any request
    p95_ms: float
    p99_ms: float
    failures_per_s: float  # failed requests per second since the previous row


@dataclass
class LoadResult:
    requests: int
    failures: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    throughput_rps: float
    duration_s: float  # span the throughput was measured over
    start_time: float | None = None  # unix time of the first completed request
    response_times: dict[float, int] = field(default_factory=dict)  # latency ms (3 digits) -> count
    history: list[HistoryRow] = field(default_factory=list)
    markers: list[tuple[float, str]] = field(default_factory=list)  # step starts, unix time


def run_locust(host: str, model: str, users: int, duration_s: float, out_dir: Path, *,
               payload: tuple[bytes, str], spawn_rate: float | None = None, token: str | None = None,
               shape: str = "steady", csv_prefix: str = "locust", timeout_s: float | None = None,
               env: Mapping[str, str] | None = None, request_log: Path | None = None,
               rate: float | None = None, stop_timeout_s: float | None = None, path: str | None = None,
               header_length: int | None = None, retry_after_s: float | None = None) -> LoadResult:
    """Load host's /predictions/{model} (or `path`) with closed-loop users (or open-loop ones: `rate`)
    and return the exact results.

    steady: `users` users (started at `spawn_rate`/s, default all at once) for `duration_s`
            (rounded up to whole seconds).
    step:   1 -> users -> 1 -> users, each for duration_s / 4, unless `env` sets
            STEP_USERS / STEP_SECONDS (loadtest.env).
    payload: (body, content type) of every request (packrat.codec.payloads.build_payload makes
             one for a model); written to OUT_DIR/request.body for the locust process.
    timeout_s is the client-side timeout per request (the locustfile's default is 60 s);
    the whole run is killed after its expected length (and stop_timeout_s) + 60 s.
    request_log: a file for one line per request (loadtest.requestlog), replaced if present.
    rate: open loop (steady only): the users send `rate` requests per second together, each paced at
          rate / users from a random start (the locustfile's env.RATE), whatever the answers take.
    stop_timeout_s: at the end, requests in flight are waited for up to this long (locust's
          --stop-timeout), so that each is logged with its answer; default: cut off.
    path: where the requests go instead, e.g. /v2/models/{model}/infer; header_length: a KServe v2
          binary body's JSON header length, sent as its Inference-Header-Content-Length.
    retry_after_s: closed loop: after a 503 with a Retry-After header, a user waits that long, at most
          this many seconds, before its next request (env.RETRY_AFTER); default: it sends again at once.
    """
    if rate is not None and (rate <= 0 or shape != "steady"):
        raise ValueError(f"an open-loop rate must be > 0 and with the steady shape, got {rate} with {shape}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = out_dir / csv_prefix
    json_path, history_path = Path(f"{prefix}.json"), Path(f"{prefix}_stats_history.csv")
    stale = [json_path, history_path] + ([Path(request_log)] if request_log is not None else [])
    for old in stale:  # never read a previous run's numbers
        old.unlink(missing_ok=True)

    body_file = out_dir / "request.body"
    body_file.write_bytes(payload[0])
    child_env = _child_env(model, token, (body_file.resolve(), payload[1]), shape, timeout_s)
    child_env.update({STEP_USERS.name: f"1,{users},1,{users}", STEP_SECONDS.name: str(duration_s / 4)})
    # An inherited log must not leak into the run either.
    child_env[REQUEST_LOG.name] = str(Path(request_log).resolve()) if request_log is not None else ""
    child_env[RATE.name] = str(rate) if rate is not None else ""  # nor an inherited rate
    child_env[REQUEST_PATH.name] = path or ""  # nor an inherited path or header length
    child_env[HEADER_LENGTH.name] = "" if header_length is None else str(header_length)
    child_env[RETRY_AFTER.name] = "" if retry_after_s is None else str(retry_after_s)
    child_env.update(env or {})
    steps = parse_steps(STEP_USERS.read(child_env), STEP_SECONDS.read(child_env)) if shape == "step" else []
    expected_s = steps[-1][0] if steps else _run_time(duration_s)
    cmd = _command(host, prefix, users, duration_s, spawn_rate, shape)
    if stop_timeout_s is not None:
        cmd += ["--stop-timeout", f"{stop_timeout_s:g}"]
    _run(cmd, child_env, expected_s + (stop_timeout_s or 0.0) + HARD_LIMIT_SLACK_S, json_path)

    result = parse_json_stats(json.loads(json_path.read_text()), duration_s=expected_s)
    if history_path.exists():
        result.history = parse_history(history_path)
    if steps and result.start_time is not None:
        result.markers = step_markers(steps, result.start_time)
    return result


def _child_env(model: str, token: str | None, payload: tuple[Path, str], shape: str,
               timeout_s: float | None) -> dict[str, str]:
    if shape not in ("steady", "step"):
        raise ValueError(f"shape must be steady or step, got {shape!r}")
    child = dict(os.environ)
    # An inherited token must not leak into the run.
    child.update({MODEL.name: model, BODY_FILE.name: str(payload[0]), CONTENT_TYPE.name: payload[1],
                  SHAPE.name: shape, TOKEN.name: token or ""})
    if timeout_s is not None:
        child[TIMEOUT_S.name] = str(timeout_s)
    return child


def _run_time(duration_s: float) -> int:
    return max(1, math.ceil(duration_s))  # locust's --run-time takes whole seconds only


def _command(host: str, prefix: Path, users: int, duration_s: float, spawn_rate: float | None,
             shape: str) -> list[str]:
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", host,
           "--csv", str(prefix), "--csv-full-history", "--json-file", str(prefix),
           "--only-summary", "--loglevel", "WARNING"]
    if shape == "steady":  # a shape ignores (and warns about) users, spawn rate and run time
        cmd += ["-u", str(users), "-r", str(spawn_rate or users), "-t", f"{_run_time(duration_s)}s"]
    return cmd


def _run(cmd: list[str], env: dict[str, str], limit_s: float, json_path: Path) -> None:
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"locust ran past {limit_s:.0f} s and was killed:\n{_tail(exc.stderr)}") from None
    if proc.returncode not in OK_EXIT_CODES:
        raise RuntimeError(f"locust failed with exit code {proc.returncode}:\n{_tail(proc.stderr)}")
    if not json_path.exists():
        raise RuntimeError(f"locust wrote no {json_path}:\n{_tail(proc.stderr)}")


def _tail(text: str | bytes | None) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").splitlines()[-STDERR_TAIL_LINES:])


def parse_json_stats(entries: list[dict], duration_s: float) -> LoadResult:
    """LoadResult from locust's --json-file content: one stats entry per (method, name).

    duration_s is the fallback span for the throughput when the run has fewer than two requests.
    """
    histogram: dict[float, int] = {}
    for entry in entries:
        for latency, count in entry["response_times"].items():  # JSON made the keys strings
            histogram[float(latency)] = histogram.get(float(latency), 0) + count
    requests = sum(e["num_requests"] for e in entries)
    timed = requests - sum(e["num_none_requests"] for e in entries)
    start = min((e["start_time"] for e in entries), default=None)
    end = max((e["last_request_timestamp"] or 0.0 for e in entries), default=0.0)
    if requests > 1 and start is not None and end > start:
        # First to last completion spans n - 1 intervals; n / span would overstate short runs.
        span = end - start
        throughput = (requests - 1) / span
    else:
        span, throughput = duration_s, requests / duration_s
    return LoadResult(
        requests=requests,
        failures=sum(e["num_failures"] for e in entries),
        p50_ms=percentile(histogram, 0.50),
        p95_ms=percentile(histogram, 0.95),
        p99_ms=percentile(histogram, 0.99),
        mean_ms=sum(e["total_response_time"] for e in entries) / timed if timed else math.nan,
        throughput_rps=throughput,
        duration_s=span,
        start_time=start,
        response_times=dict(sorted(histogram.items())),
    )


def parse_history(path: Path) -> list[HistoryRow]:
    """Rows of PREFIX_stats_history.csv for all requests together (locust's "Aggregated" line)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["Name"] == "Aggregated"]
    history, prev_t, prev_n, prev_f = [], None, 0, 0
    for r in rows:
        t, n, fails = float(r["Timestamp"]), int(r["Total Request Count"]), int(r["Total Failure Count"])
        # Rates from count differences: locust's own Requests/s is a 10 s average lagging 2 s.
        dt = t - prev_t if prev_t is not None and t > prev_t else 1.0
        history.append(HistoryRow(t, int(r["User Count"]), (n - prev_n) / dt, _ms(r["50%"]),
                                  _ms(r["95%"]), _ms(r["99%"]), (fails - prev_f) / dt))
        prev_t, prev_n, prev_f = t, n, fails
    return history


def _ms(cell: str) -> float:
    return math.nan if cell in ("", "N/A") else float(cell)
