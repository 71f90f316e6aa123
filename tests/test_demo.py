"""The demo (`packrat demo`) and the interleaved server bench it runs: the batch it serves, what it
says where the plan keeps one instance and what the table shows, rounds rotated and pooled. The
profile, TorchServe and locust are faked: no process is started."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

import pytest

from packrat.loadtest import LoadResult, percentile
from packrat.bench import demo
from packrat.bench import server as bench_server
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
    pooled = bench_server.pooled([result(4, {100.0: 3, 400.0: 1}), result(6, {100.0: 6})], run_s=2.0)
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
    monkeypatch.setattr(bench_server.archive, "build",
                        lambda settings, out, **kw: built.append(asdict(settings)) or out)
    monkeypatch.setattr(bench_server.torchserve, "Server", FakeServer)
    monkeypatch.setattr(bench_server.torchserve.Ports, "free", classmethod(lambda cls: None))
    monkeypatch.setattr(bench_server.torchserve, "start", lambda server, mar: server)
    monkeypatch.setattr(bench_server.torchserve, "stop", lambda server: None)

    def fake_locust(host, model, users, duration_s, out_dir, **kw):
        loads.append((host.removeprefix("http://"), out_dir.name))
        return result(10, {50.0: 10})

    monkeypatch.setattr(loadtest, "run_locust", fake_locust)
    runs = bench_server.server_bench("tiny", 4, tmp_path / "p.csv", tmp_path, duration_s=5, rounds=3,
                                     graph_mode="eager", payload="raw", log=lambda *_: None)
    assert [b["graph_mode"] for b in built] == ["eager", None, None]  # packrat follows its profile
    assert not any(b["share_node"] for b in built)  # side by side, each plans for the whole machine
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

def test_the_demo_serves_the_largest_batch_whose_plan_splits_the_cores(toy):
    _, planned = plans(toy)
    assert [demo.splits(p) for p in planned] == [False, True, False, True]
    assert demo.showcase_batch(planned) == 8
    assert demo.showcase_batch(planned[:1]) == 1  # nothing splits: the largest batch


def test_the_demo_says_why_the_plan_keeps_one_instance(toy, capsys):
    profile, planned = plans(toy)
    demo.print_where_fat(profile, planned)
    out = capsys.readouterr().out
    assert "Where the plan keeps one instance (B=1, 4)" in out
    assert "B=1: one request cannot be split" in out
    assert "B=4: halves, 2×⟨1 threads, batch 2⟩, would take 40 ms against 35 ms for 1×⟨2 threads, batch 4⟩" \
        in out


def test_the_demo_profile_keeps_the_default_one_for_serve():
    assert demo.demo_profile_path("bert_base", "compile") == Path("profiles/bert_base.csv")
    assert demo.demo_profile_path("bert_base", "eager") == Path("profiles/eager-bert_base.csv")


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
        loads = {"stock": result(30, {90.0: 30}, 3.0), "packrat-fat": result(30, {100.0: 30}, 3.0),
                 "packrat-plan": result(33, {90.0: 33}, 3.3)}
        return [bench_server.ServerRun(batches[0], name, batches[0], "B", "raw", None, load, kw["rounds"])
                for name, load in loads.items()]

    monkeypatch.setattr(demo_command, "measure_profile", fake_measure)
    monkeypatch.setattr(demo_command, "run_server_bench", fake_bench if served is not None else None)
    assert main(["demo", "--model", "tiny", *argv]) == 0
    return measured


def test_demo_no_serve_profiles_plans_and_plots(monkeypatch, tmp_path, capsys):
    measured = run_demo(monkeypatch, tmp_path, ["--no-serve"])
    assert measured == [("tiny", "profiles/eager-tiny.csv", [1, 2, 4, 8], "eager")]
    out = capsys.readouterr().out
    assert "== 1/4 profile tiny (eager mode)" in out and "== 4/4" not in out
    assert "2×⟨1 threads, batch 4⟩" in out and "Where the plan keeps one instance (B=1, 4)" in out
    assert sorted(p.name for p in (tmp_path / "out" / "plots").iterdir()) == [
        "toy-latency-heatmap.png", "toy-plan-vs-fat-T2.png"]


def test_demo_serves_where_the_plan_splits_and_says_what_the_table_shows(monkeypatch, tmp_path, capsys):
    served = {}
    run_demo(monkeypatch, tmp_path, ["--rounds", "2"], served)
    assert served["batches"] == [8] and served["users"] == [BATCH_USERS] and served["rounds"] == 2
    assert served["graph_mode"] == "eager"  # the profile's: stock runs the model as packrat does
    out = capsys.readouterr().out
    assert "at B=8 the plan splits the 2 cores into 2×⟨1 threads, batch 4⟩, predicted 70 ms" in out
    assert "against 80 ms for fat ⟨2 threads, batch 8⟩" in out
    assert "p50 was 0.90× fat's" in out and "1.10× fat's requests per second" in out
    assert "the win packrat is for" in out


def test_demo_at_a_batch_the_plan_keeps_whole_says_so(monkeypatch, tmp_path, capsys):
    served = {}
    run_demo(monkeypatch, tmp_path, ["--serve-batch", "4"], served)
    assert served["batches"] == [4]
    assert "At B=4 the plan keeps one instance on this machine, so packrat plan = packrat fat" in \
        capsys.readouterr().out


def test_bench_rounds_default_per_mode():
    parser = argparse.ArgumentParser()
    cli_bench.add_bench_parser(parser.add_subparsers())
    assert parser.parse_args(["bench"]).rounds is None  # 1 through TorchServe, POOL_ROUNDS with --pool-only
    assert cli_bench.POOL_ROUNDS == 20


def test_the_verdict_says_when_the_plan_did_not_clearly_win(toy, capsys):
    _, planned = plans(toy)
    runs = [bench_server.ServerRun(8, name, 8, "B", "raw", None, result(30, {p50: 30}, rps), 3)
            for name, p50, rps in (("stock", 100.0, 3.0), ("packrat-fat", 90.0, 3.0), ("packrat-plan", 100.0, 3.3))]
    demo.print_verdict(runs, planned[-1])
    out = capsys.readouterr().out
    assert "p50 was 1.11× fat's" in out and "not a clear win this time" in out
