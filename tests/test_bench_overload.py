"""packrat bench overload (packrat/bench/overload.py): its pure parts (counts by status, percentiles,
summaries, the open-loop user count, the verdicts, where they pass and where they must not), its
command line, the CPU-bound processes of --slow, locust's open-loop rate against a stub server, and
one short real run on the tiny model behind the KServe server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest

from packrat.bench import overload
from packrat.cli import bench_overload
from packrat.cli.main import build_parser, main
from packrat.loadtest.requestlog import RequestRecord, read_request_log


def rec(start: float, ms: float = 10.0, status: int = 200) -> RequestRecord:
    return RequestRecord(start, ms, status, status != 200, "" if status == 200 else "x")


def counts(ok=0, refused=0, late=0, other=0, no_answer=0) -> dict:
    return {"200": ok, "503": refused, "504": late, "other": other + no_answer, "no_answer": no_answer}


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
    assert overload.percentile(values, q) == expected


def test_status_classes_put_everything_else_and_no_answer_under_other():
    records = [rec(0), rec(0), rec(0, status=503), rec(0, status=504), rec(0, status=0), rec(0, status=500),
               rec(0, status=429)]
    got = overload.status_classes(records)
    assert got == {"200": 2, "503": 1, "504": 1, "other": 3, "no_answer": 1}
    assert overload.admitted(got) == 6 and overload.share_504(got) == pytest.approx(1 / 6)
    assert overload.by_status(records) == {"200": 2, "503": 1, "504": 1, "0": 1, "500": 1, "429": 1}
    assert overload.status_classes([]) == counts()
    assert overload.share_504(counts(refused=5)) is None  # nothing admitted


@pytest.mark.parametrize("rate, timeout, batch, users", [
    (100.0, 2.0, 4, 300),  # rate × (deadline + 1 s)
    (10.0, 2.0, 4, 30), (0.5, 2.0, 4, 4),  # at least the closed loop's B
    (33.3, 2.0, 1, 100),  # rounded up: 99.9 → 100
    (60.0, 0.5, 8, 90), (0.0, 2.0, 2, 2),
])
def test_open_loop_users_keep_the_pace_while_answers_take_the_deadline(rate, timeout, batch, users):
    assert overload.open_loop_users(rate, timeout, batch) == users


def test_rates_count_answers_within_the_phases_whole_seconds_from_its_first_request():
    records = [rec(100.0, 50), rec(100.5, 400), rec(101.0, 900), rec(101.2, 900, 503), rec(101.5, 800)]
    # ends: 100.05, 100.9, 101.9, 102.1 (a 503), 102.3: within 2 s of 100.0 are three 200s
    assert overload.answered_within(records, 2) == 3 and overload.answered_within(records, 3) == 4
    assert overload.answered_within(records, 3, status=503) == 1
    assert overload.sent_within(records, 1) == 3 and overload.sent_within(records, 2) == 5
    assert overload.answered_within([], 3) == overload.sent_within([], 3) == 0
    assert [overload.run_seconds(d) for d in (0.2, 1, 2.5, 3)] == [1, 1, 3, 3]  # locust's run time


def test_summaries():
    closed = [rec(0.0 + i * 0.1, 20.0 + i) for i in range(20)] + [rec(1.0, 5.0, 504)]
    before = overload.closed_summary(closed, 2, users=8)
    assert before["rps"] == 10.0 and before["requests"] == 21 and before["users"] == 8
    assert before["p50_ms"] == 29.0 and before["p99_ms"] == 39.0  # the 200s' only
    assert before["by_status"] == {"200": 20, "504": 1}
    records = ([rec(i * 0.01, 100.0) for i in range(100)] + [rec(0.5, 3.0 + i % 5, 503) for i in range(50)]
               + [rec(0.2, 2100.0, 504), rec(0.3, 7000.0, 0)])
    over = overload.overload_summary(records, 1, capacity_rps=100.0, rate_rps=300.0, users=900)
    assert over["counts"] == counts(ok=100, refused=50, late=1, no_answer=1)
    assert over["sent"] == 152 and over["admitted"] == 102 and over["share_504"] == pytest.approx(1 / 102)
    assert over["served_rps"] == 91.0 and over["served_ratio"] == pytest.approx(0.91)  # ends after 1 s left out
    assert (over["p50_503_ms"], over["p99_503_ms"]) == (5.0, 7.0)
    assert (over["p50_200_ms"], over["p99_200_ms"]) == (100.0, 100.0)
    assert over["rate_rps"] == 300.0 and over["users"] == 900 and over["sent_rps"] == 152.0
    empty = overload.overload_summary([], 5, capacity_rps=0.0, rate_rps=0.0, users=8)
    assert empty["sent"] == 0 and empty["served_ratio"] is None and empty["p99_503_ms"] is None


# ---- verdicts ----------------------------------------------------------------------------------

@pytest.mark.parametrize("given, passed, says", [
    (counts(ok=900, refused=100), True, "504: 0 = 0.0% of 900 admitted"),
    (counts(ok=990, late=10, refused=500), True, "1.0% of 1000"),  # exactly 1 %
    (counts(ok=98, late=2, refused=500), False, "2.0% of 100"),  # 2 % of the admitted
    (counts(ok=1000, other=1), False, "other: 1"),  # a 500, a 429...
    (counts(ok=1000, no_answer=1), False, "1 no answer"),  # no answer is no 503 either
    (counts(refused=100), True, "nothing admitted"),  # the served verdict fails that one
    (counts(), False, "no request was sent"),
    (counts(no_answer=40), False, "no request was answered (40 sent)"),
])
def test_only_200_or_503(given, passed, says):
    verdict = overload.statuses_verdict(given)
    assert verdict.passed is passed and says in verdict.value


@pytest.mark.parametrize("served, capacity, passed, says", [
    (85.0, 100.0, True, "0.85 ×"), (100.0, 100.0, True, "1.00 ×"), (250.0, 100.0, True, "2.50 ×"),
    (84.0, 100.0, False, "0.84 ×"), (0.0, 100.0, False, "0.00 ×"), (None, 100.0, False, "0.00 ×"),
    (50.0, 0.0, False, "no capacity measured"), (50.0, None, False, "no capacity measured"),
])
def test_served_at_least_0_85_of_capacity(served, capacity, passed, says):
    verdict = overload.served_verdict(served, capacity)
    assert verdict.passed is passed and says in verdict.value


@pytest.mark.parametrize("p99, given, passed, says", [
    (12.0, counts(ok=10, refused=5), True, "503 p99 12.0 ms over 5"),
    (50.0, counts(ok=10, refused=5), True, "50.0 ms"),
    (50.1, counts(ok=10, refused=5), False, "50.1 ms"),
    (4000.0, counts(refused=5), False, "4000.0 ms"),
    (None, counts(ok=10), True, "no 503s"),  # passes, and says so
    (None, counts(ok=10, late=2, no_answer=3), True, "no 503s"),
    (None, counts(), False, "no request was answered"),  # no answer at all fails rather than passes
    (None, counts(no_answer=7), False, "no request was answered"),
    (None, counts(refused=3), False, "without latencies"),
])
def test_refused_fast(p99, given, passed, says):
    verdict = overload.refusals_verdict(p99, given)
    assert verdict.passed is passed and says in verdict.value


@pytest.mark.parametrize("before, after, passed, says", [
    (20.0, 20.0, True, "1.00×"), (20.0, 22.0, True, "1.10×"), (20.0, 15.0, True, "0.75×"),
    (20.0, 22.2, False, "1.11×"), (20.0, 40.0, False, "2.00×"),
    (None, 20.0, False, "no p50 before"), (0.0, 20.0, False, "no p50 before"), (20.0, None, False, "no p50 after"),
])
def test_recovered(before, after, passed, says):
    verdict = overload.recovery_verdict(before, after)
    assert verdict.passed is passed and says in verdict.value


def test_a_run_with_no_answers_fails_every_verdict():
    before = overload.closed_summary([rec(0, 1, 0)] * 3, 3, users=8)
    over = overload.overload_summary([rec(0, 7000, 0)] * 5, 5, before["rps"], 0.0, 8)
    after = overload.closed_summary([], 3, users=8)
    assert [v.passed for v in overload.verdicts(before, over, after)] == [False, False, False, False]


def test_a_good_run_passes_every_verdict():
    before = overload.closed_summary([rec(i * 0.01, 20.0) for i in range(300)], 3, users=8)
    records = [rec(i * 0.005, 900.0) for i in range(500)] + [rec(i * 0.01, 3.0, 503) for i in range(400)]
    over = overload.overload_summary(records, 5, before["rps"], 3 * before["rps"], 900)
    after = overload.closed_summary([rec(i * 0.01, 21.0) for i in range(300)], 3, users=8)
    found = overload.verdicts(before, over, after)
    assert [v.name for v in found] == ["only 200 or 503", "served", "refused fast", "recovered"]
    assert all(v.passed for v in found), [v.line() for v in found]


# ---- the server's counters, the report ---------------------------------------------------------

def test_counters_keep_whatever_scalars_the_health_has_and_deltas_the_counts():
    status = {"plan": {"instances": [{"cores": [2, 3]}, {"cores": [0]}]},
              "health": {"answered": 10, "refused": 2, "unavailable": None, "predicted_wait_ms": 12.5,
                         "stage_ms": {"total": 1.0}, "kinds": [{}], "admitted": 12}}
    before = overload.counters(status)
    assert before == {"answered": 10, "refused": 2, "unavailable": None, "predicted_wait_ms": 12.5, "admitted": 12}
    after = {"answered": 30, "refused": 9, "predicted_wait_ms": 80.0, "expired": 1}  # admitted absent: left out
    assert overload.counter_delta(before, after) == {"answered": 20, "refused": 7}
    assert overload.counters(None) == overload.counters({}) == {}
    assert overload.instance_cores(status) == [0, 2, 3] and overload.instance_cores(None) == []


def report(**more) -> dict:
    before = overload.closed_summary([rec(i * 0.01, 20.0) for i in range(300)], 3, users=8)
    records = [rec(i * 0.005, 900.0) for i in range(500)] + [rec(i * 0.01, 3.0, 503) for i in range(40)]
    over = overload.overload_summary(records + [rec(1, 9000, 0)], 5, before["rps"], 300.0, 900)
    after = overload.closed_summary([rec(i * 0.01, 30.0) for i in range(300)], 3, users=8)
    return {"model": "tiny", "engine": "kserve", "batch": 4, "payload": "raw", "request_timeout_s": 2.0,
            "max_queue": None, "default_max_queue": 1000, "admission": "predicted", "slow": True,
            "slow_cores": [0, 1], "factor": 3.0, "cores": 2, "before": before, "overload": over, "after": after,
            "after_over_before": 1.5, "health": {"overload": {"predicted_wait_ms": 41.0},
                                                 "overload_delta": {"refused": 40, "expired": 0}},
            "verdicts": [overload.asdict(v) for v in overload.verdicts(before, over, after)],
            "notes": ["a note"], **more}


def test_the_report_has_the_row_the_counters_and_a_line_per_verdict():
    text = overload.format_report(report())
    lines = text.splitlines()
    assert "max_queue 1000 (default)" in lines[0] and "slowed by 2 CPU-bound process(es) on cores 0,1" in lines[0]
    head = next(line for line in lines if line.startswith("| engine"))
    assert head.count("|") == len(overload.TABLE_HEAD) + 1
    row = lines[lines.index(head) + 2].split(" | ")
    assert row[:3] == ["| kserve", "predicted", "yes"] and "1 (1 no answer)" in row
    assert "server counters over the overload: refused +40; predicted_wait_ms at its end: 41.0" in text
    verdicts = [line for line in lines if line.startswith("- ")]
    assert [v.split(":")[0] for v in verdicts] == ["- FAIL only 200 or 503", "- PASS served", "- PASS refused fast",
                                                   "- FAIL recovered"]
    assert "note: a note" in text
    assert overload.format_table([report(), report(admission="queue")]).count("| kserve |") == 2


# ---- the command line ---------------------------------------------------------------------------

def test_parser_defaults_match_the_issue():
    args = build_parser().parse_args(["bench", "overload"])
    assert args.func is bench_overload.cmd_overload
    assert (args.model, args.engine, args.batch_size, args.payload, args.profile) == \
        ("resnet50", "kserve", 4, None, None)
    assert (args.request_timeout_s, args.max_queue, args.admission, args.slow) == (2.0, None, "predicted", False)
    assert (args.factor, args.duration, args.capacity_s, args.json) == (3.0, 20.0, 10.0, None)
    args = build_parser().parse_args(["bench", "overload", "--engine", "torchserve", "--admission", "queue",
                                      "--max-queue", "50", "--slow", "--payload", "json"])
    assert (args.engine, args.admission, args.max_queue, args.slow, args.payload) == \
        ("torchserve", "queue", 50, True, "json")
    for wrong in (["--admission", "fifo"], ["--engine", "ray"], ["--factor", "0"], ["--max-queue", "0"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", "overload", *wrong])


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
    assert "Overload benchmark (issue 56)" in text
    for words in ("open loop at --factor × capacity", "only 200 or 503", "0.85 × capacity", "p99 at most 50 ms",
                  "1.1 × p50 before", "packrat bench overload --model tiny"):
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
        with overload.cpu_hogs(cores) as pids:
            assert len(pids) == len(cores)
            assert [os.sched_getaffinity(pid) for pid in pids] == [{core} for core in cores]
            raise RuntimeError("boom")
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


@pytest.mark.slow
def test_a_cpu_hog_ends_when_its_parent_does():
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               f"p = subprocess.Popen([sys.executable, '-c', {overload.HOG!r}])\n"
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


# ---- a real run ----------------------------------------------------------------------------------

PROFILE = "# model: tiny\n# mode: script\nthreads,batch,latency_ms\n" + "".join(
    f"{t},{b},{b * 2.0 / t ** 0.5}\n" for t in (1, 2) for b in (1, 2, 4))


@pytest.mark.integration
@pytest.mark.slow
def test_a_short_run_on_the_tiny_model_behind_kserve(tmp_path, capsys):
    pytest.importorskip("kserve", reason="the KServe front end is an optional extra: pip install 'packrat[kserve]'")
    (tmp_path / "tiny.csv").write_text(PROFILE)
    out = tmp_path / "report.json"
    started = time.time()
    assert main(["bench", "overload", "--model", "tiny", "--profile", str(tmp_path / "tiny.csv"), "--payload", "raw",
                 "--capacity-s", "3", "--duration", "5", "--warmup", "2", "--factor", "2",
                 "--out", str(tmp_path / "runs"), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["engine"] == "kserve" and report["admission"] == "predicted" and report["request_timeout_s"] == 2.0
    before, over, after = report["before"], report["overload"], report["after"]
    assert before["rps"] > 0 and before["p50_ms"] > 0 and after["p50_ms"] > 0 and report["after_over_before"] > 0
    assert over["rate_rps"] == pytest.approx(2 * before["rps"])
    assert over["users"] == overload.open_loop_users(over["rate_rps"], 2.0, 4)
    for key in ("sent", "sent_rps", "counts", "by_status", "admitted", "share_504", "served_rps", "served_ratio",
                "p50_503_ms", "p99_503_ms", "p50_200_ms", "p99_200_ms"):
        assert key in over, key
    records = read_request_log(tmp_path / "runs" / "kserve-predicted" / "overload" / "requests.tsv")
    assert over["sent"] == len(records) == sum(over["by_status"].values()) > 0
    assert all(r.status > 0 for r in records), over["by_status"]  # every request answered with an HTTP status
    assert over["counts"]["no_answer"] == 0
    assert [v["name"] for v in report["verdicts"]] == ["only 200 or 503", "served", "refused fast", "recovered"]
    assert report["passed"] == all(v["passed"] for v in report["verdicts"])
    assert {"start", "before", "overload", "after"} <= set(report["health"])
    assert "answered" in report["health"]["overload"] and "answered" in report["health"]["overload_delta"]
    assert report["plan"]["instances"] and "| kserve | predicted | no |" in report["markdown"]
    assert report["markdown"] in capsys.readouterr().out
    # the server is gone: no process of this run is left
    run_dir = str(tmp_path / "runs")
    assert not [p.pid for p in psutil.process_iter(["cmdline", "create_time"])
                if p.info["create_time"] >= started - 1 and run_dir in " ".join(p.info["cmdline"] or [])]


def test_a_refusals_cost_is_the_front_ends_time_beyond_what_its_200s_cost_before():
    """Before: 100 answers in 2 s of front end and 5 s of instances (20 and 50 ms each). During the
    overload: 100 answers and 400 refusals in 3 s of front end: 1 s beyond the answers' 2 s, 2.5 ms a
    refusal; the instances' 5 s for the same answers: refusals cost them nothing."""
    before = {"by_status": {"200": 100}}
    over = {"counts": {"200": 100, "503": 400}}
    cost = overload.refusal_cost({"front_end": 2.0, "instances": 5.0},
                                 {"front_end": 3.0, "instances": 5.0, "machine": 18.0}, before, over, 10.0)
    assert cost["others_cores_overload"] == pytest.approx(1.0)  # 18 - 3 - 5 core-seconds over 10 s
    assert cost["ms_per_200_before"] == pytest.approx({"front_end": 20.0, "instances": 50.0})
    assert cost["ms_per_200_overload"]["instances"] == pytest.approx(50.0)
    assert cost["front_end_ms_per_503"] == pytest.approx(2.5)
    assert "a refusal cost the front end about 2.50 ms" in overload.cost_line(cost)
    none = overload.refusal_cost({"front_end": 2.0}, {"front_end": 3.0}, before, {"counts": {"200": 100, "503": 0}})
    assert none["front_end_ms_per_503"] is None  # no refusal: no cost to say
