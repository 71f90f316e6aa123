"""CLI tests: help, plan output, JSON, errors and exit statuses; bench options (users patterns, payload,
tokenizer, kills) with TorchServe and locust faked; the default profile location."""

from __future__ import annotations

import itertools

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from packrat.bench import server as bench_server
from packrat.bench import servers as bench_servers
from packrat.bench.users import UsersPattern, parse_users, users_for_batch
from packrat.cli import bench as cli_bench
from packrat.cli import main as cli
from packrat.cli import serve as cli_serve
from packrat.cli.main import main
from packrat.deploy import archive as deploy_archive
from packrat.deploy import torchserve
from packrat.profiling import profiler
from packrat.serving import default_profile
from packrat.serving.paths import measure_paths
from packrat.profiling.profiles import load
from packrat.settings import CONTROL_DIR_ENV

PROFILE = """# model: toy
threads,batch,latency_ms
1,1,10
1,2,19
2,1,6
2,2,11
2,4,21
1,4,37
"""


# The same points measured beside copies of themselves: 1-thread instances slow down by a third, so the plan
# for B=4 on 2 cores changes from two ⟨1, 2⟩ (isolated: 19 ms) to the fat ⟨2, 4⟩ (21 ms).
LOADED_PROFILE = """# model: toy
# latency: loaded
threads,batch,latency_ms,isolated_ms,copies
1,1,14,10,2
1,2,26,19,2
2,1,6,6,1
2,2,11,11,1
2,4,21,21,1
1,4,50,37,2
"""


@pytest.fixture
def profile(tmp_path) -> Path:
    path = tmp_path / "toy.csv"
    path.write_text(PROFILE)
    return path


@pytest.fixture
def loaded_profile(tmp_path) -> Path:
    path = tmp_path / "loaded" / "toy.csv"
    path.parent.mkdir()
    path.write_text(LOADED_PROFILE)
    return path


def test_help_explains_every_command():
    exe = shutil.which("packrat", path=str(Path(sys.executable).parent)) or "packrat"
    top = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("profile", "plan", "plot", "demo"):
        assert command in top
    plan_help = subprocess.run([exe, "plan", "--help"], capture_output=True, text=True, check=True).stdout
    assert "fewer instances" in plan_help and "--json" in plan_help and "--latency {loaded,isolated}" in plan_help
    profile_help = subprocess.run([exe, "profile", "--help"], capture_output=True, text=True, check=True).stdout
    assert "--contention" in profile_help and "--isolated" in profile_help and "(the default)" in profile_help


def test_plan_json_is_the_documented_object(profile, capsys):
    assert main(["plan", "--profile", str(profile), "--threads", "2", "--batch", "4", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body == {"threads": 2, "batch": 4, "expected_latency_ms": 19.0, "fat_latency_ms": 21.0,
                    "instances": [{"threads": 1, "batch": 2, "cores": body["instances"][0]["cores"], "runtime": "inductor"},
                                  {"threads": 1, "batch": 2, "cores": body["instances"][1]["cores"],
                                   "runtime": "inductor"}],
                    "latency": "isolated", "basis": "model", "ios": []}
    cores = [c for inst in body["instances"] for c in inst["cores"]]
    assert len(set(cores)) == 2


def test_plan_says_which_instances_run_ios_and_what_they_gained(tmp_path, capsys):
    """An instance shape whose ios figure beats the other runtimes' is planned with IOS, and said."""
    rows = [(1, 1, "inductor", 10.0), (2, 1, "inductor", 9.0), (2, 1, "ios", 6.0), (1, 1, "ios", 10.5)]
    path = tmp_path / "ios.csv"
    path.write_text("# model: toy\nthreads,batch,latency_ms,runtime\n" + "".join(f"{t},{b},{ms},{r}\n" for t, b, r, ms in rows))
    assert main(["plan", "--profile", str(path), "--threads", "2", "--batch", "1", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [i["runtime"] for i in body["instances"]] == ["ios"]
    assert body["ios"] == [{"threads": 2, "batch": 1, "runtime": "ios", "ms": 6.0, "against": "inductor", "against_ms": 9.0}]
    assert main(["plan", "--profile", str(path), "--threads", "2", "--batch", "1"]) == 0
    assert "⟨2 threads, batch 1⟩ runs an IOS schedule: 6.0 ms against 9.0 for inductor" in capsys.readouterr().out


def test_plan_for_more_cores_than_this_machine(profile, capsys):
    assert main(["plan", "--profile", str(profile), "--threads", "64", "--batch", "4", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [i["threads"] for i in body["instances"]] == [2, 2, 2, 2]
    assert body["fat_latency_ms"] is None


def test_plan_table_for_every_batch(profile, capsys):
    assert main(["plan", "--profile", str(profile), "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert "2×⟨1 threads, batch 2⟩" in out and "1.11×" in out


def test_plan_text_lists_cores_and_speedup(profile, capsys):
    assert main(["plan", "--profile", str(profile), "--threads", "2", "--batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "cores" in out and "speedup 1.11×" in out


def test_no_plan_exits_2_with_one_line(profile, capsys):
    assert main(["plan", "--profile", str(profile), "--threads", "1", "--batch", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("packrat plan: error: batch 5 cannot be split") and "\n" not in err


def test_bad_profile_exits_2_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("threads,batch\n1,1\n")
    assert main(["plan", "--profile", str(bad), "--batch", "1"]) == 2
    assert f"{bad}: missing column 'latency_ms'" in capsys.readouterr().err


@pytest.mark.parametrize("argv,flag", [
    (["plan", "--profile", "x.csv", "--batch", "0"], "--batch"),
    (["plan", "--profile", "x.csv", "--threads", "two"], "--threads"),
    (["profile", "--batches", "1-x"], "--batches"),
    (["profile", "--iters", "5", "--min-time", "2"], "--min-time"),
])
def test_bad_arguments_name_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert flag in capsys.readouterr().err


def test_plot_writes_pngs(profile, tmp_path, capsys):
    out = tmp_path / "plots"
    assert main(["plot", "--profile", str(profile), "--out", str(out)]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["toy-latency-heatmap.png", "toy-plan-vs-fat-T2.png"]
    assert all((out / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)


def png_width(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[16:20], "big")  # the IHDR chunk's width


def test_plot_draws_both_figures_of_a_loaded_profile(profile, loaded_profile, tmp_path, capsys):
    for source, out in ((profile, tmp_path / "isolated"), (loaded_profile, tmp_path / "both")):
        assert main(["plot", "--profile", str(source), "--out", str(out)]) == 0
    for name in ("toy-latency-heatmap.png", "toy-plan-vs-fat-T2.png"):  # a panel per figure, side by side
        assert png_width(tmp_path / "both" / name) > 1.5 * png_width(tmp_path / "isolated" / name)


def test_plan_uses_the_loaded_figure_unless_told(loaded_profile, capsys):
    argv = ["plan", "--profile", str(loaded_profile), "--threads", "2", "--batch", "4", "--json"]
    assert main(argv) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["latency"] == "loaded" and body["expected_latency_ms"] == 21.0
    assert [(i["threads"], i["batch"]) for i in body["instances"]] == [(2, 4)]
    assert main(argv + ["--latency", "isolated"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["latency"] == "isolated" and body["expected_latency_ms"] == 19.0
    assert [(i["threads"], i["batch"]) for i in body["instances"]] == [(1, 2), (1, 2)]
    assert main(argv[:-1] + ["--latency", "loaded"]) == 0
    assert "B=4, loaded latencies: 1×⟨2 threads, batch 4⟩" in capsys.readouterr().out
    assert main(["plan", "--profile", str(loaded_profile), "--threads", "2"]) == 0
    assert "loaded latencies" in capsys.readouterr().out.splitlines()[0]


def test_plan_with_loaded_figures_from_an_isolated_profile_is_one_line_error(profile, capsys):
    assert main(["plan", "--profile", str(profile), "--threads", "2", "--latency", "loaded"]) == 2
    err = capsys.readouterr().err.strip()
    assert "measured in isolation; re-run `packrat profile --contention`" in err and "\n" not in err
    with pytest.raises(SystemExit):
        main(["plan", "--profile", str(profile), "--latency", "fastest"])
    assert "argument --latency: invalid choice" in capsys.readouterr().err


def test_profile_contention_flags(monkeypatch, profile, capsys):
    seen = []

    def fake_search(settings, threads, batches, out, progress=True, runtimes=(), say=print, every_runtime=False,
                    **rest):
        seen.append((settings.contention, every_runtime, settings.iters, settings.min_time))
        return profiler.SearchResult(load(profile), 1, 2, None, "done", (), profiler.Account())

    monkeypatch.setattr(profiler, "search_profile", fake_search)
    base = ["profile", "--model", "tiny", "--threads", "1", "--out", str(profile), "--quiet"]
    for flags in ([], ["--contention"], ["--isolated"], ["--every-runtime", "--iters", "7"]):
        assert main(base + flags) == 0
    assert [s[0] for s in seen] == [profiler.DEFAULT_CONTENTION, True, False, profiler.DEFAULT_CONTENTION]
    assert seen[0][1:] == (False, None, profiler.DEFAULT_MIN_TIME_S)  # timed ≥ 1 s
    assert seen[-1][1:] == (True, 7, None)
    with pytest.raises(SystemExit):
        main(base + ["--contention", "--isolated"])
    assert "not allowed with argument" in capsys.readouterr().err


# --- bench: users patterns, payload, tokenizer, kills -------------------------------------------

def test_users_patterns_relative_to_the_batch():
    patterns = parse_users("B, 2B,4,b")
    assert patterns == [UsersPattern(1, True), UsersPattern(2, True), UsersPattern(4, False)]
    assert [str(p) for p in patterns] == ["B", "2B", "4"]
    assert users_for_batch(patterns, 4) == [(4, "B"), (8, "2B")]  # 4 users twice: run once
    assert users_for_batch(patterns, 8) == [(8, "B"), (16, "2B"), (4, "4")]
    assert cli.build_parser().parse_args(["bench", "--users", "4,2B"]).users == [UsersPattern(4, False),
                                                                                 UsersPattern(2, True)]
    assert cli.build_parser().parse_args(["bench"]).users == [UsersPattern(1, True)]


@pytest.mark.parametrize("text", ["2x", "0B", "0", "B2", "1.5B", "", "4,,B", "-1"])
def test_bad_users_pattern_is_an_argparse_error(text, capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", "--users", text])
    assert info.value.code == 2
    assert "argument --users" in capsys.readouterr().err


def test_text_payload_without_tokenizer_is_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_bench, "resolve_profile", lambda *a, **k: pytest.fail("checked after the profile"))
    assert main(["bench", "--model", "bert_base"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--tokenizer DIR" in err and "tokenizer.json" in err and "\n" not in err
    (tmp_path / "tokenizer.json").write_text("{}")
    assert main(["bench", "--model", "resnet50", "--payload", "text", "--tokenizer", str(tmp_path)]) == 2
    assert "text payload needs a token model" in capsys.readouterr().err


def test_bench_passes_payload_tokenizer_users_and_kills(tmp_path, monkeypatch):
    calls = {}
    (tmp_path / "p.csv").write_text("# mode: eager\n" + PROFILE)
    monkeypatch.setattr(cli_bench, "resolve_profile", lambda model, given, **kw: tmp_path / "p.csv")
    monkeypatch.setattr(cli_bench, "run_server_bench", lambda *args, **kw: calls.update(args=args, kw=kw) or [])
    out = tmp_path / "out"
    assert main(["bench", "--model", "gpt2", "--demo-tokenizer", "--users", "B,2B", "--kill-every", "5",
                 "--batch-size", "2,4", "--rounds", "3", "--out", str(out)]) == 0
    assert calls["args"][:2] == ("gpt2", [2, 4]) and calls["args"][5] == [UsersPattern(1, True), UsersPattern(2, True)]
    assert calls["kw"] == {"payload": "text", "tokenizer": out / "tokenizer" / "tokenizer.json", "kill_every": 5.0,
                           "rounds": 3, "graph_mode": "eager",  # the stock handler runs the profile's mode
                           "stock_runtime": None, "configs": bench_server.SERVER_CONFIGS, "max_batch_delay_ms": 100}
    assert calls["kw"]["tokenizer"].is_file()
    assert main(["bench", "--model", "resnet50", "--out", str(out)]) == 0
    assert main(["bench", "--model", "resnet50", "--out", str(out), "--configs", "packrat-fat,stock",
                 "--max-batch-delay", "50", "--stock-runtime", "onnxruntime"]) == 0
    assert calls["kw"] == {"payload": "jpeg", "tokenizer": None, "kill_every": None, "rounds": 1, "graph_mode": "eager",
                           "stock_runtime": "onnxruntime", "configs": bench_server.SERVER_CONFIGS[:2],
                           "max_batch_delay_ms": 50}
    assert main(["bench", "--model", "resnet50", "--payload", "raw", "--tokenizer", str(out / "tokenizer"),
                 "--out", str(out)]) == 0
    assert calls["kw"]["payload"] == "raw" and calls["kw"]["tokenizer"] == out / "tokenizer" / "tokenizer.json"


class FakeServer:
    def __init__(self, run_dir, model, ports, token_auth, served_dir=None):
        self.run_dir, self.inference_url, self.served_dir = run_dir, "http://127.0.0.1:1", served_dir

    def key(self, api):
        return "tok"


def test_server_bench_starts_each_server_once_and_loads_every_users_pattern(tmp_path, monkeypatch):
    from packrat import loadtest
    from packrat.loadtest import LoadResult

    events = []
    monkeypatch.setattr(bench_servers.archive, "build",
                        lambda settings, out, **kw: events.append(("archive", {**asdict(settings), **kw})) or out / "m.mar")
    monkeypatch.setattr(bench_servers.torchserve, "Server", FakeServer)
    numbers = itertools.count(9000)
    monkeypatch.setattr(bench_servers.torchserve.Ports, "free", classmethod(lambda cls: cls(*(next(numbers)
                                                                                           for _ in range(5)))))
    monkeypatch.setattr(bench_servers.torchserve, "start",
                        lambda server, mar: events.append(("start", server.served_dir)) or server)
    monkeypatch.setattr(bench_servers.torchserve, "stop", lambda server: events.append(("stop",)))

    def fake_locust(host, model, users, duration_s, out_dir, **kw):
        events.append(("locust", out_dir.name, users, kw["payload"][1]))  # the content type sent
        time.sleep(0.03)  # the killer ticks meanwhile and finds no TorchServe pid: no kills
        return LoadResult(10, 0, 1.0, 2.0, 3.0, 1.5, 5.0, 2.0, response_times={1.0: 10})

    monkeypatch.setattr(loadtest, "run_locust", fake_locust)
    runs = bench_server.server_bench("tiny", 4, tmp_path / "p.csv", tmp_path, duration_s=1,
                                     users=[UsersPattern(1, True), UsersPattern(2, True)], payload="jpeg",
                                     kill_every_s=0.01, log=lambda *_: None)
    starts = [e for e in events if e[0] == "start"]
    assert len(starts) == 3  # once per configuration, not per users pattern
    served = [e[1] for e in starts]  # each configuration plans on its own served latencies, not another's
    assert len(set(served)) == 3 and all(d.name == "served" for d in served)
    # archived, started together, then warmed up one at a time and loaded
    assert [e[0] for e in events[:9]] == ["archive"] * 3 + ["start"] * 3 + ["locust"] * 3
    loads = [e for e in events if e[0] == "locust"]
    assert [e[1] for e in loads] == ["warmup"] * 3 + ["load-u4", "load-u8"] * 3
    assert {e[3] for e in loads} == {"image/jpeg"}
    assert all(e[1]["tokenizer"] is None for e in events if e[0] == "archive")  # none given
    archive_kw = [e[1] for e in events if e[0] == "archive"]
    assert {kw["max_batch_delay_ms"] for kw in archive_kw} == {100} and not any(kw["reconfigure"] for kw in archive_kw)
    assert [(r.config, r.users, r.users_pattern, r.kills) for r in runs] == [
        ("stock", 4, "B", None), ("stock", 8, "2B", None), ("packrat-fat", 4, "B", 0), ("packrat-fat", 8, "2B", 0),
        ("packrat-plan", 4, "B", 0), ("packrat-plan", 8, "2B", 0)]
    table = bench_server.format_server_results(runs, kills=True).splitlines()
    assert table[0].split() == ["config", "users", "requests", "failures", "p50", "ms", "p95", "ms", "p99", "ms",
                                "req/s", "kills", "p50", "vs", "stock", "p99", "vs", "stock"]
    assert table[1].split()[-3] == "-" and table[3].split()[-3] == "0" and "8 (2B)" in table[2]
    assert table[4].split()[-2:] == ["1.00", "1.00"]  # packrat-fat at 8 users over stock at 8

    events.clear()
    bench_server.server_bench("tiny", 4, tmp_path / "p.csv", tmp_path, duration_s=1,
                              tokenizer=tmp_path / "tokenizer.json", configs=bench_server.SERVER_CONFIGS[:1],
                              log=lambda *_: None)
    assert [e[1]["tokenizer"] for e in events if e[0] == "archive"] == [str(tmp_path / "tokenizer.json")]
    assert [e[3] for e in events if e[0] == "locust"] == ["image/jpeg", "image/jpeg"]  # tiny's natural payload


def test_pool_bench_rotates_the_cases_and_runs_the_bare_model_last():
    from packrat.bench.pool import format_pool_results
    from packrat.bench.rounds import interleaved

    order = []
    cases = {name: (lambda name=name: order.append(name) or 1.0) for name in ("in-process", "pool-fat", "pool-plan")}
    assert interleaved(cases, 2, last="in-process") == {"in-process": [1.0, 1.0], "pool-fat": [1.0, 1.0], "pool-plan": [1.0, 1.0]}
    assert order == ["pool-fat", "pool-plan", "in-process", "pool-plan", "pool-fat", "in-process"]
    result = {"batch": 4, "median_ms": {"in-process-codec": 100.0, "pool-fat": 101.0}, "codec_overhead": None,
              "pool_vs_in_process": 1.01, "transport_overhead_ms": 0.5, "plan_speedup_over_fat": None,
              "plan": "1×⟨2 threads, batch 4⟩", "stage_ms": {"pool-fat": {"queue": 0.1, "model": 90.0, "total": 100.0},
                                                            "in-process-codec": {"decode": 9.0, "model": 90.0}},
              "requests_per_sub_batch": {"pool-fat": 4.0}}
    head, row, _, stages, *rest = format_pool_results([result]).splitlines()
    assert head.split()[:3] == ["B", "in-process-codec", "pool-fat"] and "1.010" in row and "-" in row
    assert stages.split() == ["stage", "(median", "ms)", "in-process-codec", "B=4", "pool-fat", "B=4"]
    assert [line.split()[0] for line in rest] == ["queue", "decode", "model", "total", "requests/sub-batch"]


def test_server_bench_json_has_payload_users_and_kills(tmp_path, monkeypatch, capsys):
    from packrat.loadtest import LoadResult

    def fake_bench(model, batch, profile, out_dir, **kw):
        load = LoadResult(10, 0, 1.0, 2.0, 3.0, 1.5, 5.0, 2.0, response_times={1.0: 10})
        return [bench_server.ServerRun(batch, "stock", batch, "B", kw["payload"], None, load),
                bench_server.ServerRun(batch, "packrat-plan", batch, "B", kw["payload"], 3, load)]

    monkeypatch.setattr(bench_server, "server_bench", fake_bench)
    runs = bench_server.run_server_bench("tiny", [2], tmp_path / "p.csv", tmp_path, 1.0, [UsersPattern(1, True)],
                                         payload="raw", kill_every=2.0)
    assert [r.config for r in runs] == ["stock", "packrat-plan"]
    out = capsys.readouterr().out
    assert "payload raw" in out and "users B=2" in out and "every 2 s" in out
    report = json.loads((tmp_path / "server-bench.json").read_text())
    assert (report["payload"], report["users"], report["kill_every_s"]) == ("raw", ["B"], 2.0)
    assert [(r["config"], r["users"], r["payload"], r["kills"]) for r in report["runs"]] == [
        ("stock", 2, "raw", None), ("packrat-plan", 2, "raw", 3)]
    assert report["runs"][0]["load"]["requests"] == 10
    assert (tmp_path / "latency-B2.png").exists()


# --- the default profile: profiles/MODEL.csv, measured when missing ----------------------------

def test_profile_given_default_or_measured(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    calls = []

    def fake_measure(model, path, batches, **kw):
        calls.append((model, path, list(batches)))
        path.write_text(PROFILE)

    monkeypatch.setattr(default_profile, "measure_profile", fake_measure)
    monkeypatch.setattr(default_profile, "cpu_budget", lambda: SimpleNamespace(cores=2))
    given = tmp_path / "mine.csv"
    given.write_text(PROFILE)
    assert default_profile.resolve_profile("resnet50", given) == given and not calls
    with pytest.raises(ValueError, match=r"no profile at .*nope.csv \(--profile\)"):
        default_profile.resolve_profile("resnet50", tmp_path / "nope.csv")
    assert not calls  # a missing --profile is an error, never measured

    path = default_profile.resolve_profile("resnet50", None, batch_sizes=[16, 4])
    assert path == Path("profiles/resnet50.csv") and calls == [("resnet50", path, [1, 2, 4, 8, 16])]
    err = capsys.readouterr().err
    assert "no profile at profiles/resnet50.csv: measuring one now (about" in err
    assert "next time it is reused" in err
    assert default_profile.resolve_profile("resnet50", None) == path and len(calls) == 1  # reused


def test_measure_profile_renames_a_complete_measurement(tmp_path, monkeypatch):

    written = []

    def fake_search(settings, threads, batches, out, progress=True, runtimes=(), say=print, path_probe=None):
        assert runtimes == profiler.default_runtimes()  # as `packrat profile` measures
        assert path_probe is measure_paths  # and the path around the instances too
        written.append((Path(out).name, settings.warmup, settings.min_time, threads, batches, settings.contention))
        Path(out).write_text(PROFILE)
        return SimpleNamespace(profile=load(out))

    monkeypatch.setattr(profiler, "search_profile", fake_search)
    monkeypatch.setattr(default_profile, "cpu_budget", lambda: SimpleNamespace(cores=2))
    path = tmp_path / "toy.csv"
    profile = default_profile.measure_profile("tiny", path, [4, 1, 2])
    assert written == [("toy.partial.csv", 3, 2.0, [1, 2], [1, 2, 4], profiler.DEFAULT_CONTENTION)]
    assert path.exists() and not (tmp_path / "toy.partial.csv").exists() and profile.batches == [1, 2, 4]
    default_profile.measure_profile("tiny", path, [8])  # an existing file is filled in place, in the kind it holds
    assert written[-1][0] == "toy.csv" and written[-1][-1] is False
    path.write_text(LOADED_PROFILE)
    default_profile.measure_profile("tiny", path, [8])
    assert written[-1][-1] is True


def test_archive_passes_tokenizer_labels_and_body_limit(tmp_path, monkeypatch, profile, capsys):
    monkeypatch.chdir(tmp_path)
    seen = {}
    monkeypatch.setattr(deploy_archive, "build", lambda settings, out, **kw: seen.update(asdict(settings), **kw)
                        or out / "tiny.mar")
    monkeypatch.setattr(default_profile, "measure_profile", lambda model, path, batches, **kw: path.write_text(PROFILE))
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    labels = tmp_path / "index_to_name.json"
    labels.write_text('{"0": "tench"}')
    assert main(["archive", "--model", "tiny", "--profile", str(profile), "--tokenizer", "tok",
                 "--labels", str(labels), "--max-body-mb", "1.5", "--truncate-text"]) == 0
    assert seen["tokenizer"] == "tok/tokenizer.json" and seen["labels"] == str(labels) and seen["truncate_text"]
    assert seen["max_body_bytes"] == int(1.5 * 2**20) and seen["profiles"] == (str(profile),) and seen["cores"] is None
    assert main(["archive", "--model", "tiny"]) == 0  # no profile: measured at the default, then used
    assert seen["profiles"] == ("profiles/tiny.csv",) and (tmp_path / "profiles/tiny.csv").exists()
    assert main(["archive", "--model", "tiny", "--profile", str(profile), "--profile", "profiles/tiny.csv",
                 "--cores", "3"]) == 0  # one profile per machine type, and a CPU budget
    assert seen["profiles"] == (str(profile), "profiles/tiny.csv") and seen["cores"] == 3
    assert (seen["tokenizer"], seen["labels"], seen["max_body_bytes"], seen["truncate_text"]) == \
        (None, None, 16 * 2**20, False)
    assert main(["archive", "--model", "tiny", "--profile", "missing.csv"]) == 2
    assert "no profile at missing.csv" in capsys.readouterr().err
    for flag, value in (("--tokenizer", str(tmp_path)), ("--labels", str(tmp_path / "tok" / "tokenizer.json"))):
        with pytest.raises(SystemExit):
            main(["archive", flag, value])
        assert f"argument {flag}" in capsys.readouterr().err


def test_profile_replay_prints_points_against_the_grid(tmp_path, capsys):
    full = tmp_path / "full.csv"
    rows = [f"{t},{b},{10 * b * (0.3 + 0.7 / t):.4f}" for t in range(1, 9) for b in (1, 2, 4, 8, 16, 32, 64)]
    full.write_text("# model: toy\nthreads,batch,latency_ms\n" + "\n".join(rows) + "\n")
    out = tmp_path / "replayed.csv"
    assert main(["profile", "--replay", str(full), "--out", str(out), "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["grid"] == 56 and 0 < body["points"] < 56 and body["out"] == str(out)
    assert {"fraction", "budget_s", "stopped", "fit_error", "wall_s", "unaccounted_s", "runtimes"} <= set(body)
    assert len(load(out).latency) == body["points"]
    assert main(["profile", "--replay", str(full), "--out", str(out), "--quiet"]) == 0
    assert f"{body['points']} of the grid's 56 points" in capsys.readouterr().out


# --- request recovery settings, reconfigure requests --------------------------------------------

RECOVERY_FLAGS = ["--request-timeout", "30", "--max-queue", "50", "--batch-timeout", "7.5"]


@pytest.mark.parametrize("command", ["archive", "serve"])
def test_recovery_flags_parse_and_default_to_the_pools(command):
    args = cli.build_parser().parse_args([command] + RECOVERY_FLAGS)
    assert (args.request_timeout_s, args.max_queue, args.batch_timeout_s) == (30.0, 50, 7.5)
    args = cli.build_parser().parse_args([command])
    assert (args.request_timeout_s, args.max_queue, args.batch_timeout_s) == (None, None, None)


@pytest.mark.parametrize("flag,value", [("--request-timeout", "0"), ("--request-timeout", "-1"),
                                        ("--request-timeout", "soon"), ("--max-queue", "0"),
                                        ("--max-queue", "1.5"), ("--batch-timeout", "0")])
def test_bad_recovery_flags_name_the_flag(flag, value, capsys):
    with pytest.raises(SystemExit) as info:
        main(["serve", flag, value])
    assert info.value.code == 2 and f"argument {flag}" in capsys.readouterr().err


def test_archive_passes_recovery_settings(tmp_path, monkeypatch, profile):
    seen = {}
    monkeypatch.setattr(deploy_archive, "build", lambda settings, out, **kw: seen.update(asdict(settings)) or out / "tiny.mar")
    assert main(["archive", "--model", "tiny", "--profile", str(profile), "--export-path", str(tmp_path)]) == 0
    assert (seen["request_timeout_s"], seen["max_queue"], seen["batch_timeout_s"]) == (None, None, None)
    assert main(["archive", "--model", "tiny", "--profile", str(profile), "--export-path", str(tmp_path)]
                + RECOVERY_FLAGS) == 0
    assert (seen["request_timeout_s"], seen["max_queue"], seen["batch_timeout_s"]) == (30.0, 50, 7.5)


@pytest.mark.parametrize("command", ["archive", "serve"])
def test_every_setting_is_an_option_named_after_it_and_the_old_names_stay(command, capsys):
    from dataclasses import fields

    from packrat.cli.archive import settings_from_args
    from packrat.settings import EstimatorSettings, Settings

    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([command, "--help"])
    shown = capsys.readouterr().out
    names = [f.name for f in fields(Settings) if f.metadata.get("option", True) and f.name != "estimator"]
    names += [f"estimator_{f.name}" for f in fields(EstimatorSettings)]
    assert len(names) == 29 and not [n for n in names if f"--{n.replace('_', '-')}" not in shown]
    args = cli.build_parser().parse_args([command, "--batch-size", "4", "--slo", "20", "--max-body-mb", "2",
                                          "--plan-batch", "2", "--hang-factor", "3", "--estimator-window", "3",
                                          "--no-share-node", "--gather-ms", "0", "--graph-mode", "eager",
                                          "--instance-kind", "process"])
    settings = settings_from_args(args, "tiny", ["tiny"], [])
    assert settings.instance_kind == "process"
    assert (settings.max_batch, settings.slo_ms, settings.max_body_bytes, settings.plan_batch) == (4, 20.0, 2**21, 2)
    assert (settings.hang_factor, settings.share_node, settings.gather_ms, settings.graph_mode) == (3.0, False, 0.0,
                                                                                                   "eager")
    assert settings.estimator == EstimatorSettings(window=3) and settings.reconfigure is True
    default = settings_from_args(cli.build_parser().parse_args([command]), "tiny", ["tiny"], [])
    assert default == Settings("tiny")  # nothing given: the schema's defaults, nothing more written


@pytest.mark.parametrize("command", ["archive", "serve"])
def test_cores_flag(command, capsys):
    assert cli.build_parser().parse_args([command, "--cores", "4"]).cores == 4
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([command, "--cores", "0"])
    assert "argument --cores" in capsys.readouterr().err


def test_a_server_given_a_served_dir_hands_it_to_its_handlers(tmp_path):
    from packrat.deploy import torchserve
    import os

    from packrat.settings import SERVED_DIR_ENV

    assert torchserve.Server(tmp_path / "run", "toy").env()[SERVED_DIR_ENV.name] == os.environ[SERVED_DIR_ENV.name]
    own = torchserve.Server(tmp_path / "run", "toy", served_dir=tmp_path / "served")
    assert own.env()[SERVED_DIR_ENV.name] == str(tmp_path / "served")


@pytest.fixture
def short_tmp():
    """A temporary directory with a short path (/tmp/XXXXXXXX): an xdist worker's tmp_path
    (…/popen-gw1/test_…) leaves too little of a socket path's 107 bytes for a link in it."""
    path = Path(tempfile.mkdtemp(prefix="t"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_torchserve_s_temp_variables_all_name_its_run_dir_or_a_short_link_to_it(tmp_path, short_tmp, monkeypatch):
    """TEMP, TMPDIR and TMP alike (its pid file follows TMPDIR); where run_dir/tmp is too long for a
    worker's socket, a link to it in the first short directory that takes one, kept across starts."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "elsewhere"))
    short = torchserve.Server(tmp_path / "run", "toy")
    assert torchserve.short_temp(short) is None
    assert {short.env()[name] for name in torchserve.TEMP_ENVS} == {str(tmp_path / "run" / "tmp")}
    long = torchserve.Server(tmp_path / ("d" * 100) / "run", "toy")
    (long.run_dir / "tmp").mkdir(parents=True)
    assert not torchserve.fits_sockets(long.run_dir / "tmp")
    monkeypatch.setattr(torchserve, "SHORT_DIRS", (str(tmp_path / ("x" * 100)), str(short_tmp)))  # the first too long
    long.temp_link = torchserve.short_temp(long)
    assert long.temp_link.parent == short_tmp and long.temp_link.resolve() == (long.run_dir / "tmp").resolve()
    assert torchserve.fits_sockets(long.temp_link)
    assert {long.env()[name] for name in torchserve.TEMP_ENVS} == {str(long.temp_link)}
    long.save()
    again = torchserve.Server.load(long.run_dir)
    assert again.temp_link == long.temp_link and torchserve.short_temp(again) == long.temp_link
    torchserve.drop_temp_link(again)
    assert not long.temp_link.is_symlink() and (long.run_dir / "tmp").is_dir()


def test_reconfigure_request_round_trip(tmp_path):
    from packrat.deploy import torchserve
    from packrat.frontends import torchserve_control

    server = torchserve.Server(tmp_path / "run", "toy")
    assert server.env()[CONTROL_DIR_ENV.name] == str(tmp_path / "run" / "control")
    assert torchserve_control.read_reconfigure_request(server.control_dir, "toy") is None  # none asked for
    before = time.time()
    path = torchserve_control.request_reconfigure(server.control_dir, server.model, 16)
    assert path == tmp_path / "run" / "control" / "toy.json"
    assert [p.name for p in path.parent.iterdir()] == ["toy.json"]  # no temporary file left behind
    batch, requested_at = torchserve_control.read_reconfigure_request(str(server.control_dir), "toy")
    assert batch == 16 and before <= requested_at <= time.time()
    assert torchserve_control.request_reconfigure(server.control_dir, server.model, 2) == path
    assert torchserve_control.read_reconfigure_request(path.parent, "toy")[0] == 2
    assert torchserve_control.read_reconfigure_request(path.parent, "other") is None
    for text in ("{not json", "[16]", '{"batch": 16}', '{"batch": "16", "requested_at": 1.0}',
                 '{"batch": 0, "requested_at": 1.0}', '{"batch": true, "requested_at": 1.0}',
                 '{"batch": 4, "requested_at": "now"}'):
        path.write_text(text)
        assert torchserve_control.read_reconfigure_request(path.parent, "toy") is None, text
    with pytest.raises(ValueError):
        torchserve_control.request_reconfigure(server.control_dir, server.model, 0)


def test_reconfigure_command_asks_the_recorded_server(tmp_path, monkeypatch, capsys):
    from packrat.deploy import torchserve
    from packrat.frontends import torchserve_control

    run_dir = tmp_path / "run"
    assert main(["reconfigure", "--run-dir", str(run_dir), "--batch", "4"]) == 2  # no server recorded
    assert "no packrat server recorded" in capsys.readouterr().err
    run_dir.mkdir()
    torchserve.Server(run_dir, "toy", torchserve.Ports(), token_auth=False).save()
    running = []
    monkeypatch.setattr(torchserve, "java_running", lambda server: bool(running))
    assert main(["reconfigure", "--run-dir", str(run_dir), "--batch", "4"]) == 2
    assert "TorchServe is not running" in capsys.readouterr().err
    running.append(True)
    assert main(["reconfigure", "--run-dir", str(run_dir), "--batch", "16", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body == {"batch": 16, "file": str(run_dir.resolve() / "control" / "toy.json")}
    assert torchserve_control.read_reconfigure_request(run_dir / "control", "toy")[0] == 16
    assert main(["reconfigure", "--run-dir", str(run_dir), "--batch", "2"]) == 0
    assert "plan for batch size 2" in capsys.readouterr().out
    assert torchserve_control.read_reconfigure_request(run_dir / "control", "toy")[0] == 2
    for argv in (["reconfigure", "--run-dir", str(run_dir)], ["reconfigure", "--batch", "0"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "--batch" in capsys.readouterr().err


def test_parser_starts_without_torch():
    code = "import sys; from packrat.cli import main; main.build_parser(); sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def status_output(monkeypatch, capsys, run_dir, plan: dict, health: dict) -> str:
    """What `packrat status` prints for one TorchServe model with this plan and health."""
    monkeypatch.setattr(torchserve.Server, "load", classmethod(lambda cls, run_dir: SimpleNamespace(model="tiny", models=("tiny",))))
    monkeypatch.setattr(torchserve, "handler_status", lambda server, model=None: {"plan": plan, "mode": "script",
                                                                      "health": health, "reconfigurations": []})
    assert cli.main(["status", "--run-dir", str(run_dir)]) == 0
    return capsys.readouterr().out


def test_status_reports_recovery_counts(monkeypatch, capsys, tmp_path):
    health = {"instances": 2, "ready": 1, "respawning": 1, "respawn_failures": 0, "unavailable": None, "queued": 3,
              "answered": 40, "refused": 0, "watchdog_kills": 2, "expired": 1, "requeued": 5}
    plan = {"batch": 4, "threads": 2, "instances": [{"threads": 1, "batch": 2, "cores": [0]},
                                                    {"threads": 1, "batch": 2, "cores": [1]}]}
    out = status_output(monkeypatch, capsys, tmp_path, plan, health)
    assert "1/2 ready, 1 respawning" in out
    assert "2 hung instance(s) killed by the watchdog, 5 request(s) re-run" in out and "1 past their deadline" in out
    assert "instance kinds" not in out and "stuck thread" not in out  # an engine from before kinds


def test_status_names_each_instance_s_kind(monkeypatch, capsys, tmp_path):
    kinds = [{"index": 0, "kind": "thread", "runtime": "onnxruntime-thread", "cores": [0, 1]},
             {"index": 1, "kind": "process", "runtime": "onnxruntime", "cores": [2]}]
    health = {"instances": 2, "ready": 2, "respawning": 0, "respawn_failures": 0, "unavailable": None, "queued": 0,
              "answered": 4, "refused": 0, "kinds": kinds, "abandoned": 1, "fenced": [3]}
    plan = {"batch": 4, "threads": 3, "instances": [{"threads": 2, "batch": 2, "cores": [0, 1]},
                                                    {"threads": 1, "batch": 2, "cores": [2]}]}
    out = status_output(monkeypatch, capsys, tmp_path, plan, health)
    assert "instance kinds: #0 thread on cores 0-1, onnxruntime-thread, #1 process on cores 2, onnxruntime" in out
    assert "1 stuck thread instance(s) abandoned (cores [3] fenced off)" in out


def test_status_says_where_the_pools_time_goes(monkeypatch, capsys, tmp_path):
    stages = {"queue": 0.2, "copy": 0.03, "send": 0.05, "wake": 0.04, "locks": 0.0, "decode": 6.5, "model": 150.0,
              "encode": 0.3, "reply": 0.25, "hand_out": 0.05}
    health = {"instances": 1, "ready": 1, "respawning": 0, "respawn_failures": 0, "unavailable": None, "queued": 0,
              "answered": 40, "refused": 0, "stage_ms": {**stages, "total": sum(stages.values())},
              "sub_batches": 10, "requests_per_sub_batch": 4.0}
    plan = {"batch": 4, "threads": 2, "instances": [{"threads": 2, "batch": 4, "cores": [0, 1]}]}
    monkeypatch.setattr(torchserve.Server, "load", classmethod(lambda cls, run_dir: SimpleNamespace(model="tiny", models=("tiny",))))
    monkeypatch.setattr(torchserve, "handler_status", lambda server, model=None: {"plan": plan, "mode": "compile",
                                                                      "health": health, "reconfigurations": []})
    assert cli.main(["status", "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "4.0 requests each" in out and "decode 6.50, model 150.00" in out and "hand out 0.05" in out
    assert "total 157.42" in out
    health["stage_ms"] = {}  # no batch answered yet: no line
    assert cli.main(["status", "--run-dir", str(tmp_path)]) == 0
    assert "pool hop" not in capsys.readouterr().out


def test_status_reports_the_cpu_budget_and_profile(monkeypatch, capsys, tmp_path):
    budget = {"cores": 4, "source": "cgroup v2 cpu.max",
              "detail": "cpu.max 400000 100000 at /sys/fs/cgroup → 4 of 16 cores"}
    status = {"plan": {"batch": 4, "threads": 4, "instances": [{"threads": 4, "batch": 4, "cores": [0, 1, 2, 3]}]},
              "mode": "compile", "reconfigurations": [], "cpu_budget": budget,
              "profile": "profile-1.csv: taken on This CPU, 4 cores; ..."}
    monkeypatch.setattr(torchserve.Server, "load", classmethod(lambda cls, run_dir: SimpleNamespace(model="tiny", models=("tiny",))))
    monkeypatch.setattr(torchserve, "handler_status", lambda server, model=None: status)
    assert cli.main(["status", "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"CPU budget: 4 cores (cgroup v2 cpu.max: {budget['detail']})" in out
    assert "profile: profile-1.csv: taken on This CPU" in out
    assert cli.main(["status", "--run-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == status  # complete


def test_serve_on_ray_sends_the_archive_settings_with_absolute_paths(tmp_path, monkeypatch):
    """`packrat serve --engine ray` deploys packrat.ray_serve.app with what an archive would hold."""
    profile = tmp_path / "tiny.csv"
    profile.write_text("# model: tiny\nthreads,batch,latency_ms\n1,1,1.0\n")
    monkeypatch.chdir(tmp_path)
    args = cli.build_parser().parse_args(["serve", "--engine", "ray", "--model", "tiny", "--profile", "tiny.csv",
                                          "--batch-size", "4", "--cores", "1", "--replicas", "2",
                                          "--request-timeout", "30", "--no-reconfigure"])
    app_args = cli_serve.ray_app_args(args)
    assert app_args["profiles"] == [str(profile)] and app_args["model"] == "tiny"
    assert (app_args["max_batch"], app_args["cores"], app_args["replicas"]) == (4, 1, 2)
    assert app_args["request_timeout_s"] == 30 and app_args["reconfigure"] is False
    assert cli.build_parser().parse_args(["stop", "--engine", "ray"]).engine == "ray"


def test_serve_on_kserve_starts_the_server_on_loopback_and_status_asks_it(tmp_path, monkeypatch, capsys):
    """`packrat serve --engine kserve`: the archives, as for TorchServe, served by a KServe server in the
    run dir on loopback, REST on --inference-port and gRPC on --grpc-inference-port; `packrat status`
    then asks that server while it runs."""
    from packrat.deploy import kserve

    started = {}
    monkeypatch.setattr(cli_serve, "kserve_installed", lambda: True)  # the SDK need not be here
    monkeypatch.setattr(cli_serve, "archive_from_args", lambda args, out, model, names: out / f"{model}.mar")

    def start(server, mars, timeout):
        started.update(server=server, mars=mars)
        server.pid = os.getpid()  # "running": this process
        server.save()
        return server

    status = {"plan": {"threads": 2, "batch": 4, "instances": []}, "cpu_budget": {"cores": 2, "source": "affinity",
                                                                                  "detail": ""}, "profile": "p: why"}
    monkeypatch.setattr(kserve, "start", start)
    monkeypatch.setattr(kserve, "status", lambda server: {"tiny": status})
    assert cli.main(["serve", "--engine", "kserve", "--model", "tiny", "--run-dir", str(tmp_path),
                     "--inference-port", "9080", "--grpc-inference-port", "9070"]) == 0
    server = started["server"]
    assert (server.models, server.host, server.http_port, server.grpc_port) == (("tiny",), "127.0.0.1", 9080, 9070)
    assert started["mars"] == [tmp_path.resolve() / "model_store" / "tiny.mar"]
    assert "http://127.0.0.1:9080/v2/models/tiny/infer" in capsys.readouterr().out
    assert cli.main(["status", "--run-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == status
    assert cli.build_parser().parse_args(["stop", "--engine", "kserve"]).engine == "kserve"


def test_servers_follow_reconfigure_requests_newer_than_their_start(tmp_path):
    """The loop both the TorchServe handler and the KServe server run: a request made before it
    started is old news; a newer one switches the controller (cut to the largest batch) until stopped."""
    import threading

    from packrat.frontends import torchserve_control

    asked = []
    controller = SimpleNamespace(request=lambda batch, reason: asked.append(batch) or True)
    torchserve_control.request_reconfigure(tmp_path, "toy", 2)
    stop = threading.Event()
    thread = torchserve_control.follow_reconfigure_requests(controller, tmp_path, "toy", max_batch=8, until=stop)
    time.sleep(torchserve_control.POLL_S * 1.5)
    assert asked == []
    torchserve_control.request_reconfigure(tmp_path, "toy", 64)
    deadline = time.monotonic() + 10
    while not asked and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(5)
    assert asked == [8] and not thread.is_alive()
