"""The demo (`packrat demo`) and the interleaved server bench it runs: its three servers, what it
says the table shows, what it plans on a published table, rounds rotated and pooled. The
profile, TorchServe and locust are faked: no process is started."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from packrat.loadtest import LoadResult, percentile
from packrat.bench import demo
from packrat.bench import server as bench_server
from packrat.bench import servers as bench_servers
from packrat.bench import users as bench_users
from packrat.bench.rounds import rotated
from packrat.bench.users import BATCH_USERS
from packrat.cli import bench as cli_bench
from packrat.cli import demo as demo_command
from packrat.cli.main import main
from packrat.planning.planner import Planner
from packrat.profiling.profiles import load

# 2 cores: halves win at B=2 and 8 (10 < 20, 70 < 80), not at B=4 (40 > 35); B=1 cannot split.
PROFILE = """# model: toy
# mode: eager
threads,batch,latency_ms
1,1,10
1,2,40
1,4,70
1,8,150
2,1,6
2,2,20
2,4,35
2,8,80
"""


def result(requests: int, latencies: dict[float, int], rps: float = 99.0) -> LoadResult:
    """A locust run's result with these latencies, at `rps` as locust would count it."""
    p50, p95, p99 = (percentile(latencies, q) for q in (0.5, 0.95, 0.99))
    return LoadResult(requests, 0, p50, p95, p99, sum(k * v for k, v in latencies.items()) / requests, rps, 1.0,
                      response_times=latencies)


@pytest.fixture
def toy(tmp_path) -> Path:
    path = tmp_path / "toy.csv"
    path.write_text(PROFILE)
    return path


def plans(path: Path):
    profile = load(path)
    planner = Planner(profile.items(), 2, 8)
    return profile, [planner.plan(2, b) for b in profile.batches]


# --- the interleaved server bench ----------------------------------------------------------------

def test_rounds_are_pooled_per_second_of_load():
    pooled = bench_users.pooled([result(4, {100.0: 3, 400.0: 1}), result(6, {100.0: 6})], run_s=2.0)
    assert (pooled.requests, pooled.response_times) == (10, {100.0: 9, 400.0: 1})
    assert (pooled.p50_ms, pooled.p99_ms, pooled.mean_ms) == (100.0, 400.0, 130.0)
    assert (pooled.throughput_rps, pooled.duration_s) == (2.5, 4)  # 10 requests in 2 × 2 s, not locust's 99/s


def test_rotated_puts_each_configuration_in_every_place():
    orders = [rotated(["a", "b", "c"], r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert rotated([], 2) == []


class FakeServer:
    def __init__(self, run_dir, model, ports, token_auth, served_dir=None):
        self.run_dir, self.inference_url = run_dir, f"http://{Path(run_dir).name}"

    def key(self, api):
        return "tok"


def test_server_bench_rotates_rounds_and_pools_them(tmp_path, monkeypatch):
    from packrat import loadtest

    built, loads = [], []
    monkeypatch.setattr(bench_servers.archive, "build",
                        lambda settings, out, **kw: built.append(asdict(settings)) or out)
    monkeypatch.setattr(bench_servers.torchserve, "Server", FakeServer)
    numbers = iter(range(9000, 9100))
    monkeypatch.setattr(bench_servers.torchserve.Ports, "free", classmethod(lambda cls: cls(*(next(numbers)
                                                                                           for _ in range(5)))))
    starts = []

    def start(server, mar):
        starts.append(("start", server.run_dir.name))
        time.sleep(0.05)  # a JVM's boot: another start in parallel would begin meanwhile
        starts.append(("up", server.run_dir.name))
        return server

    monkeypatch.setattr(bench_servers.torchserve, "start", start)
    monkeypatch.setattr(bench_servers.torchserve, "stop", lambda server: None)

    def fake_locust(host, model, users, duration_s, out_dir, **kw):
        loads.append((host.removeprefix("http://"), out_dir.name))
        return result(10, {50.0: 10})

    monkeypatch.setattr(loadtest, "run_locust", fake_locust)
    runs = bench_server.server_bench("tiny", 4, tmp_path / "p.csv", tmp_path, duration_s=5, rounds=3,
                                     graph_mode="eager", payload="raw", log=lambda *_: None)
    assert [b["graph_mode"] for b in built] == ["eager", None, None]  # packrat follows its profile
    assert not any(b["share_node"] for b in built)  # side by side, each plans for the whole machine
    # packrat's servers time their near-ties as they start: each alone, once the others are up
    assert starts == [("start", "stock"), ("up", "stock"), ("start", "packrat-fat"), ("up", "packrat-fat"),
                      ("start", "packrat-plan"), ("up", "packrat-plan")]
    assert loads[:3] == [("stock", "warmup"), ("packrat-fat", "warmup"), ("packrat-plan", "warmup")]
    assert [host for host, _ in loads[3:]] == ["stock", "packrat-fat", "packrat-plan", "packrat-fat", "packrat-plan",
                                               "stock", "packrat-plan", "stock", "packrat-fat"]
    assert loads[3][1] == "load-u4-r1" and loads[-1][1] == "load-u4-r3"
    assert [(r.config, r.rounds, r.load.requests, r.load.throughput_rps, r.kills) for r in runs] == [
        ("stock", 3, 30, 2.0, None), ("packrat-fat", 3, 30, 2.0, 0), ("packrat-plan", 3, 30, 2.0, 0)]
    assert runs[2].round_medians == {"p50_ms": 50.0, "p99_ms": 50.0, "throughput_rps": 2.0}
    assert runs[2].vs_stock == {"p50": 1.0, "p99": 1.0, "rounds_p50": 1.0, "rounds_p99": 1.0}
    assert "rounds vs stock" in bench_server.format_server_results(runs).splitlines()[0]


# --- the demo --------------------------------------------------------------------------------------

RUNTIMES_PROFILE = """# model: toy
# mode: compile
threads,batch,latency_ms,runtime
1,4,70,inductor
2,4,35,inductor
2,4,40,onnxruntime-thread
1,8,150,inductor
2,8,90,inductor
2,8,80,onnxruntime-thread
"""


def test_the_careful_user_runs_one_session_of_the_fastest_runtime_at_every_core(tmp_path):
    path = tmp_path / "toy.csv"
    path.write_text(RUNTIMES_PROFILE)
    profile = load(path)
    assert demo.careful_runtime(profile, 2, 8) == "onnxruntime"  # in the user's process, whatever packrat's kind
    assert demo.careful_runtime(profile, 2, 4) == "inductor"
    stock, careful, packrat = demo.demo_configs("onnxruntime", "compile")
    assert stock[1:] == ("stock", "auto", {"graph_mode": "eager"})  # TorchServe's handler as a user runs it
    assert careful[1:] == ("careful", "auto", {"runtime": "onnxruntime", "graph_mode": "compile"})
    assert packrat[:2] == ("packrat", "packrat")


def test_a_runtime_session_in_the_stock_handler_gets_one_worker():
    import yaml

    from packrat.deploy.archive import model_config_yaml
    from packrat.settings import Settings

    def workers(handler, **settings):
        config = yaml.safe_load(model_config_yaml(Settings("tiny", **settings), handler=handler))
        return config.get("minWorkers"), config.get("maxWorkers")

    assert workers("stock") == (None, None)  # TorchServe's default workers, as stock runs
    assert workers("stock", runtime="inductor") == (None, None)
    assert workers("stock", runtime="onnxruntime") == (1, 1)  # its session has a thread on every core
    assert workers("packrat") == (1, 1)
    assert workers("careful") == (1, 1)  # one session on every core, whatever runs it


def test_the_demo_profile_keeps_the_default_one_for_serve():
    assert demo.demo_profile_path("bert_base", "compile") == Path("profiles/bert_base.csv")
    assert demo.demo_profile_path("bert_base", "eager") == Path("profiles/eager-bert_base.csv")


def loads(stock, careful, packrat):
    """ServerRuns at B = 8 with these (p50 ms, req/s)."""
    return [bench_server.ServerRun(8, name, 8, "B", "raw", None, result(30, {p50: 30}, rps), 3)
            for name, (p50, rps) in (("stock", stock), ("careful", careful), ("packrat", packrat))]


def test_the_verdict_names_a_win_and_a_level_only_within_their_targets():
    won = demo.verdict(loads((100.0, 3.0), (80.0, 3.6), (81.0, 3.6)), "onnxruntime")
    assert "p50 was 0.81× stock's and it answered 1.20× its requests per second: lower latency" in won[0]
    assert "one onnxruntime session" in won[1] and "1.01× its; level or ahead." in won[1]
    lost = demo.verdict(loads((100.0, 3.0), (80.0, 3.6), (91.0, 3.6)), "onnxruntime")
    assert "short of the win it aims for" in lost[0]  # 0.91 > 0.90
    assert "behind by more than 2%" in lost[1]  # 91/80
    slow = demo.verdict(loads((100.0, 3.0), (80.0, 3.2), (85.0, 3.2)), "openvino")
    assert "short of the win" in slow[0]  # p50 0.85, but 1.07× the requests


def run_demo(monkeypatch, tmp_path, argv, served=None):
    """`packrat demo ARGV` in tmp_path, the profile measured as PROFILE, the servers faked (their
    arguments recorded in `served`; None: serving is not expected)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(demo_command, "local_cores", lambda: 2)
    measured = []

    def fake_measure(model, path, batches, **kw):
        measured.append((model, str(path), list(batches), kw["graph_mode"]))
        path.write_text(PROFILE)
        return load(path)

    def fake_bench(model, batches, profile, out, duration, users, **kw):
        served.update(batches=batches, users=users, **kw)
        return loads((100.0, 3.0), (80.0, 3.6), (81.0, 3.6))

    monkeypatch.setattr(demo_command, "measure_profile", fake_measure)
    monkeypatch.setattr(demo_command, "run_server_bench", fake_bench if served is not None else None)
    assert main(["demo", "--model", "tiny", *argv]) == 0
    return measured


def test_demo_no_serve_profiles_plans_and_plots(monkeypatch, tmp_path, capsys):
    measured = run_demo(monkeypatch, tmp_path, ["--no-serve"])
    assert measured == [("tiny", "profiles/eager-tiny.csv", [4, 8], "eager")]
    out = capsys.readouterr().out
    assert "== 1/5 profile tiny on 2 cores under every installed runtime" in out and "== 4/5" not in out
    assert "2×⟨1 threads, batch 4⟩" in out
    assert sorted(p.name for p in (tmp_path / "out" / "plots").iterdir()) == [
        "toy-latency-heatmap.png", "toy-plan-vs-fat-T2.png"]
    assert "No published 16-core table here" in out  # none beside tmp_path


def test_demo_serves_three_ways_and_says_what_packrat_gives(monkeypatch, tmp_path, capsys):
    served = {}
    run_demo(monkeypatch, tmp_path, ["--rounds", "2"], served)
    assert served["batches"] == [8] and served["users"] == [BATCH_USERS] and served["rounds"] == 2
    assert [c[0] for c in served["configs"]] == ["stock", "careful", "packrat"]
    assert served["configs"][1][3]["runtime"] == "inductor"  # the toy profile's only runtime
    out = capsys.readouterr().out
    assert "careful (one inductor session on 2 cores)" in out and "lower latency and more throughput" in out


def test_demo_plans_on_a_published_table_and_says_it_is_a_prediction(monkeypatch, tmp_path, capsys):
    table = tmp_path / "published.csv"
    table.write_text("# model: resnet50\nthreads,batch,latency_ms\n" + "".join(
        f"{t},{b},{b * (40.0 / t + 2.0 * t):.3f}\n" for t in range(1, 17) for b in (1, 2, 4, 8, 16, 32, 64, 128)))
    run_demo(monkeypatch, tmp_path, ["--no-serve", "--at-scale", str(table)])
    out = capsys.readouterr().out
    assert "not a measurement on this machine" in out
    lines = [line for line in out.splitlines() if line.startswith("  T=16, B=")]
    assert [line.split(":")[0] for line in lines] == ["  T=16, B=8", "  T=16, B=32", "  T=16, B=128"]
    assert all("against" in line and "×)" in line for line in lines)


def test_bench_rounds_default_per_mode():
    parser = argparse.ArgumentParser()
    cli_bench.add_bench_parser(parser.add_subparsers())
    assert parser.parse_args(["bench"]).rounds is None  # 1 through TorchServe, POOL_ROUNDS with --pool-only
    assert cli_bench.POOL_ROUNDS == 20
