"""Load-test package: histogram maths, table, plots, and real locust runs against a stub server."""
from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from loadtest import LoadResult, format_table, percentile, plot_latency_distributions, plot_timeline, run_locust
from loadtest.histogram import bucket_ms
from loadtest.payload import build_payload
from loadtest.runner import HistoryRow, parse_history, parse_json_stats
from loadtest.steps import parse_steps, step_markers

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY_BYTES = 3 * 32 * 32 * 4  # one float32 sample of the tiny model
TOKEN = "s3cret"


# --- pure functions -------------------------------------------------------------------------

def test_percentile_nearest_rank():
    hist = {10: 1, 20: 2, 30: 1}  # sorted: 10 20 20 30
    assert percentile(hist, 0.0) == 10
    assert percentile(hist, 0.25) == 10
    assert percentile(hist, 0.5) == 20
    assert percentile(hist, 0.75) == 20
    assert percentile(hist, 0.76) == 30
    assert percentile(hist, 1.0) == 30
    assert percentile({5: 99, 500: 1}, 0.99) == 5 and percentile({5: 99, 500: 1}, 0.995) == 500
    assert percentile({}, 0.5) != percentile({}, 0.5)  # NaN
    with pytest.raises(ValueError):
        percentile(hist, 95)


def test_bucket_keeps_three_significant_digits():
    assert [bucket_ms(x) for x in (0.12345, 7.456, 123.4, 987.6, 12345.0)] == [0.123, 7.46, 123.0, 988.0, 12300.0]
    assert bucket_ms(0) == 0


def test_steps_and_markers():
    steps = parse_steps("1,8,1,8", "2.5")
    assert steps == [(2.5, 1), (5.0, 8), (7.5, 1), (10.0, 8)]
    assert step_markers(steps, start=100.0) == [(100.0, "1 users"), (102.5, "8 users"),
                                                (105.0, "1 users"), (107.5, "8 users")]
    with pytest.raises(ValueError):
        parse_steps("", 5)


def test_payloads_match_the_model_sample():
    raw, raw_type = build_payload("tiny", "raw")
    assert raw_type == "application/octet-stream" and len(raw) == TINY_BYTES
    body, json_type = build_payload("tiny", "json")
    inputs = np.array(json.loads(body)["inputs"], dtype=np.float32)
    assert json_type == "application/json" and inputs.shape == (3, 32, 32)
    assert inputs.tobytes() == raw


def test_parse_json_stats_uses_exact_counts_and_span():
    entries = [{"num_requests": 11, "num_none_requests": 0, "num_failures": 1, "total_response_time": 110.0,
                "start_time": 1000.0, "last_request_timestamp": 1005.0,
                "response_times": {"9.0": 5, "10.0": 5, "30.0": 1}}]
    r = parse_json_stats(entries, duration_s=20)
    assert (r.requests, r.failures, r.p50_ms, r.p99_ms, r.mean_ms) == (11, 1, 10.0, 30.0, 10.0)
    assert r.throughput_rps == pytest.approx(2.0) and r.duration_s == 5.0  # 10 intervals in 5 s
    assert r.response_times == {9.0: 5, 10.0: 5, 30.0: 1}


def test_parse_history_rates_from_counts(tmp_path):
    header = "Timestamp,User Count,Type,Name,Requests/s,Failures/s,50%,95%,99%,Total Request Count,Total Failure Count"
    lines = [header, "100,1,,Aggregated,0,0,N/A,N/A,N/A,0,0",
             "101,1,POST,/predictions/tiny,0,0,5,9,9,10,0", "101,1,,Aggregated,0,0,5,9,9,10,0",
             "103,2,,Aggregated,0,0,6,9,12,50,4"]
    path = tmp_path / "h.csv"
    path.write_text("\n".join(lines) + "\n")
    rows = parse_history(path)
    assert [(r.timestamp, r.users, r.rps, r.failures_per_s) for r in rows] == \
        [(100, 1, 0, 0), (101, 1, 10, 0), (103, 2, 20, 2)]
    assert math.isnan(rows[0].p50_ms) and (rows[2].p50_ms, rows[2].p95_ms, rows[2].p99_ms) == (6, 9, 12)


# --- report -----------------------------------------------------------------------------------

def _result(p50: float, requests: int) -> LoadResult:
    hist = {bucket_ms(p50 * f): requests // 4 for f in (0.8, 1.0, 1.1, 2.0)}
    return LoadResult(requests=requests, failures=1, p50_ms=p50, p95_ms=2 * p50, p99_ms=2 * p50,
                      mean_ms=p50, throughput_rps=12.5, duration_s=10.0, response_times=hist)


ROWS = {"fat 1x16": _result(40.0, 400), "packrat 4x4": _result(12.3, 1200)}


def test_format_table_has_every_row_and_column():
    lines = format_table(ROWS).splitlines()
    assert len(lines) == 3
    for column in ("name", "requests", "failures", "p50 ms", "p95 ms", "p99 ms", "req/s"):
        assert column in lines[0]
    assert "fat 1x16" in lines[1] and "400" in lines[1] and "40.0" in lines[1] and "12.5" in lines[1]
    assert "packrat 4x4" in lines[2] and "1200" in lines[2] and "24.6" in lines[2]
    assert len({len(line) for line in lines}) == 1  # aligned


def test_plots_write_png(tmp_path):
    dist = plot_latency_distributions(ROWS, tmp_path / "dist.png")
    history = [HistoryRow(1000.0 + i, 1 + i // 5, 10.0 + i, 5.0 + i, 8.0 + i, 9.0 + i, 0.0) for i in range(20)]
    history[0] = HistoryRow(1000.0, 1, 0.0, math.nan, math.nan, math.nan, 0.0)  # before any request
    timeline = plot_timeline(history, tmp_path / "timeline.png", markers=[(1005.0, "8 users"), (1010.0, "scale")])
    for path in (dist, timeline):
        assert path.read_bytes()[:8] == PNG_MAGIC


# --- real locust runs against a stub server on 127.0.0.1 ------------------------------------

class StubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like TorchServe
    disable_nagle_algorithm = True  # headers and body go out in two writes: avoid 40 ms delayed-ACK stalls
    seen: list[tuple[int, str]]  # (body length, Authorization header), set per server

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        auth = self.headers.get("Authorization", "")
        self.seen.append((len(body), auth))
        time.sleep(0.002)  # stands in for inference; keeps the request rate and CPU use modest
        if auth != f"Bearer {TOKEN}":
            status = 401
        elif self.path != "/predictions/tiny" or len(body) != TINY_BYTES:
            status = 400
        else:
            status = 200
        answer = b'{"ok": true}'
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args) -> None:  # keep test output clean
        pass


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # locust drops keep-alive connections mid-request when a run ends


@pytest.fixture
def stub():
    handler = type("Handler", (StubHandler,), {"seen": []})
    server = QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler.seen
    server.shutdown()
    server.server_close()


def test_steady_run_counts_every_request(stub, tmp_path):
    host, seen = stub
    r = run_locust(host, "tiny", users=2, duration_s=3, out_dir=tmp_path, token=TOKEN)
    assert r.requests > 0 and r.failures == 0
    assert r.duration_s > 2.5  # ran the full 3 s, not cut short by a stale gevent clock
    assert r.requests <= len(seen) <= r.requests + 2  # at most one request in flight per user at the end
    assert set(seen) == {(TINY_BYTES, f"Bearer {TOKEN}")}
    assert sum(r.response_times.values()) == r.requests and r.throughput_rps > 0
    assert 0 < r.p50_ms <= r.p95_ms <= r.p99_ms
    assert r.history and (tmp_path / "locust_stats_history.csv").exists()


def test_wrong_token_fails_every_request(stub, tmp_path):
    host, seen = stub
    r = run_locust(host, "tiny", users=1, duration_s=2, out_dir=tmp_path, token="wrong")
    assert r.requests > 0 and r.failures == r.requests


def test_step_load_stops_by_itself(stub, tmp_path):
    host, _ = stub
    r = run_locust(host, "tiny", users=2, duration_s=4, out_dir=tmp_path, token=TOKEN, shape="step",
                   env={"PACKRAT_STEP_USERS": "1,2", "PACKRAT_STEP_SECONDS": "2"})
    assert r.requests > 0 and r.failures == 0
    assert r.history and max(row.users for row in r.history) == 2
    assert [label for _, label in r.markers] == ["1 users", "2 users"]


def test_locust_errors_raise_with_its_stderr(tmp_path):
    with pytest.raises(RuntimeError, match="unknown model"):
        run_locust("http://127.0.0.1:9", "no_such_model", users=1, duration_s=1, out_dir=tmp_path)
