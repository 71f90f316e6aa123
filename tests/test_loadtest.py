"""Load-test package: histogram maths, table, plots, and real locust runs against a stub server."""
from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import psutil
import pytest

from packrat.loadtest import (
    LoadResult,
    format_table,
    percentile,
    plot_latency_distributions,
    plot_timeline,
    run_locust,
)
from packrat.loadtest.env import BODY_FILE, STEP_SECONDS, STEP_USERS
from packrat.loadtest.histogram import bucket_ms
from packrat.loadtest.requestlog import read_request_log
from packrat.loadtest.runner import HistoryRow, parse_history, parse_json_stats
from packrat.loadtest.steps import parse_steps, step_markers
from packrat.bench import faults
from packrat.codec.demo_tokenizers import build_demo_tokenizer, demo_tokenizer_kind
from packrat.codec.payloads import (
    TEXT,
    build_payload,
    check_payload,
    natural_payload,
    synthetic_jpeg,
)

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
    assert parse_steps("4,0,4", "25,20,40") == [(25.0, 4), (45.0, 0), (85.0, 4)]  # a length per step
    for users, seconds in (("", 5), ("1,2", "3,4,5"), ("1,2", "3,0"), ("-1", 5)):
        with pytest.raises(ValueError):
            parse_steps(users, seconds)


def test_payloads_match_the_model_sample():
    raw, raw_type = build_payload("tiny", "raw")
    assert raw_type == "application/octet-stream" and len(raw) == TINY_BYTES
    body, json_type = build_payload("tiny", "json")
    inputs = np.array(json.loads(body)["inputs"], dtype=np.float32)
    assert json_type == "application/json" and inputs.shape == (3, 32, 32)
    assert inputs.tobytes() == raw


def test_jpeg_payload_is_a_photo_sized_jpeg():
    body, content_type = build_payload("tiny", "jpeg")
    assert content_type == "image/jpeg"
    from PIL import Image

    image = Image.open(io.BytesIO(body))
    assert image.format == "JPEG" and image.size == (500, 375) and image.mode == "RGB"
    assert 50_000 <= len(body) <= 200_000  # a realistic photo's size, so the server really decodes
    assert synthetic_jpeg.__wrapped__() == body  # deterministic, not only cached
    pixels = np.asarray(image, dtype=np.float32)
    assert pixels.std() > 20  # not a flat image


def test_text_payload_is_a_utf8_paragraph():
    body, content_type = build_payload("bert_base", "text")
    assert content_type == "text/plain; charset=utf-8"
    text = body.decode("utf-8")
    assert text == TEXT and 60 <= len(text.split()) <= 100
    assert body != text.encode("latin-1")  # non-ASCII: the charset matters


def test_natural_payload_per_model():
    assert [natural_payload(m) for m in ("resnet50", "inception_v3", "tiny")] == ["jpeg"] * 3
    assert [natural_payload(m) for m in ("bert_base", "gpt2")] == ["text", "text"]
    assert natural_payload("torch.nn:Identity", input_shape=(16,)) == "raw"  # not an image, not tokens
    assert build_payload("gpt2")[1].startswith("text/plain")  # no kind: the natural one
    with pytest.raises(ValueError, match="image model"):
        check_payload("bert_base", "jpeg")
    with pytest.raises(ValueError, match="token model"):
        check_payload("resnet50", "text")
    with pytest.raises(ValueError, match="payload must be one of"):
        build_payload("tiny", "png")


@pytest.mark.parametrize("kind,model,pad", [("wordpiece", "bert_base", "[PAD]"), ("bpe", "gpt2", "<|endoftext|>")])
def test_demo_tokenizer_encodes_the_payload(tmp_path, kind, model, pad):
    from tokenizers import Tokenizer

    from packrat.models.zoo import resolve

    assert demo_tokenizer_kind(model) == kind
    path = build_demo_tokenizer(tmp_path / "tok", kind)
    assert path == tmp_path / "tok" / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    ids = tokenizer.encode(TEXT).ids
    assert 60 <= len(ids) <= 128  # fits the zoo models' 128 tokens
    assert max(ids) < resolve(model).vocab_size
    assert tokenizer.token_to_id("[UNK]") not in ids
    pad_id = tokenizer.token_to_id(pad)
    assert pad_id is not None and tokenizer.padding["pad_id"] == pad_id
    if kind == "wordpiece":
        assert pad_id == 0 and ids[0] == tokenizer.token_to_id("[CLS]") and ids[-1] == tokenizer.token_to_id("[SEP]")
    assert tokenizer.decode(ids).lower().startswith("the harbour town")
    assert build_demo_tokenizer(tmp_path / "again", kind).read_bytes() == path.read_bytes()
    with pytest.raises(ValueError):
        build_demo_tokenizer(tmp_path, "sentencepiece")


# --- chaos: finding and killing pool instances ------------------------------------------------

SLEEPER = [sys.executable, "-c", "import time; time.sleep(30)"]
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    kids = [subprocess.Popen(sleeper + ["packrat.serving.pool", str(i)]) for i in range(2)]
    other = subprocess.Popen(sleeper + ["not-an-instance"])
    print(" ".join(str(p.pid) for p in kids + [other]), flush=True)
    time.sleep(30)  # never reaps: killed children stay zombies
""")


def _kill_by_pid(pids):
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


def test_torchserve_pid_from_run_dir(tmp_path):
    assert faults.torchserve_pid(tmp_path) is None
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / ".model_server.pid").write_text("4242\n")
    assert faults.torchserve_pid(tmp_path) == 4242


def test_kills_only_pool_instances_under_the_root():
    outsider = subprocess.Popen(SLEEPER + ["packrat.serving.pool"])  # an instance, but not under the root
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in parent.stdout.readline().split()]
    try:
        kids, other = pids[:2], pids[2]
        found = [p.pid for p in faults.pool_instances(parent.pid)]
        assert sorted(found) == sorted(kids) and other not in found and outsider.pid not in found
        assert faults.pool_instances(2**22 + 12345) == []  # no such process

        first = faults.kill_one(parent.pid)
        assert first in kids
        deadline = time.monotonic() + 10  # SIGKILL lands asynchronously
        while psutil.Process(first).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [p.pid for p in faults.pool_instances(parent.pid)] == [k for k in kids if k != first]  # zombie skipped
        with faults.InstanceKiller(lambda: parent.pid, every_s=0.02) as killer:
            deadline = time.monotonic() + 10
            while not killer.misses and time.monotonic() < deadline:
                time.sleep(0.02)
        assert killer.kills == 1 and [pid for _, pid in killer.killed] == [k for k in kids if k != first]
        assert killer.misses >= 1 and faults.kill_one(parent.pid) is None
        assert psutil.Process(other).status() != psutil.STATUS_ZOMBIE
        assert outsider.poll() is None  # untouched
    finally:
        _kill_by_pid(pids + [parent.pid, outsider.pid])
        parent.wait()
        outsider.wait()
        parent.stdout.close()


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
    seen: list[tuple[int, str, str]]  # (body length, Authorization header, Content-Type), set per server

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        auth = self.headers.get("Authorization", "")
        self.seen.append((len(body), auth, self.headers.get("Content-Type", "")))
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


@pytest.mark.integration
def test_steady_run_counts_every_request(stub, tmp_path):
    host, seen = stub
    log = tmp_path / "requests.tsv"
    log.write_text("stale line\n")  # a previous run's log is replaced, not appended to
    r = run_locust(host, "tiny", users=2, duration_s=2, out_dir=tmp_path, token=TOKEN,
                   payload=build_payload("tiny", "raw"), request_log=log)
    assert r.requests > 0 and r.failures == 0
    records = read_request_log(log)
    assert len(records) == r.requests and "stale" not in log.read_text()
    assert all(x.status == 200 and not x.failed and not x.reason and x.response_ms > 0 for x in records)
    assert r.start_time - 5 < min(x.start for x in records) <= max(x.end for x in records) < time.time()
    assert r.duration_s > 1.5  # ran the full 2 s, not cut short by a stale gevent clock
    assert r.requests <= len(seen) <= r.requests + 2  # at most one request in flight per user at the end
    assert set(seen) == {(TINY_BYTES, f"Bearer {TOKEN}", "application/octet-stream")}
    assert sum(r.response_times.values()) == r.requests and r.throughput_rps > 0
    assert 0 < r.p50_ms <= r.p95_ms <= r.p99_ms
    assert r.history and (tmp_path / "locust_stats_history.csv").exists()


@pytest.mark.integration
def test_wrong_token_fails_every_request(stub, tmp_path, monkeypatch):
    host, seen = stub
    monkeypatch.setenv(BODY_FILE.name, "/nonexistent")  # must not leak: the body given is what is sent
    r = run_locust(host, "tiny", users=1, duration_s=1, out_dir=tmp_path, token="wrong",
                   payload=build_payload("tiny"), request_log=tmp_path / "requests.tsv")
    assert r.requests > 0 and r.failures == r.requests
    records = read_request_log(tmp_path / "requests.tsv")
    assert len(records) == r.requests
    assert {(x.status, x.failed, x.reason) for x in records} == {(401, True, '{"ok": true}')}  # the answer's body
    assert {(length, kind) for length, _, kind in seen} == {(len(synthetic_jpeg()), "image/jpeg")}


@pytest.mark.integration
def test_step_load_stops_by_itself(stub, tmp_path):
    host, _ = stub
    r = run_locust(host, "tiny", users=2, duration_s=4, out_dir=tmp_path, token=TOKEN,
                   payload=build_payload("tiny", "raw"), shape="step",
                   env={STEP_USERS.name: "1,2", STEP_SECONDS.name: "2"})
    assert r.requests > 0 and r.failures == 0
    assert r.history and max(row.users for row in r.history) == 2
    assert [label for _, label in r.markers] == ["1 users", "2 users"]


@pytest.mark.integration
def test_locust_errors_raise_with_its_stderr(tmp_path):
    with pytest.raises(RuntimeError, match="No such file"):
        run_locust("http://127.0.0.1:9", "tiny", users=1, duration_s=1, out_dir=tmp_path, payload=(b"x", "text/plain"),
                   env={BODY_FILE.name: str(tmp_path / "missing")})
