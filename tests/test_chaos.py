"""packrat bench chaos (packrat/bench/chaos.py), its pure parts: fault schedule, attributing failures
to fault windows, summaries and tables, and its command line (no server, no locust)."""

from __future__ import annotations

import argparse
import math
import time

import psutil
import pytest

from packrat.bench import chaos, chaos_faults, harness, resources, results
from packrat.bench.users import by_status
from packrat.cli import bench_chaos
from packrat.cli.main import build_parser, main
from packrat.loadtest.requestlog import RequestRecord, format_record, one_line, parse_line, read_request_log


def rec(start, ms=100.0, status=200, reason=""):
    return RequestRecord(start, ms, status, status != 200, reason)


# ---- parsing and schedule ----------------------------------------------------------------------

def test_parse_faults_keeps_order_drops_duplicates_and_rejects_unknown():
    assert bench_chaos.parse_faults("stop, kill,stop") == ["stop", "kill"]
    assert bench_chaos.parse_faults(",".join(chaos.FAULT_KINDS)) == list(chaos.FAULT_KINDS)
    with pytest.raises(argparse.ArgumentTypeError, match="unknown fault 'nap'"):
        bench_chaos.parse_faults("kill,nap")
    with pytest.raises(argparse.ArgumentTypeError):
        bench_chaos.parse_faults("")


def test_schedule_cycles_kinds_every_interval_before_the_end():
    assert chaos.fault_schedule(["kill", "stop"], 5, 20) == [(5, "kill"), (10, "stop"), (15, "kill")]
    assert chaos.fault_schedule(["kill"], 5, 21) == [(5, "kill"), (10, "kill"), (15, "kill"), (20, "kill")]
    default = chaos.fault_schedule(list(chaos.FAULT_KINDS), 15, 300)
    assert len(default) == 19 and default[-1] == (285, "worker")  # 15, 30, ..., 285: the 19th is kinds[18 % 5]
    assert [kind for _, kind in default[:6]] == [*chaos.FAULT_KINDS, "kill"]
    assert chaos.fault_schedule(["kill"], 30, 20) == []  # no fault fits
    with pytest.raises(ValueError):
        chaos.fault_schedule(["kill"], 0, 20)


def test_reconfigure_alternates_half_and_full_batch():
    assert [chaos_faults.reconfigure_target(n, 4) for n in range(4)] == [2, 4, 2, 4]
    assert [chaos_faults.reconfigure_target(n, 1) for n in range(3)] == [1, 1, 1]  # B//2 is at least 1
    assert chaos_faults.reconfigure_target(0, 5) == 2


def test_one_users_pattern():
    assert bench_chaos.one_users_pattern("2B").users(4) == 8
    assert bench_chaos.one_users_pattern("3").users(4) == 3
    with pytest.raises(argparse.ArgumentTypeError):
        bench_chaos.one_users_pattern("B,2B")


def test_parser_defaults_match_the_issue():
    args = build_parser().parse_args(["bench", "chaos"])
    assert args.func is bench_chaos.cmd_chaos
    assert (args.model, args.batch_size, args.users.users(args.batch_size), args.duration, args.every) == \
        ("resnet50", 4, 8, 300.0, 15.0)
    assert args.faults == list(chaos.FAULT_KINDS) and args.stop_s == 20 and args.request_timeout == 120
    assert (args.payload, args.handler, args.soak, args.sample_every) == ("jpeg", "packrat", False, 30.0)


def test_the_payload_choices_are_the_codecs():
    from packrat.codec.payloads import PAYLOAD_KINDS

    assert bench_chaos.PAYLOADS == PAYLOAD_KINDS


def test_the_stock_handler_takes_only_the_worker_fault_before_anything_starts():
    with pytest.raises(SystemExit, match="--handler stock has no pool: only --faults worker applies"):
        main(["bench", "chaos", "--handler", "stock", "--faults", "worker,kill"])


def test_help_is_the_module_docstring_with_examples(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "chaos", "--help"])
    text = capsys.readouterr().out
    assert "Chaos and soak benchmark (issue 16)" in text and "double-kill  kill -9 of an instance" in text
    assert "packrat bench chaos --soak --duration 600" in text and "benchmarks/chaos.py" not in text


# ---- attribution -------------------------------------------------------------------------------

def test_window_index_uses_the_last_fault_at_or_before():
    faults = [10.0, 20.0, 30.0]
    assert [chaos.window_index(t, faults) for t in (0, 9.99, 10, 15, 20, 29, 31, 1e9)] == [-1, -1, 0, 0, 1, 1, 2, 2]
    assert chaos.window_index(5, []) == -1


def test_failures_go_to_the_window_their_answer_arrived_in():
    # Sent before fault 0 (t=10) but answered after it: fault 0's; answered before it: before faults.
    records = [rec(9.0, 2000, 503, "no instance"), rec(8.0, 1000, 503, "x"), rec(12.0), rec(21.0, 100, 0, "reset"),
               rec(25.0, 100, 504)]
    windows = chaos.by_window(records, [10.0, 20.0])
    assert [r.start for r in windows[-1]] == [8.0]
    assert [r.start for r in windows[0]] == [9.0, 12.0]
    assert by_status(windows[0], failed_only=True) == {"503": 1}
    assert by_status(windows[1], failed_only=True) == {"0": 1, "504": 1}
    assert by_status(records, failed_only=True) == {"503": 2, "0": 1, "504": 1}  # commonest first


def test_a_request_stranded_by_a_fault_is_that_faults_even_when_it_ends_windows_later():
    stranded = rec(9.5, 25_000, 0, "timed out")  # in flight at fault 0 (t=10), given up on after fault 1
    assert [r.start for r in chaos.by_window([stranded], [10.0, 20.0])[0]] == [9.5]


def test_reason_counts_and_late_count():
    records = [rec(0, 10, 503, "a"), rec(0, 10, 503, "a"), rec(0, 10, 504, "late"), rec(0, 10)]
    assert chaos.reason_counts(records) == {"503: a": 2, "504: late": 1}
    assert list(chaos.reason_counts(records, top=1)) == ["503: a"]
    slow = [rec(0, 120_000.0), rec(0, 120_001.0), rec(0, 200_000.0, 504, "deadline"), rec(0, 5)]
    assert chaos.late_count(slow, 120) == 2  # strictly later than the deadline, any status


# ---- summaries -----------------------------------------------------------------------------------

def test_summarise_kinds_medians_maxima_and_unrecovered():
    faults = [
        {"kind": "kill", "recovery_s": 2.0, "window_failures": {}},
        {"kind": "stop", "recovery_s": None, "window_failures": {"504": 2}},
        {"kind": "kill", "recovery_s": 6.0, "window_failures": {"503": 1}},
        {"kind": "kill", "recovery_s": 3.0, "window_failures": {"503": 2, "0": 1}},
    ]
    rows = chaos.summarise_kinds(faults, chaos.FAULT_KINDS)
    assert [r["kind"] for r in rows] == ["kill", "stop"]  # kinds that never fired are left out
    kill, stop = rows
    assert kill == {"kind": "kill", "count": 3, "failed": {"503": 3, "0": 1}, "recovery_s_median": 3.0,
                    "recovery_s_max": 6.0, "not_recovered": 0}
    assert stop["recovery_s_median"] is None and stop["recovery_s_max"] is None and stop["not_recovered"] == 1


def test_rss_ratio_and_segment_owner():
    assert chaos.rss_ratio(150.0, 100.0) == 1.5
    assert chaos.rss_ratio(None, 100.0) is None and chaos.rss_ratio(100.0, 0.0) is None
    assert resources.segment_owner("packrat-1234-7") == 1234
    assert resources.segment_owner("psm_abc123") is None and resources.segment_owner("packrat-x-1") is None


def test_soak_rows_count_requests_answered_by_each_sample():
    records = [rec(1.0), rec(2.0, 100, 503, "x"), rec(40.0), rec(70.0, 100, 0, "reset")]
    samples = [{"time": 0.5, "rss_mb": 1.0}, {"time": 31.0, "rss_mb": 2.0}, {"time": 100.0, "rss_mb": 3.0}]
    rows = chaos.soak_rows(samples, records, t0=1.0)
    assert [(r["t_s"], r["requests_so_far"], r["failures_so_far"]) for r in rows] == \
        [(-0.5, 0, 0), (30.0, 2, 1), (99.0, 4, 2)]
    assert rows[1]["rss_mb"] == 2.0


# ---- tables ------------------------------------------------------------------------------------

def test_markdown_and_cell_formats():
    assert results.markdown_table(["a", "b"], [[1, "x|y"]]) == "| a | b |\n|---|---|\n| 1 | x\\|y |"
    assert chaos.fmt_counts({}) == "0"
    assert chaos.fmt_counts({"503": 4, "0": 1}) == "5 (503: 4, no answer: 1)"
    assert results.fmt_num(None) == "-" and results.fmt_num(math.nan) == "-" and results.fmt_num(2.345, 2) == "2.35"
    assert chaos.format_leftovers({"processes": [], "segments": []}) == "none"
    assert chaos.format_leftovers({"processes": [{"pid": 7, "what": "instance"}], "segments": ["packrat-7-0"]}) == \
        "1 process(es): 7 instance; 1 segment(s): packrat-7-0"


def report(mode="chaos"):
    sample = {"t_s": 0.0, "rss_mb": 512.0, "fds": 40, "workers": 1, "instances": 1, "shm": {"psm_": 0, "packrat-": 1},
              "segments": ["packrat-9-0"], "requests_so_far": 0, "failures_so_far": 0}
    faults = [{"n": 1, "offset_s": 5.0, "kind": "kill", "pids": [11], "recovery_s": 1.5,
               "health_delta": {"requeued": 3, "expired": 0},
               "window_failures": {"503": 2}, "window_requests": 30, "notes": []},
              {"n": 2, "offset_s": 10.0, "kind": "stop", "pids": [12], "recovery_s": None,
               "window_failures": {}, "window_requests": 0, "notes": ["still stopped when its window ended"]}]
    return {"mode": mode, "model": "tiny", "handler": "packrat", "batch": 4, "users": 8, "duration_s": 20.0,
            "every_s": 5.0, "payload": "jpeg", "cores": 2, "request_timeout_s": 120.0,
            "load": {"requests": 100, "failures_by_status": {"503": 2}, "failure_reasons": {"503: gone": 2},
                     "p50_ms": 10.0, "p99_ms": 50.0, "max_ms": 70.5, "late": 0},
            "faults": faults if mode == "chaos" else [],
            "before_faults": {"failed": {}, "requests": 20},
            "by_kind": chaos.summarise_kinds(faults, chaos.FAULT_KINDS) if mode == "chaos" else [],
            "resources": {"samples": [sample], "rss_ratio": 1.02},
            "leftovers": {"processes": [], "segments": []}, "notes": ["a note"]}


def test_format_report_chaos_has_every_table():
    text = chaos.format_report(report())
    assert "| fault | count | requests failed (by status) | recovery s median |" in text
    assert "| kill | 1 | 2 (503: 2) | 1.5 | 1.5 | 0 |" in text
    assert "| stop | 1 | 0 | - | - | 1 |" in text
    assert "| 2 | 10.0 | stop | 12 | - | 0 | 0 | still stopped when its window ended |" in text
    assert "| - | 0.0 | before faults |" in text
    assert "| 1 | 5.0 | kill | 11 | 1.5 | 2 (503: 2) | 30 | requeued +3 |" in text  # counters that moved
    assert "| 100 | 2 (503: 2) | 10.0 | 50.0 | 70.5 | 0 | 1.020 | none |" in text
    assert "2× 503: gone" in text and "note: a note" in text
    assert "| t s | RSS MB |" in text and "a fault every 5 s" in text


def test_format_report_soak_has_no_fault_tables():
    text = chaos.format_report(report("soak"))
    assert "| fault |" not in text and "before faults" not in text and "a fault every" not in text
    assert "| 0 | 512.0 | 40 | 1 | 1 | 0 | 1 | 1 | 0 | 0 |" in text


# ---- the request log -----------------------------------------------------------------------------

def test_request_log_round_trip_and_damaged_lines(tmp_path):
    records = [RequestRecord(1700000000.123456, 12.5, 200, False),
               RequestRecord(1700000001.0, 3.25, 503, True, '{"code": 503,\n\t"message": "no instance"}')]
    path = tmp_path / "log.tsv"
    path.write_text("".join(map(format_record, records)) + "1700000002.0\t5.0\t20")  # the last line cut short
    back = read_request_log(path)
    assert back[0] == records[0]
    assert back[1].reason == '{"code": 503, "message": "no instance"}' and back[1].failed and back[1].status == 503
    assert len(back) == 2 and back[1].end == pytest.approx(1700000001.00325)
    assert parse_line("a\tb\tc\td\te") is None
    assert read_request_log(tmp_path / "missing.tsv") == []


def test_one_line_truncates():
    assert one_line("a\n b\tc") == "a b c"
    cut = one_line("x" * 500, limit=10)
    assert len(cut) == 10 and cut.endswith("…")


def test_success_lines_carry_no_reason():
    line = format_record(RequestRecord(1.0, 2.0, 200, False, "ignored"))
    assert line.endswith("\t0\t\n") and parse_line(line).reason == ""


# ---- process helpers (this test process, no server) -----------------------------------------------

def test_reaped_and_mapped_segments_on_live_processes():
    me = psutil.Process()
    assert not chaos_faults.reaped(me)
    assert resources.mapped_segments([me.pid], prefixes=("no-such-prefix-",)) == set()


def test_bounded_gives_the_result_or_the_default():
    assert harness.bounded(lambda: 7, 1.0) == 7
    assert harness.bounded(lambda: 1 / 0, 1.0, default="no") == "no"
    started = time.monotonic()
    assert harness.bounded(lambda: time.sleep(2), 0.05, default="late") == "late"
    assert time.monotonic() - started < 1.0


def test_logged_worker_pids():
    log = ("2026-11-22T18:23:22,809 [INFO ] W-9000-tiny_1.0-stdout MODEL_LOG - [PID]11305\n"
           "... s_name_part1=9000, pid=11374\n2026-11-22T18:23:29,436 [INFO ] MODEL_LOG - [PID]11374\n")
    assert chaos_faults.logged_worker_pids(log) == {11305, 11374}
    assert chaos_faults.logged_worker_pids("") == set()
