"""packrat bench overload (packrat/bench/overload.py, overload_report.py, soak.py and the harness's users.py,
servers.py, resources.py, faults.py): its pure parts (counts by status and client
error, client errors classed by errno, percentiles, summaries, the open-loop user count, the best of
the capacity runs, the verdicts per run and over the runs, the health probes' verdict, the soak's
schedule, kill windows and slopes: where they pass and where they must not), its command line, the
CPU-bound processes of --slow, locust against stub servers (the open-loop rate, client errors by
class, a 503's Retry-After), and short real runs on the tiny model behind the KServe server."""

from __future__ import annotations

import errno
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from packrat.bench import faults, overload, overload_report, resources, results, servers, soak
from packrat.bench import users as bench_users
from packrat.cli import bench_overload
from packrat.cli.main import build_parser, main
from packrat.loadtest.requestlog import (RequestRecord, error_class, format_record, parse_line, read_request_log,
                                        reason_class)


def rec(start: float, ms: float = 10.0, status: int = 200, error: str = "") -> RequestRecord:
    return RequestRecord(start, ms, status, status != 200 or bool(error), "" if status == 200 else "x", error)


def counts(ok=0, refused=0, late=0, other=0, errors=None) -> dict:
    """Status classes: 200, 503 (refused), 504 (late), other statuses; client errors by class."""
    errors = errors or {}
    return {"200": ok, "503": refused, "504": late, "other": other, "client_error": sum(errors.values()),
            "errors": errors}


# ---- counting ----------------------------------------------------------------------------------

@pytest.mark.parametrize("values, q, expected", [
    ([], 0.5, None),
    ([7.0], 0.5, 7.0), ([7.0], 0.99, 7.0),
    (list(range(1, 101)), 0.50, 50), (list(range(1, 101)), 0.99, 99), (list(range(1, 101)), 1.0, 100),
    ([3.0, 1.0, 2.0], 0.5, 2.0),  # unsorted
    ([1.0, 2.0], 0.5, 1.0), ([1.0, 2.0], 0.51, 2.0),  # nearest rank: ceil(q·n)
    ([5.0, 1.0], 0.001, 1.0),
])
def test_percentile_is_the_nearest_rank(values, q, expected):
    assert bench_users.percentile(values, q) == expected


def test_status_classes_put_client_errors_apart_by_class_and_other_statuses_under_other():
    records = [rec(0), rec(0), rec(0, status=503), rec(0, status=504), rec(0, status=0, error="reset"),
               rec(0, status=0, error="timeout"), rec(0, status=0, error="reset"), rec(0, status=500),
               rec(0, status=429), rec(0, status=0)]  # the last: no class recorded, its reason "x" says nothing
    got = bench_users.status_classes(records)
    assert got == {"200": 2, "503": 1, "504": 1, "other": 2, "client_error": 4,
                   "errors": {"reset": 2, "timeout": 1, "other": 1}}
    assert bench_users.admitted(got) == 9 and bench_users.share_504(got) == pytest.approx(1 / 9)
    assert bench_users.answered(got) == 6
    assert bench_users.by_status(records) == {"0": 4, "200": 2, "503": 1, "504": 1, "500": 1, "429": 1}
    assert bench_users.status_classes([]) == counts()
    assert bench_users.share_504(counts(refused=5)) is None  # nothing admitted
    assert bench_users.fmt_errors(got) == "4 (reset 2, timeout 1, other 1)" and bench_users.fmt_errors(counts()) == "0"
    # an answer 200 whose body was cut is a client error, not a 200
    assert bench_users.status_classes([rec(0, status=200, error="reset")]) == counts(errors={"reset": 1})


# ---- client errors by errno ----------------------------------------------------------------------

class HTTPConnectionClosed(Exception):  # geventhttpclient's name for a connection closed before the answer
    pass


class Timeout(BaseException):  # gevent.Timeout is a BaseException of that name
    pass


class RetriesExceeded(Exception):  # geventhttpclient wraps the error it gives up on, as `original`
    def __init__(self, original):
        super().__init__("URL http://x: 0")
        self.original = original


def caused(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


@pytest.mark.parametrize("exc, expected", [
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "refused"),
    (OSError(errno.ECONNREFUSED, "x"), "refused"),
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), "reset"),
    (BrokenPipeError(errno.EPIPE, "Broken pipe"), "reset"), (OSError(errno.EPIPE, "x"), "reset"),
    (ConnectionAbortedError(), "reset"), (HTTPConnectionClosed("connection closed."), "reset"),
    (__import__("http.client").client.RemoteDisconnected("Remote end closed connection"), "reset"),
    (socket.timeout("timed out"), "timeout"), (TimeoutError(), "timeout"), (OSError(errno.ETIMEDOUT, "x"), "timeout"),
    (Timeout(), "timeout"),
    (RetriesExceeded(socket.timeout("timed out")), "timeout"),  # what a timed-out POST raises
    (RetriesExceeded(BrokenPipeError(errno.EPIPE, "x")), "reset"),
    (caused(RuntimeError("wrapped"), ConnectionRefusedError()), "refused"),
    (ValueError("HTTP/1.1 parse error"), "other"), (OSError(errno.EHOSTUNREACH, "No route to host"), "other"),
    (RuntimeError("the connection was reset"), "reset"),  # no errno, no known type: its words
    (None, ""),
])
def test_client_errors_are_classed_by_errno_then_type_then_words(exc, expected):
    assert error_class(exc) == expected


@pytest.mark.parametrize("reason, expected", [
    ("[Errno 111] Connection refused", "refused"), ("URL http://x: 0, original=timed out", "timeout"),
    ("connection closed.", "reset"), ("[Errno 104] Connection reset by peer", "reset"),
    ("[Errno 32] Broken pipe", "reset"), ("weird", "other"), ("", "other"),
])
def test_a_reason_alone_is_classed_by_its_words(reason, expected):
    assert reason_class(reason) == expected


def test_the_request_log_carries_the_class_on_client_errors_only():
    error = RequestRecord(1.0, 2.0, 0, True, "[Errno 111] Connection refused", "refused")
    assert format_record(error).endswith("\trefused\n") and parse_line(format_record(error)) == error
    answer = RequestRecord(1.0, 2.0, 503, True, "busy")
    assert format_record(answer).count("\t") == 4 and parse_line(format_record(answer)) == answer  # 5 fields
    assert parse_line("1.0\t2.0\t0\t1\tx\tbogus") is None  # a sixth field must be a class
    old = parse_line("1.0\t2.0\t0\t1\t[Errno 104] Connection reset by peer")  # a log written before the class
    assert old.error == "" and old.client_error == "reset"
    assert answer.client_error == "" and RequestRecord(1.0, 2.0, 200, False).client_error == ""


@pytest.mark.parametrize("rate, timeout, batch, users", [
    (100.0, 2.0, 4, 300),  # rate × (deadline + 1 s)
    (10.0, 2.0, 4, 30), (0.5, 2.0, 4, 4),  # at least the closed loop's B
    (33.3, 2.0, 1, 100),  # rounded up: 99.9 → 100
    (60.0, 0.5, 8, 90), (0.0, 2.0, 2, 2),
])
def test_open_loop_users_keep_the_pace_while_answers_take_the_deadline(rate, timeout, batch, users):
    assert bench_users.open_loop_users(rate, timeout, batch) == users


def test_rates_count_answers_within_the_phases_whole_seconds_from_its_first_request():
    records = [rec(100.0, 50), rec(100.5, 400), rec(101.0, 900), rec(101.2, 900, 503), rec(101.5, 800)]
    # ends: 100.05, 100.9, 101.9, 102.1 (a 503), 102.3: within 2 s of 100.0 are three 200s
    assert bench_users.answered_within(records, 2) == 3 and bench_users.answered_within(records, 3) == 4
    assert bench_users.answered_within(records, 3, status=503) == 1
    assert bench_users.sent_within(records, 1) == 3 and bench_users.sent_within(records, 2) == 5
    assert bench_users.answered_within([], 3) == bench_users.sent_within([], 3) == 0
    assert [bench_users.run_seconds(d) for d in (0.2, 1, 2.5, 3)] == [1, 1, 3, 3]  # locust's run time


def test_summaries():
    closed = [rec(0.0 + i * 0.1, 20.0 + i) for i in range(20)] + [rec(1.0, 5.0, 504)]
    before = overload_report.closed_summary(closed, 2, users=8)
    assert before["rps"] == 10.0 and before["requests"] == 21 and before["users"] == 8
    assert before["p50_ms"] == 29.0 and before["p99_ms"] == 39.0  # the 200s' only
    assert before["by_status"] == {"200": 20, "504": 1}
    records = ([rec(i * 0.01, 100.0) for i in range(100)] + [rec(0.5, 3.0 + i % 5, 503) for i in range(50)]
               + [rec(0.2, 2100.0, 504), rec(0.3, 7000.0, 0, "timeout")])
    over = overload_report.overload_summary(records, 1, capacity_rps=100.0, rate_rps=300.0, users=900)
    assert over["counts"] == counts(ok=100, refused=50, late=1, errors={"timeout": 1})
    assert over["sent"] == 152 and over["admitted"] == 102 and over["share_504"] == pytest.approx(1 / 102)
    assert over["served_rps"] == 91.0 and over["served_ratio"] == pytest.approx(0.91)  # ends after 1 s left out
    assert (over["p50_503_ms"], over["p99_503_ms"]) == (5.0, 7.0)
    assert (over["p50_200_ms"], over["p99_200_ms"]) == (100.0, 100.0)
    assert over["rate_rps"] == 300.0 and over["users"] == 900 and over["sent_rps"] == 152.0
    empty = overload_report.overload_summary([], 5, capacity_rps=0.0, rate_rps=0.0, users=8)
    assert empty["sent"] == 0 and empty["served_ratio"] is None and empty["p99_503_ms"] is None


# ---- verdicts ----------------------------------------------------------------------------------

@pytest.mark.parametrize("given, passed, says", [
    (counts(ok=900, refused=100), True, "504: 0 = 0.0% of 900 admitted"),
    (counts(ok=990, late=10, refused=500), True, "1.0% of 1000"),  # exactly 1 %
    (counts(ok=98, late=2, refused=500), False, "2.0% of 100"),  # 2 % of the admitted
    (counts(ok=1000, other=1), False, "other: 1"),  # a 500, a 429...
    (counts(ok=1000, errors={"reset": 1}), False, "client errors: 1 (reset 1)"),  # no answer is no 503 either
    (counts(ok=1000, refused=10, errors={"reset": 2, "timeout": 1}), False, "client errors: 3 (reset 2, timeout 1)"),
    (counts(ok=100000, refused=10, errors={"other": 1}), False, "client errors: 1 (other 1)"),  # one in 100001
    (counts(refused=100), True, "nothing admitted"),  # the served verdict fails that one
    (counts(), False, "no request was sent"),
    (counts(errors={"refused": 40}), False, "no request was answered (40 sent, client errors: 40 (refused 40))"),
])
def test_only_200_or_503(given, passed, says):
    verdict = overload_report.statuses_verdict(given)
    assert verdict.passed is passed and says in verdict.value


@pytest.mark.parametrize("served, capacity, passed, says", [
    (85.0, 100.0, True, "0.85 ×"), (100.0, 100.0, True, "1.00 ×"), (250.0, 100.0, True, "2.50 ×"),
    (84.0, 100.0, False, "0.84 ×"), (0.0, 100.0, False, "0.00 ×"), (None, 100.0, False, "0.00 ×"),
    (50.0, 0.0, False, "no capacity measured"), (50.0, None, False, "no capacity measured"),
])
def test_served_at_least_0_85_of_capacity(served, capacity, passed, says):
    verdict = overload_report.served_verdict(served, capacity)
    assert verdict.passed is passed and says in verdict.value


@pytest.mark.parametrize("p99, given, passed, says", [
    (12.0, counts(ok=10, refused=5), True, "503 p99 12.0 ms over 5"),
    (50.0, counts(ok=10, refused=5), True, "50.0 ms"),
    (50.1, counts(ok=10, refused=5), False, "50.1 ms"),
    (4000.0, counts(refused=5), False, "4000.0 ms"),
    (None, counts(ok=10), True, "no 503s"),  # passes, and says so
    (None, counts(ok=10, late=2, errors={"timeout": 3}), True, "no 503s"),
    (None, counts(), False, "no request was answered"),  # no answer at all fails rather than passes
    (None, counts(errors={"refused": 7}), False, "no request was answered"),
    (None, counts(refused=3), False, "without latencies"),
])
def test_refused_fast(p99, given, passed, says):
    verdict = overload_report.refusals_verdict(p99, given)
    assert verdict.passed is passed and says in verdict.value


@pytest.mark.parametrize("before, after, passed, says", [
    (20.0, 20.0, True, "1.00×"), (20.0, 22.0, True, "1.10×"), (20.0, 15.0, True, "0.75×"),
    (20.0, 22.2, False, "1.11×"), (20.0, 40.0, False, "2.00×"),
    (None, 20.0, False, "no p50 before"), (0.0, 20.0, False, "no p50 before"), (20.0, None, False, "no p50 after"),
])
def test_recovered(before, after, passed, says):
    verdict = overload_report.recovery_verdict(before, after)
    assert verdict.passed is passed and says in verdict.value


def test_a_run_with_no_answers_fails_every_verdict():
    before = overload_report.closed_summary([rec(0, 1, 0)] * 3, 3, users=8)
    over = overload_report.overload_summary([rec(0, 7000, 0)] * 5, 5, before["rps"], 0.0, 8)
    after = overload_report.closed_summary([], 3, users=8)
    assert [v.passed for v in overload_report.verdicts(before, over, after)] == [False, False, False, False]
    assert [v.passed for v in overload_report.verdicts(before, over, after, [])] == [False] * 5  # nothing probed either


def test_a_good_run_passes_every_verdict():
    before = overload_report.closed_summary([rec(i * 0.01, 20.0) for i in range(300)], 3, users=8)
    records = [rec(i * 0.005, 900.0) for i in range(500)] + [rec(i * 0.01, 3.0, 503) for i in range(400)]
    over = overload_report.overload_summary(records, 5, before["rps"], 3 * before["rps"], 900)
    after = overload_report.closed_summary([rec(i * 0.01, 21.0) for i in range(300)], 3, users=8)
    found = overload_report.verdicts(before, over, after, [probe("/v2/health/live", 200, 3.0)] * 10)
    assert [v.name for v in found] == ["only 200 or 503", "served", "refused fast", "recovered", "health in time"]
    assert all(v.passed for v in found), [v.line() for v in found]


# ---- capacity: the best of B and 2B users --------------------------------------------------------

def closed(rps: float, users: int, p50: float = 20.0) -> dict:
    return {"rps": rps, "users": users, "p50_ms": p50}


@pytest.mark.parametrize("runs, best", [
    ([closed(40.0, 4), closed(44.0, 8)], 1),  # 2B served more: it is capacity
    ([closed(44.0, 4), closed(40.0, 8)], 0),
    ([closed(40.0, 4), closed(40.0, 8)], 0),  # a tie: fewer users, a lower p50 to keep
    ([closed(0.0, 4), closed(0.0, 8)], 0), ([closed(3.0, 4)], 0), ([], -1),
])
def test_capacity_is_the_best_rate_of_200s_over_the_capacity_runs(runs, best):
    assert overload_report.best_capacity(runs) == best


def test_capacity_counts_answers_200_only_so_refusals_retried_add_nothing():
    """2B users meeting refusals: 100 answers 200 and 400 quick 503s in 2 s is 50 req/s, not 250."""
    records = [rec(i * 0.02, 20.0) for i in range(100)] + [rec(i * 0.005, 1.0, 503) for i in range(400)]
    assert overload_report.closed_summary(records, 2, users=8)["rps"] == 50.0
    b = overload_report.closed_summary([rec(i * 0.025, 20.0) for i in range(80)], 2, users=4)  # 40 req/s
    assert overload_report.best_capacity([b, overload_report.closed_summary(records, 2, users=8)]) == 1
    cut = overload_report.closed_summary([rec(i * 0.02, 20.0, 200, "reset") for i in range(100)], 2, users=8)
    assert cut["rps"] == 0.0 and cut["client_errors"] == {"reset": 100}  # a 200 whose body was cut counts nothing


# ---- health probes -------------------------------------------------------------------------------

def probe(path: str, status: int = 200, ms: float = 5.0, error: str = "") -> dict:
    return {"time": 0.0, "path": path, "status": status, "ms": ms, "error": error}


@pytest.mark.parametrize("probes, passed, says", [
    ([probe("/v2/health/live", ms=3.0), probe("/v2/health/ready", ms=999.0)], True, "slowest 999.0 ms"),
    ([probe("/ping", ms=1000.0)], True, "0 over 1000 ms"),  # exactly 1 s
    ([probe("/ping"), probe("/ping", ms=1000.5)], False, "1 over 1000 ms"),
    ([probe("/v2/health/ready", 503)], False, "1 not 200 (/v2/health/ready 503: 1)"),  # not ready under load
    ([probe("/ping"), probe("/ping", 0, 5000.0, "timeout")], False, "/ping 0 timeout: 1"),
    ([probe("/ping", 0, 1.0, "refused")], False, "/ping 0 refused: 1"),
    ([], False, "no probe was made"),
])
def test_health_answers_within_1_s(probes, passed, says):
    verdict = overload_report.health_verdict(probes)
    assert verdict.name == "health in time" and verdict.passed is passed and says in verdict.value, verdict.value


def test_probe_summary_per_path():
    probes = [probe("/a", ms=float(i)) for i in range(1, 101)] + [probe("/b", 0, 5000.0, "timeout"), probe("/b")]
    got = overload_report.probe_summary(probes)
    assert list(got) == ["/a", "/b"]
    assert got["/a"] == {"probes": 100, "by_status": {"200": 100}, "p50_ms": 50.0, "p99_ms": 99.0, "max_ms": 100.0,
                         "late": 0}
    assert got["/b"]["by_status"] == {"0 timeout": 1, "200": 1} and got["/b"]["late"] == 1
    assert overload_report.probe_summary([]) == {}


@pytest.mark.parametrize("payload", ["v2-json", "v2-binary"])
def test_v2_bodies_go_to_the_v2_route_on_kserve_and_decode_to_the_sample(payload):
    import torch

    from packrat.codec.codec import Codec
    from packrat.codec.config import CodecConfig
    from packrat.models.zoo import resolve

    body = servers.request_body("tiny", payload, None, "kserve")
    assert body.path == "/v2/models/tiny/infer" and (body.header_length is not None) is (payload == "v2-binary")
    spec = resolve("tiny")
    decoded = Codec(CodecConfig.for_model(spec)).decode(body.payload[0], body.payload[1], body.header_length)
    assert decoded.form == "kserve-v2" and torch.equal(decoded.samples[0], spec.example_inputs(1)[0])
    on_torchserve = servers.request_body("tiny", payload, None, "torchserve")
    assert on_torchserve.path is None and on_torchserve.payload == body.payload  # /predictions/NAME, same body
    raw = servers.request_body("tiny", "raw", None, "kserve")
    assert raw.path is None and raw.header_length is None and raw.payload[1] == "application/octet-stream"


def test_health_paths_are_a_kubelets():
    assert servers.health_paths("kserve", "squeezenet") == ("/v2/health/live", "/v2/health/ready",
                                                             "/v2/models/squeezenet/ready")
    assert servers.health_paths("torchserve", "squeezenet") == ("/ping",)


def test_a_probe_answers_or_says_why_not(stub):
    got = servers.probe(stub, "/v2/health/live", "key")
    assert got["status"] == 200 and got["path"] == "/v2/health/live" and 0 < got["ms"] < 5000 and not got["error"]
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = servers.probe(f"http://127.0.0.1:{port}", "/ping", None)
    assert got["status"] == 0 and got["error"] == "refused"


# ---- over several runs ---------------------------------------------------------------------------

def verdict(name: str, passed: bool) -> dict:
    return asdict(results.Verdict(name, f"{name}'s target", passed, "x"))


def test_over_the_runs_each_verdict_must_pass_in_every_run():
    runs = [[verdict("served", True), verdict("recovered", True)],
            [verdict("served", True), verdict("recovered", False)],
            [verdict("served", True), verdict("recovered", False)]]
    served, recovered = overload_report.overall_verdicts(runs)
    assert (served.name, served.passed, served.value) == ("served", True, "3 of 3 runs")
    assert served.target == "served's target, in every run"
    assert (recovered.passed, recovered.value) == (False, "1 of 3 runs (failed: run 2, 3)")
    one = overload_report.overall_verdicts([[verdict("served", False)]])
    assert [v.passed for v in one] == [False]
    missing = overload_report.overall_verdicts([[verdict("served", True), verdict("health in time", True)],
                                         [verdict("served", True)]])  # a run without that verdict did not pass it
    assert [v.passed for v in missing] == [True, False]


# ---- the server's counters, the report ---------------------------------------------------------

def test_counters_keep_whatever_scalars_the_health_has_and_deltas_the_counts():
    status = {"plan": {"instances": [{"cores": [2, 3]}, {"cores": [0]}]},
              "health": {"answered": 10, "refused": 2, "unavailable": None, "predicted_wait_ms": 12.5,
                         "stage_ms": {"total": 1.0}, "kinds": [{}], "admitted": 12}}
    before = servers.counters(status)
    assert before == {"answered": 10, "refused": 2, "unavailable": None, "predicted_wait_ms": 12.5, "admitted": 12}
    after = {"answered": 30, "refused": 9, "predicted_wait_ms": 80.0, "expired": 1}  # admitted absent: left out
    assert servers.counter_delta(before, after) == {"answered": 20, "refused": 7}
    assert servers.counters(None) == servers.counters({}) == {}
    assert servers.instance_cores(status) == [0, 2, 3] and servers.instance_cores(None) == []


def one_run(n: int = 1, after_ms: float = 30.0) -> dict:
    caps = [overload_report.closed_summary([rec(i * 0.01, 20.0) for i in range(300)], 3, users=4),
            overload_report.closed_summary([rec(i * 0.02, 40.0) for i in range(150)], 3, users=8)]
    before = caps[0]
    records = [rec(i * 0.005, 900.0) for i in range(500)] + [rec(i * 0.01, 3.0, 503) for i in range(40)]
    over = overload_report.overload_summary(records + [rec(1, 9000, 0, "timeout")], 5, before["rps"], 300.0, 900)
    after = overload_report.closed_summary([rec(i * 0.01, after_ms) for i in range(300)], 3, users=4)
    probes = [probe("/v2/health/live", ms=4.0), probe("/v2/health/ready", ms=1500.0)]
    return {"run": n, "capacity_runs": caps, "before": before, "overload": over, "after": after,
            "after_over_before": after_ms / 20.0, "health": {"overload": {"predicted_wait_ms": 41.0},
                                                             "overload_delta": {"refused": 40, "expired": 0}},
            "probes": overload_report.probe_summary(probes), "cpu": None,
            "verdicts": [asdict(v) for v in overload_report.verdicts(before, over, after, probes)],
            "notes": [f"a note of run {n}"]}


def report(runs=None, **more) -> dict:
    runs = runs or [one_run()]
    overall = overload_report.overall_verdicts([r["verdicts"] for r in runs])
    return {"model": "tiny", "engine": "kserve", "batch": 4, "payload": "raw", "request_timeout_s": 2.0,
            "max_queue": None, "default_max_queue": 1000, "admission": "predicted", "slow": True,
            "slow_cores": [0, 1], "factor": 3.0, "cores": 2, "runs": runs,
            "verdicts": [asdict(v) for v in overall], "notes": ["a note"], **more}


def test_the_report_has_a_row_per_run_the_counters_and_a_line_per_verdict():
    text = overload_report.format_report(report([one_run(1), one_run(2, after_ms=21.0)]))
    lines = text.splitlines()
    assert "max_queue 1000 (default)" in lines[0] and "slowed by 2 CPU-bound process(es) on cores 0,1" in lines[0]
    assert "2 run(s)" in lines[0] and "capacity the best over 3 s of 4 or 8 users" in lines[0]
    head = next(line for line in lines if line.startswith("| run"))
    assert head.count("|") == len(overload_report.TABLE_HEAD) + 1
    rows = [lines[lines.index(head) + 2].split(" | "), lines[lines.index(head) + 3].split(" | ")]
    # B / 2B req/s: the last 200s of each end after 3 s
    assert rows[0][:5] == ["| 1", "kserve", "predicted", "yes", "99.7 / 49.7"] and rows[1][0] == "| 2"
    assert rows[0][TABLE("users")] == "4" and rows[0][TABLE("client errors")] == "1 (timeout 1)"
    assert rows[0][TABLE("health max ms")] == "1500.0"
    assert text.count("server counters over the overload: refused +40; predicted_wait_ms at its end: 41.0") == 2
    verdicts = [line for line in lines if line.startswith("- ")]
    assert [v.split(":")[0] for v in verdicts[:5]] == ["- FAIL only 200 or 503", "- PASS served", "- PASS refused fast",
                                                       "- FAIL recovered", "- FAIL health in time"]
    assert any(v.startswith("- PASS recovered") for v in verdicts[5:10])  # run 2 recovered
    assert verdicts[10:] == [
        "- FAIL only 200 or 503: 0 of 2 runs (failed: run 1, 2) (target: 504 ≤ 1% of the admitted, no other status, "
        "no client error, in every run)",
        "- PASS served: 2 of 2 runs (target: ≥ 0.85 × capacity, in every run)",
        "- PASS refused fast: 2 of 2 runs (target: 503 p99 ≤ 50 ms, in every run)",
        "- FAIL recovered: 1 of 2 runs (failed: run 1) (target: after p50 ≤ 1.1 × before p50, in every run)",
        "- FAIL health in time: 0 of 2 runs (failed: run 1, 2) (target: liveness and readiness answered 200 within "
        "1 s, in every run)"]
    assert "note: a note of run 2" in text and "note: a note" in lines[-1]
    single = overload_report.format_report(report())
    assert "over 1 runs" not in single and "over 2 runs" in text


def TABLE(column: str) -> int:
    return overload_report.TABLE_HEAD.index(column)


# ---- the soak: schedule, kill windows, slopes ----------------------------------------------------

def test_the_soak_bursts_every_interval_and_kills_half_way_between():
    events = soak.soak_schedule(1800.0, 300.0, 20.0)
    assert [at for at, kind in events if kind == "burst"] == [300.0, 600.0, 900.0, 1200.0, 1500.0]  # 1800 ends late
    assert [at for at, kind in events if kind == "kill"] == [150.0, 450.0, 750.0, 1050.0, 1350.0, 1650.0]
    assert events == sorted(events)
    short = soak.soak_schedule(60.0, 20.0, 5.0)
    assert short == [(10.0, "kill"), (20.0, "burst"), (30.0, "kill"), (40.0, "burst"), (50.0, "kill")]
    assert soak.soak_schedule(60.0, 20.0, 25.0) == [(10.0, "kill"), (20.0, "burst"), (30.0, "kill"),
                                                       (50.0, "kill")]  # 40 + 25 s would outlast the soak
    with pytest.raises(ValueError):
        soak.soak_schedule(60.0, 0.0, 5.0)


def test_a_request_in_flight_at_a_kill_or_sent_within_its_window_is_the_kills():
    windows = [(100.0, 112.0)]
    assert bench_users.in_windows(rec(99.0, 2000.0), windows)  # in flight at the kill
    assert bench_users.in_windows(rec(111.9, 5.0), windows) and bench_users.in_windows(rec(100.0, 1.0), windows)
    assert not bench_users.in_windows(rec(98.0, 1000.0), windows)  # answered before it
    assert not bench_users.in_windows(rec(112.5, 5.0), windows) and not bench_users.in_windows(rec(1.0), [])


def test_only_steady_samples_are_compared_for_slopes():
    events = [(150.0, "kill"), (300.0, "burst")]
    phase = [soak.sample_phase(t, 600.0, events, 20.0, 12.0) for t in (0.0, 150.0, 162.0, 163.0, 300.0, 332.0,
                                                                           333.0, 600.0, 601.0)]
    assert phase == ["steady", "kill", "kill", "steady", "burst", "burst", "steady", "steady", "after"]
    samples = [{**sample(t), "phase": "steady"} for t in range(0, 601, 30)]
    for i in (18, 19, 20):  # a burst at the end: its users' connections
        samples[i] = {**samples[i], "phase": "burst", "fds": 5000.0}
    found = soak.soak_verdicts(counts(ok=1), counts(ok=1), counts(), [{"pid": 1}], 1, samples, 200.0, [probe("/")])
    assert all(v.passed for v in found[3:6]) and "11 samples" in found[4].value
    for i in (18, 19, 20):
        samples[i]["phase"] = "steady"  # the same samples counted: an upward slope
    assert not soak.soak_verdicts(counts(ok=1), counts(ok=1), counts(), [{"pid": 1}], 1, samples, 200.0,
                                      [probe("/")])[4].passed


def noisy(n: int, slope: float, noise: float, level: float = 500.0, every: float = 30.0) -> list[tuple[float, float]]:
    """n points every `every` s: level + slope·t + a deterministic ±noise wobble."""
    return [(i * every, level + slope * i * every + noise * ((-1) ** i) * (1 + (i % 3)) / 2) for i in range(n)]


@pytest.mark.parametrize("key, points, passed", [
    ("pss_mib", noisy(41, 0.0, 5.0), True),  # flat, noisy
    ("pss_mib", noisy(41, 0.001, 5.0), True),  # +1.2 MiB in 20 min, within the noise and 1 % of 500 MiB
    ("pss_mib", noisy(41, 0.02, 5.0), False),  # +24 MiB in 20 min: a leak above the noise
    ("pss_mib", noisy(41, 0.02, 0.0), False),  # the same with no noise at all
    ("pss_mib", noisy(41, -0.02, 5.0), True),  # falling is no upward slope
    ("fds", noisy(41, 0.0, 0.0, 60.0), True), ("fds", [(i * 30.0, 60.0 + (i >= 40)) for i in range(41)], True),
    ("fds", [(i * 30.0, 60.0 + i // 10) for i in range(41)], False),  # one more file every 5 minutes
    ("shm_mib", noisy(41, 0.0, 0.0, 12.0), True),
    ("shm_mib", [(i * 30.0, 12.0 + 2.3 * (i // 10)) for i in range(41)], False),  # a segment left per kill
    ("pss_mib", noisy(2, 0.0, 0.0), False), ("fds", [(5.0, 1.0)] * 4, False),  # too few to fit a line
])
def test_no_upward_slope_allows_the_samples_noise_and_one_unit_of_resolution(key, points, passed):
    verdict = soak.slope_verdict(key, points)
    assert verdict.passed is passed, verdict.value
    assert verdict.name == f"no upward slope: {soak.RESOURCES[key][0]}"


def test_trend_is_least_squares_with_the_slopes_standard_error():
    line = soak.trend([(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)])
    assert line["slope_per_s"] == pytest.approx(2.0) and line["se_per_s"] == pytest.approx(0.0)
    assert line["span_s"] == 2.0 and line["mean"] == 3.0 and line["points"] == 3
    line = soak.trend([(0.0, 0.0), (1.0, 1.0), (2.0, 0.0), (3.0, 1.0)])
    assert line["slope_per_s"] == pytest.approx(0.2) and line["se_per_s"] == pytest.approx(math.sqrt(0.8 / 2 / 5))
    assert soak.trend([(0.0, 1.0), (1.0, 2.0)]) is None and soak.trend([(1.0, 1.0)] * 3) is None


def sample(t: float, pss: float = 800.0, fds: float = 70.0, shm: float = 12.0) -> dict:
    return {"t_s": t, "pss_mib": pss, "fds": fds, "shm_mib": shm, "segments": 3, "processes": 4}


def test_the_soaks_verdicts():
    good = counts(ok=5000, refused=300, late=10)
    inside = counts(ok=100, late=20)
    kills = [{"pid": 11}, {"pid": 12}]
    samples = [sample(t) for t in range(0, 601, 30)] + [{**sample(615.0), "pss_mib": None}]  # the server was down
    probes = [probe("/ping")]
    found = soak.soak_verdicts(good, good, inside, kills, 2, samples, 200.0, probes)
    assert [v.name for v in found] == ["every request answered", "504 rare outside kills", "instances killed",
                                       "no upward slope: PSS", "no upward slope: open files",
                                       "no upward slope: /dev/shm", "health in time"]
    assert all(v.passed for v in found), [v.line() for v in found]
    assert "inside: 20 = 16.7% of 120" in found[1].value and "14 samples" in found[3].value  # t ≥ 200 s only
    bad = soak.soak_verdicts(counts(ok=5000, late=60, errors={"reset": 1}), counts(ok=5000, late=60), inside,
                                 [{"pid": 11}, {"pid": None}], 2, [sample(t, pss=800.0 + t) for t in range(0, 601, 30)],
                                 200.0, [probe("/ping", ms=1200.0)])
    assert [v.passed for v in bad] == [False, False, False, False, True, True, False]
    assert "client errors 1 (reset 1)" in bad[0].value and "1 of 2 kills struck" in bad[2].value
    assert not soak.soak_verdicts(counts(ok=10, other=1), good, inside, kills, 2, samples, 0.0, probes)[0].passed
    none = soak.soak_verdicts(counts(), counts(), counts(), [], 0, [], 0.0, [])
    assert not any(v.passed for v in none)


def test_the_soak_report_has_its_events_samples_and_verdicts():
    cap = overload_report.closed_summary([rec(i * 0.01, 20.0) for i in range(300)], 3, users=4)
    c = counts(ok=5000, refused=300, late=10)
    found = soak.soak_verdicts(c, c, counts(), [{"pid": 11}], 1, [sample(t) for t in (0, 30, 60)], 0.0,
                                   [probe("/ping")])
    text = soak.format_soak_report({
        "model": "tiny", "engine": "kserve", "batch": 4, "payload": "v2-binary", "request_timeout_s": 2.0,
        "soak_s": 60.0, "capacity": cap, "capacity_runs": [cap, cap], "factor": 3.0, "duration_s": 5.0,
        "every_s": 20.0, "slow": False, "cores": 2, "sent": 5310, "counts": c, "outside_kills": c,
        "inside_kills": counts(), "p50_200_ms": 20.0, "p99_200_ms": 90.0,
        "events": [{"at_s": 10.0, "kind": "kill", "pid": 11, "sent": 40, "counts": counts(ok=40)},
                   {"at_s": 20.0, "kind": "burst", "sent": 900, "counts": c, "served_rps": 95.0}],
        "samples": [{**sample(t), "phase": "steady"} for t in (0, 30, 60)],
        "verdicts": [asdict(v) for v in found],
        "notes": ["a soak note"]})
    assert text.startswith("### soak: tiny on kserve") and "1 min at 0.8 × capacity 99.7 req/s" in text
    assert "| 10 | kill | 11 | 40 |" in text and "| 20 | burst | - | 900 |" in text and "| 95.0 |" in text
    assert "| 60 | steady | 800.0 | 70 | 12.00 | 3 | 4 |" in text
    assert "- PASS no upward slope: PSS" in text and "note: a soak note" in text


# ---- the command line ---------------------------------------------------------------------------

def test_parser_defaults_match_the_issue():
    args = build_parser().parse_args(["bench", "overload"])
    assert args.func is bench_overload.cmd_overload
    assert (args.model, args.engine, args.batch_size, args.payload, args.profile) == \
        ("resnet50", "kserve", 4, None, None)
    assert (args.request_timeout_s, args.max_queue, args.admission, args.slow) == (2.0, None, "predicted", False)
    assert (args.factor, args.duration, args.capacity_s, args.json) == (3.0, 20.0, 10.0, None)
    assert (args.runs, args.soak, args.soak_every, args.sample_every) == (1, None, 300.0, 30.0)
    args = build_parser().parse_args(["bench", "overload", "--engine", "torchserve", "--admission", "queue",
                                      "--max-queue", "50", "--slow", "--payload", "json", "--runs", "5"])
    assert (args.engine, args.admission, args.max_queue, args.slow, args.payload, args.runs) == \
        ("torchserve", "queue", 50, True, "json", 5)
    for payload in ("v2-json", "v2-binary", "raw", "jpeg"):
        assert build_parser().parse_args(["bench", "overload", "--payload", payload]).payload == payload
    args = build_parser().parse_args(["bench", "overload", "--soak", "30", "--soak-every", "20", "--sample-every", "5"])
    assert (args.soak, args.soak_every, args.sample_every) == (30.0, 20.0, 5.0)
    for wrong in (["--admission", "fifo"], ["--engine", "ray"], ["--factor", "0"], ["--max-queue", "0"],
                  ["--runs", "0"], ["--soak", "0"], ["--soak-every", "-1"], ["--payload", "v3"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", "overload", *wrong])


def test_a_soak_is_instead_of_the_runs():
    with pytest.raises(SystemExit, match="one or the other"):
        main(["bench", "overload", "--soak", "1", "--runs", "2"])


def test_the_admission_choices_are_the_settings():
    from dataclasses import fields

    from packrat.settings import ADMISSIONS, Settings

    assert "admission" in {f.name for f in fields(Settings)}  # what the archive is built with
    for rule in ADMISSIONS:
        assert build_parser().parse_args(["bench", "overload", "--admission", rule]).admission == rule


def test_help_says_what_it_measures_and_the_verdicts(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "overload", "--help"])
    text = capsys.readouterr().out
    assert "Overload benchmark (issues 56 and 64)" in text
    for words in ("open loop at --factor × capacity", "only 200 or 503", "0.85 × capacity", "p99 at most 50 ms",
                  "1.1 × p50 before", "packrat bench overload --model tiny", "then with 2B", "--runs",
                  "reset (ECONNRESET", "refused (ECONNREFUSED)", "/v2/health/ready", "/ping", "within 1 s",
                  "--soak MINUTES", "PSS", "/dev/shm", "no upward slope", "v2-binary", "Retry-After"):
        assert words in text, words
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "packrat bench overload --help" in capsys.readouterr().out


def test_the_command_and_its_measuring_import_no_torch():
    code = ("import sys; import packrat.cli.bench_overload, packrat.bench.overload; "
            "sys.exit('torch' in sys.modules or 'locust' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ---- --slow's processes -------------------------------------------------------------------------

@pytest.mark.slow
def test_cpu_hogs_are_pinned_and_gone_after_the_block_even_on_an_error():
    cores = sorted(os.sched_getaffinity(0))[:2]
    with pytest.raises(RuntimeError, match="boom"):
        with faults.cpu_hogs(cores) as pids:
            assert len(pids) == len(cores)
            assert [os.sched_getaffinity(pid) for pid in pids] == [{core} for core in cores]
            raise RuntimeError("boom")
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


@pytest.mark.slow
def test_a_cpu_hog_ends_when_its_parent_does():
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               f"p = subprocess.Popen([sys.executable, '-c', {faults.HOG!r}])\n"
                               "print(p.pid, flush=True)\ntime.sleep(0.5)"], stdout=subprocess.PIPE, text=True)
    hog = psutil.Process(int(parent.stdout.readline()))
    parent.wait(timeout=30)
    hog.wait(timeout=30)  # orphaned: it sees its parent change and stops


# ---- open loop against a stub server -------------------------------------------------------------

class Answer200(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.do_GET()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass


@pytest.fixture
def stub():
    server = QuietServer(("127.0.0.1", 0), Answer200)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.integration
def test_a_rate_paces_the_users_from_spread_starts(stub, tmp_path):
    from packrat.loadtest import run_locust

    log = tmp_path / "requests.tsv"
    users, rate = 20, 20.0  # each user one request a second; closed loop they would send thousands
    r = run_locust(stub, "tiny", users, 2, tmp_path, payload=(b"x", "application/octet-stream"), request_log=log,
                   rate=rate, stop_timeout_s=5)
    records = read_request_log(log)
    assert 0 < len(records) == r.requests <= users * 3  # a random start in the first second, then one a second
    assert {x.status for x in records} == {200}
    firsts = sorted(x.start for x in records)[:users]
    assert firsts[-1] - firsts[0] > 0.2  # spread over the first period, not a burst of every user at once
    with pytest.raises(ValueError, match="open-loop rate"):
        run_locust(stub, "tiny", 2, 1, tmp_path, payload=(b"x", "text/plain"), rate=0.0)


class Misbehaving:
    """A raw TCP server that reads each request and then, by mode: closes the connection (reset),
    resets it (RST), says nothing (the client times out) or answers 503 with a Retry-After."""

    def __init__(self, mode: str):
        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while conn.recv(65536):
                if self.mode == "close":
                    return
                if self.mode == "rst":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    return
                if self.mode == "hang":
                    time.sleep(10)
                    return
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 2\r\n\r\n{}")


@pytest.mark.integration
@pytest.mark.parametrize("mode, expected", [("refused", "refused"), ("close", "reset"), ("rst", "reset"),
                                            ("hang", "timeout")])
def test_locusts_client_errors_are_logged_with_their_class(mode, expected, tmp_path):
    from packrat.loadtest import run_locust

    if mode == "refused":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}"
    else:
        url = Misbehaving(mode).url
    log = tmp_path / "requests.tsv"
    run_locust(url, "tiny", 2, 1, tmp_path, payload=(b"x", "application/octet-stream"), request_log=log,
               timeout_s=0.5)
    records = read_request_log(log)
    assert records and {(r.status, r.error) for r in records} == {(0, expected)}
    assert bench_users.status_classes(records)["errors"] == {expected: len(records)}
    assert expected in overload_report.statuses_verdict(bench_users.status_classes(records)).value


@pytest.mark.integration
def test_closed_loop_users_wait_a_503s_retry_after_and_open_loop_ones_do_not(tmp_path):
    from packrat.loadtest import run_locust

    server = Misbehaving("503")
    log = tmp_path / "closed.tsv"
    run_locust(server.url, "tiny", 2, 2, tmp_path / "closed", payload=(b"x", "application/octet-stream"),
               request_log=log, retry_after_s=overload.RETRY_AFTER_MAX_S)
    waited = read_request_log(log)
    assert {r.status for r in waited} == {503} and len(waited) <= 2 * 3  # a request a second per user, at most
    log = tmp_path / "eager.tsv"
    run_locust(server.url, "tiny", 2, 2, tmp_path / "eager", payload=(b"x", "application/octet-stream"),
               request_log=log)  # no retry_after_s: again at once
    assert len(read_request_log(log)) > 50


# ---- a real run ----------------------------------------------------------------------------------

PROFILE = "# model: tiny\n# mode: script\nthreads,batch,latency_ms\n" + "".join(
    f"{t},{b},{b * 2.0 / t ** 0.5}\n" for t in (1, 2) for b in (1, 2, 4))


def gone(run_dir: Path, started: float) -> list[int]:
    """Processes of the run still there."""
    return [p.pid for p in psutil.process_iter(["cmdline", "create_time"])
            if p.info["create_time"] >= started - 1 and str(run_dir) in " ".join(p.info["cmdline"] or [])]


@pytest.mark.integration
@pytest.mark.slow
def test_two_short_runs_on_the_tiny_model_behind_kserve_with_binary_v2_bodies(tmp_path, capsys):
    pytest.importorskip("kserve", reason="the KServe front end is an optional extra: pip install 'packrat[kserve]'")
    (tmp_path / "tiny.csv").write_text(PROFILE)
    out = tmp_path / "report.json"
    started = time.time()
    assert main(["bench", "overload", "--model", "tiny", "--profile", str(tmp_path / "tiny.csv"), "--payload",
                 "v2-binary", "--capacity-s", "2", "--duration", "3", "--warmup", "2", "--factor", "2", "--runs", "2",
                 "--out", str(tmp_path / "runs"), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["engine"] == "kserve" and report["admission"] == "predicted" and report["request_timeout_s"] == 2.0
    assert report["payload"] == "v2-binary" and [r["run"] for r in report["runs"]] == [1, 2]
    for run in report["runs"]:
        before, over, after = run["before"], run["overload"], run["after"]
        assert [c["users"] for c in run["capacity_runs"]] == [4, 8]
        assert before["rps"] == max(c["rps"] for c in run["capacity_runs"]) > 0
        assert after["users"] == before["users"] and after["p50_ms"] > 0 and run["after_over_before"] > 0
        assert over["rate_rps"] == pytest.approx(2 * before["rps"])
        assert over["users"] == bench_users.open_loop_users(over["rate_rps"], 2.0, 4)
        records = read_request_log(tmp_path / "runs" / "kserve-predicted" / f"run{run['run']}" / "overload" /
                                   "requests.tsv")
        assert over["sent"] == len(records) == sum(over["by_status"].values()) > 0
        # the tiny model at hundreds of requests a second: locust on the same 2 cores may time out, so no
        # "every request answered" here; but each no-answer is classed, and every answer is the v2 route's
        assert over["counts"]["client_error"] == sum(bool(r.client_error) for r in records) == \
            over["by_status"].get("0", 0) and set(over["counts"]["errors"]) <= set(bench_users.ERROR_CLASSES)
        assert over["counts"]["other"] == 0 and over["counts"]["200"] > 0  # no 400: the v2 route took every body
        assert [v["name"] for v in run["verdicts"]] == ["only 200 or 503", "served", "refused fast", "recovered",
                                                        "health in time"]
        assert set(run["probes"]) == {"/v2/health/live", "/v2/health/ready", "/v2/models/tiny/ready"}
        assert all(p["probes"] > 0 and "200" in p["by_status"] for p in run["probes"].values())
        assert {"start", "before", "overload", "after"} <= set(run["health"])
        assert "answered" in run["health"]["overload_delta"]
    assert len(report["verdicts"]) == 5 and all("of 2 runs" in v["value"] for v in report["verdicts"])
    assert report["passed"] == all(run["passed"] for run in report["runs"])
    assert report["plan"]["instances"] and "| 2 | kserve | predicted | no |" in report["markdown"]
    assert report["markdown"] in capsys.readouterr().out
    assert not gone(tmp_path / "runs", started)


@pytest.mark.integration
@pytest.mark.slow
def test_a_short_soak_on_the_tiny_model_behind_kserve(tmp_path):
    pytest.importorskip("kserve", reason="the KServe front end is an optional extra: pip install 'packrat[kserve]'")
    (tmp_path / "tiny.csv").write_text(PROFILE)
    out = tmp_path / "soak.json"
    started = time.time()
    assert main(["bench", "overload", "--model", "tiny", "--profile", str(tmp_path / "tiny.csv"), "--payload", "raw",
                 "--instance-kind", "process", "--capacity-s", "2", "--warmup", "2", "--duration", "2",
                 "--soak", "0.3", "--soak-every", "8", "--sample-every", "2",
                 "--out", str(tmp_path / "runs"), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["soak_s"] == 18.0 and [e["kind"] for e in report["events"]] == ["kill", "burst", "kill", "burst"]
    assert report["sent"] > 0 and report["counts"]["200"] > 0
    kills = [e for e in report["events"] if e["kind"] == "kill"]
    assert all(e["pid"] for e in kills) and len({e["pid"] for e in kills}) == 2  # process instances, each new
    assert len(report["samples"]) >= 8 and all(s["pss_mib"] > 0 and s["fds"] > 0 for s in report["samples"])
    assert {s["phase"] for s in report["samples"]} >= {"steady", "burst", "kill", "after"}
    assert [v["name"] for v in report["verdicts"]] == [
        "every request answered", "504 rare outside kills", "instances killed", "no upward slope: PSS",
        "no upward slope: open files", "no upward slope: /dev/shm", "health in time"]
    assert next(v for v in report["verdicts"] if v["name"] == "instances killed")["passed"]
    assert "### soak: tiny on kserve" in report["markdown"]
    assert not gone(tmp_path / "runs", started)


def test_a_refusals_cost_is_the_front_ends_time_beyond_what_its_200s_cost_before():
    """Before: 100 answers in 2 s of front end and 5 s of instances (20 and 50 ms each). During the
    overload: 100 answers and 400 refusals in 3 s of front end: 1 s beyond the answers' 2 s, 2.5 ms a
    refusal; the instances' 5 s for the same answers: refusals cost them nothing."""
    before = {"by_status": {"200": 100}}
    over = {"counts": {"200": 100, "503": 400}}
    cost = resources.refusal_cost({"front_end": 2.0, "instances": 5.0},
                                 {"front_end": 3.0, "instances": 5.0, "machine": 18.0}, [before], over, 10.0)
    assert cost["others_cores_overload"] == pytest.approx(1.0)  # 18 - 3 - 5 core-seconds over 10 s
    assert cost["ms_per_200_before"] == pytest.approx({"front_end": 20.0, "instances": 50.0})
    assert cost["ms_per_200_overload"]["instances"] == pytest.approx(50.0)
    assert cost["front_end_ms_per_503"] == pytest.approx(2.5)
    assert "a refusal cost the front end about 2.50 ms" in resources.cost_line(cost)
    none = resources.refusal_cost({"front_end": 2.0}, {"front_end": 3.0}, [before], {"counts": {"200": 100, "503": 0}})
    assert none["front_end_ms_per_503"] is None  # no refusal: no cost to say
    both = resources.refusal_cost({"front_end": 2.0, "instances": 5.0}, {"front_end": 3.0, "instances": 5.0},
                                 [before, {"by_status": {"200": 150, "503": 3}}], over)
    assert both["ms_per_200_before"] == pytest.approx({"front_end": 8.0, "instances": 20.0})  # the CPU spans both runs
