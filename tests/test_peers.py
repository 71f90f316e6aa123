"""packrat bench peers (packrat/bench/peers.py): its summary, ratios and tables from made-up runs, and one smoke run on `tiny`."""

from __future__ import annotations

import importlib.util
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from packrat.bench import harness, peer_runners, peers, peers_report


def parse(argv: list[str]):
    """`packrat bench peers ARGV`'s arguments."""
    from packrat.cli.main import build_parser

    return build_parser().parse_args(["bench", "peers", *argv])


def run_of(*ms: float | None, note: str = "", setup: float = 1.0, diff: float = 0.0, rel: float | None = None,
           group: int = 0) -> dict:
    """A peer's start and rounds at one B as measure() records them: a figure per round (None: that round failed)."""
    rel = diff if rel is None else rel
    start = {"setup_s": setup, "note": note, "max_abs_diff": diff, "relative_diff": rel, "differs": rel > 1e-3}
    return {"start": start, "rounds": [{"group": group, "round": r, "latency_ms": v, "samples_ms": [v]} if v is not None
                                       else {"group": group, "round": r, "error": "E: lost"} for r, v in enumerate(ms, 1)]}


def test_vs_packrat_pairs_each_round_with_packrat_s_and_a_lost_round_does_not_bias_it():
    # the machine slows down round after round; the peer is 5 % behind packrat in every round it ran
    runs = {"8": {"packrat": run_of(10.0, 20.0, 30.0), "onnxruntime": run_of(10.5, 21.0, None)}}
    row = peers_report.summarise(runs, [8])[8]["onnxruntime"]
    assert row["latency_ms"] == pytest.approx(15.75) and row["failed_rounds"] == 1
    # the ratio of medians would say 15.75 / 20 = 0.79: the peer far ahead; paired, it is behind
    assert row["vs_packrat"] == pytest.approx(1.05) and row["vs_packrat_spread"] == pytest.approx([1.05, 1.05])
    assert peers_report.verdict_lines(peers_report.summarise(runs, [8])) == [
        "B=8: best peer / packrat ≥ 0.98: PASS (onnxruntime / packrat 1.050, median of 2 paired round(s), 1.050–1.050; "
        "packrat − onnxruntime -0.750 ms a batch)"]  # paired: -0.5 and -1.0 ms, not the medians' 4.25


def test_a_model_of_next_to_no_cost_is_shown_to_the_microsecond():
    """Its table shows three decimals, not 0.00, and its verdict how far packrat is behind in ms."""
    runs = {"8": {"packrat": run_of(0.17, 0.16, 0.18), "onnxruntime": run_of(0.006, 0.007, 0.006)}}
    summary = peers_report.summarise(runs, [8])
    assert summary[8]["onnxruntime"]["packrat_behind_ms"] == pytest.approx(0.164)
    assert "| onnxruntime | 0.006 (0.006–0.007) |" in peers_report.markdown(summary)
    assert peers_report.verdict_lines(summary)[0].endswith("packrat − onnxruntime +0.164 ms a batch)")


def test_summary_medians_over_rounds_spreads_and_failures():
    runs = {"1": {"packrat": run_of(10.0, 12.0, 11.0), "eager": run_of(30.0, None, 20.0, setup=0.5),
                  "openvino-latency": run_of(5.0, diff=2e-2, rel=5e-3, note="1 stream(s)")},
            "4": {"packrat": {"start": {"skipped": "no plan for B=4"}, "rounds": []}, "eager": run_of(80.0, 60.0),
                  "openvino-latency": {"start": {"error": "E: bad"}, "rounds": []}}}
    summary = peers_report.summarise(runs, [1, 4], skipped={"onnxruntime": "not installed (pip install onnxruntime)"})
    one, four = summary[1], summary[4]
    assert list(one) == ["packrat", "eager", "openvino-latency", "onnxruntime"]  # the declared order
    assert one["packrat"]["latency_ms"] == 11.0 and one["packrat"]["vs_packrat"] == 1.0
    assert one["packrat"]["spread_ms"] == [10.0, 12.0]
    assert one["eager"]["latency_ms"] == 25.0 and one["eager"]["rounds"] == 2 and one["eager"]["failed_rounds"] == 1
    assert one["eager"]["setup_s"] == 0.5
    assert one["eager"]["vs_packrat"] == pytest.approx((3.0 + 20.0 / 11.0) / 2)  # rounds 1 and 3, paired
    assert one["openvino-latency"]["vs_packrat"] == 0.5  # timed in round 1 only: paired with packrat's round 1
    assert one["openvino-latency"]["differs"] and one["openvino-latency"]["max_abs_diff"] == 2e-2
    assert one["openvino-latency"]["note"] == "1 stream(s)"
    assert one["onnxruntime"] == {"error": "not installed (pip install onnxruntime)", "skipped": True}
    assert four["packrat"] == {"error": "no plan for B=4", "skipped": True}
    assert four["eager"]["latency_ms"] == 70.0 and "vs_packrat" not in four["eager"]  # no packrat to pair with
    assert four["openvino-latency"] == {"error": "E: bad"}


def test_markdown_rows():
    runs = {"2": {"packrat": run_of(10.0, 11.0), "fat": run_of(15.0, 16.5, note="⟨2 threads | batch 2⟩"),
                  "openvino-throughput": run_of(9.0, 9.9, diff=0.5, rel=0.01)}}
    summary = peers_report.summarise(runs, [2], skipped={"onnxruntime-parallel": "not installed (pip install onnxruntime)"})
    table = peers_report.markdown(summary, "tiny, T = 2", {2: "packrat plan: 2×⟨1 threads, batch 1⟩"})
    assert table.startswith("tiny, T = 2\n")
    assert "### B = 2" in table and "packrat plan: 2×⟨1 threads, batch 1⟩" in table
    assert "| packrat | 10.50 (10.00–11.00) | 1.00 (1.00–1.00) | 0.0e+00 | 1.0 |  |" in table
    assert "| fat | 15.75 (15.00–16.50) | 1.50 (1.50–1.50) | 0.0e+00 | 1.0 | ⟨2 threads \\| batch 2⟩ |" in table
    assert "| openvino-throughput | 9.45 (9.00–9.90) | 0.90 (0.90–0.90) | 5.0e-01 DIFFERS | 1.0 |  |" in table
    assert "| onnxruntime-parallel | - | - | - | - | not installed (pip install onnxruntime) |" in table


class FakePeers:
    """The peers' processes, answering from a table: each peer's ms (its n-th timed round gets
    ms + n, so rounds differ); `ends` names a peer whose process ends at its first timed round."""

    def __init__(self, ms: dict[str, float], ends: str | None = None, unplanned: str | None = None):
        self.ms, self.ends, self.unplanned, self.requests, self.up, self.timed = ms, ends, unplanned, [], set(), {}

    def __call__(self, peer: str, request: dict) -> dict:
        self.requests.append((peer, request["op"], request["batch"]))
        key = (peer, request["batch"])
        if request["op"] == "start":
            if peer == self.unplanned:
                return {"skipped": "no plan"}
            self.up.add(key)
            return {"setup_s": 1.0, "note": "", "output": f"{peer}.npy"}
        assert key in self.up, f"{peer} asked to {request['op']} at B={request['batch']} without a start"
        if request["op"] == "stop":
            self.up.discard(key)
            return {}
        if peer == self.ends:
            self.up.discard(key)
            return {"error": "exit -9: killed", "ended": True}
        self.timed[key] = self.timed.get(key, 0) + 1
        return {"latency_ms": self.ms[peer] + self.timed[key], "samples_ms": []}


def test_each_peer_is_started_once_per_b_and_timed_every_round_on_what_it_started():
    fake = FakePeers({"packrat": 10.0, "onnxruntime": 20.0, "eager": 40.0})
    runs = peers.measure(["onnxruntime", "packrat", "eager"], [2, 4], 3, fake, random.Random(0), say=lambda _: None)
    for batch in (2, 4):
        ops = [(peer, op) for peer, op, b in fake.requests if b == batch]
        assert sorted(p for p, op in ops if op == "start") == ["eager", "onnxruntime", "packrat"]  # once each
        assert sorted(p for p, op in ops if op == "stop") == ["eager", "onnxruntime", "packrat"]
        assert all(len(runs[str(batch)][p]["rounds"]) == 3 for p in ("packrat", "onnxruntime", "eager"))
    assert not fake.up  # everything stopped
    assert peers_report.summarise(runs, [2])[2]["onnxruntime"]["vs_packrat"] == pytest.approx(22.0 / 12.0)


def test_short_of_memory_the_peers_left_wait_for_a_group_of_their_own_beside_packrat():
    fake = FakePeers({"packrat": 10.0, "onnxruntime": 20.0, "openvino-latency": 30.0, "eager": 40.0})
    live = []
    runs = peers.measure(["packrat", "onnxruntime", "openvino-latency", "eager"], [8], 2, fake, random.Random(1),
                         memory_low=lambda: len(fake.up) >= 2, say=live.append)
    table = runs["8"]
    groups = {p: {r["group"] for r in table[p]["rounds"]} for p in table}
    assert groups == {"packrat": {0, 1, 2}, "onnxruntime": {0}, "openvino-latency": {1}, "eager": {2}}
    assert [op for p, op, _ in fake.requests if p == "packrat"].count("start") == 1  # kept up across groups
    assert not fake.up and any("(group 3)" in line for line in live)
    row = peers_report.summarise(runs, [8])[8]["eager"]  # paired with packrat's rounds in its own group
    assert row["vs_packrat"] == pytest.approx(statistics.median([41.0 / 15.0, 42.0 / 16.0]))


def test_a_peer_whose_process_ended_is_timed_no_further_and_without_a_plan_never():
    fake = FakePeers({"packrat": 10.0, "onnxruntime": 20.0, "fat": 5.0}, ends="onnxruntime", unplanned="fat")
    runs = peers.measure(["packrat", "onnxruntime", "fat"], [2], 3, fake, random.Random(0), say=lambda _: None)
    assert len(runs["2"]["onnxruntime"]["rounds"]) == 1 and runs["2"]["fat"]["rounds"] == []
    rows = peers_report.summarise(runs, [2])[2]
    assert rows["onnxruntime"] == {"error": "exit -9: killed"} and rows["fat"] == {"error": "no plan", "skipped": True}
    assert ("onnxruntime", "stop", 2) not in fake.requests and not fake.up


def test_diff_stats():
    reference = np.array([[1.0, -4.0], [2.0, 0.5]])
    close = peers_report.diff_stats(reference + 1e-4, reference)
    assert close["max_abs_diff"] == pytest.approx(1e-4) and close["relative_diff"] == pytest.approx(2.5e-5)
    assert not close["differs"]
    far = peers_report.diff_stats(reference + np.array([[0.0, 0.01], [0.0, 0.0]]), reference)
    assert far["differs"] and far["relative_diff"] == pytest.approx(0.0025)
    assert peers_report.diff_stats(reference[:1], reference)["differs"]
    assert peers_report.diff_stats(reference * np.nan, reference)["why"] == "non-finite outputs"


def test_missing_packages_and_parsing():
    assert peer_runners.missing_packages("openvino-latency", installed=lambda name: False) == \
        "not installed (pip install openvino)"
    assert peer_runners.missing_packages("onnxruntime", installed=lambda name: True) is None
    assert peer_runners.missing_packages("eager", installed=lambda name: False) is None
    assert parse(["--peers", "eager,fat,eager"]).peers == ["eager", "fat"]
    with pytest.raises(SystemExit):
        parse(["--peers", "eager,tensorrt"])
    assert parse([]).ort_parallel_threads == (None, 1)  # None: T, the cores
    assert parse(["--ort-parallel-threads", "2:4"]).ort_parallel_threads == (2, 4)
    for wrong in ("0:1", "2", "T:1:1", "a:1"):
        with pytest.raises(SystemExit):
            parse(["--ort-parallel-threads", wrong])
    cores = list(harness.local_topology(None).cores)
    assert list(harness.local_topology(1, "--cores").cores) == cores[:1]
    with pytest.raises(SystemExit, match="--cores"):
        harness.local_topology(len(cores) + 1, "--cores")


def test_v2_requests_and_answer():
    from packrat.models.zoo import resolve

    requests = harness.pool_requests(resolve("tiny"), 2, v2=True)
    assert len(requests) == 2 and {r.content_type for r in requests} == {"application/json"}
    body = json.loads(requests[1].body)["inputs"][0]
    assert body["datatype"] == "FP32" and len(body["data"]) == np.prod(body["shape"])
    answer = json.dumps({"model_name": "m", "outputs": [{"name": "output0", "shape": [1, 2], "datatype": "FP32",
                                                         "data": [0.5, -1.0]}]}).encode()
    assert peer_runners.v2_output(answer).tolist() == [[0.5, -1.0]]


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@pytest.mark.integration
def test_smoke_run_on_tiny(tmp_path):
    """One real run: tiny, B = 2, one round of two timed batches, against a made-up profile.
    The suite's compile cache (tests/conftest.py) is kept: OpenVINO's IR and the ONNX file of tiny
    are built once for this run and tests/test_runtimes.py."""
    from packrat.profiling.profiles import ProfileWriter

    profile = tmp_path / "tiny.csv"
    with ProfileWriter(profile, {"model": "tiny", "mode": "eager", "latency": "isolated"}) as writer:
        for threads in (1, 2):
            for batch in (1, 2):
                writer.write({"threads": threads, "batch": batch, "latency_ms": 0.2 + batch / threads})
    chosen = ["eager", "script", "packrat", "fat"]
    chosen += ["openvino-latency"] if _installed("openvino") else []
    chosen += ["onnxruntime"] if _installed("onnxruntime") else []
    out = tmp_path / "peers.json"
    done = subprocess.run([sys.executable, "-m", "packrat.cli", "bench", "peers", "--model", "tiny", "--batches", "2", "--rounds", "1",
                           "--iters", "2", "--warmup", "1", "--cores", "1", "--peers", ",".join(chosen),
                           "--profile", str(profile), "--json", str(out), "--keep-caches"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["meta"]["threads"] == 1 and report["meta"]["peers"] == chosen
    for batch in ("2",):
        rows = report["summary"][batch]
        assert set(rows) == set(chosen)
        for peer in chosen:
            assert rows[peer].get("latency_ms") is not None, (peer, batch, rows[peer])
            assert rows[peer]["max_abs_diff"] is not None and not rows[peer]["differs"], (peer, rows[peer])
        assert rows["packrat"]["vs_packrat"] == 1.0
    assert "### B = 2" in report["markdown"] and "packrat plan:" in report["markdown"]


def test_packrat_later_runs_only_with_a_later_profile():
    assert peers.with_later(["eager", "packrat", "fat"], None) == ["eager", "packrat", "fat"]
    assert peers.with_later(["eager", "packrat", "fat"], Path("b.csv")) == ["eager", "packrat", "packrat-later", "fat"]
    assert peers.with_later(["packrat-later", "eager"], None) == ["eager"]
    assert peers.with_later(["eager"], Path("b.csv")) == ["packrat-later", "eager"]
    assert "packrat-later" not in parse([]).peers


def _profile(path: Path, split_ms: float) -> Path:
    from packrat.profiling.profiles import ProfileWriter

    with ProfileWriter(path, {"model": "tiny", "mode": "eager", "latency": "isolated"}) as writer:
        for threads, batch, ms in ((1, 1, split_ms), (1, 2, 2 * split_ms), (2, 1, 6.0), (2, 2, 8.0)):
            writer.write({"threads": threads, "batch": batch, "latency_ms": ms})
    return path


def test_two_profiles_plan_each_their_own_pool(tmp_path):
    """packrat plans on --profile, packrat-later on --later-profile, side by side per B."""
    early, later = _profile(tmp_path / "a.csv", 3.0), _profile(tmp_path / "b.csv", 30.0)
    args = parse(["--model", "tiny", "--batches", "2", "--profile", str(early),
                                      "--later-profile", str(later)])
    pools = peers.pool_plans(args, [0, 1])
    assert pools["packrat"]["2"]["describe"].startswith("2×") and pools["packrat"]["2"]["predicted_ms"] == 3.0
    assert pools["packrat-later"]["2"]["describe"].startswith("1×") and pools["packrat-later"]["2"]["predicted_ms"] == 8.0
    assert "packrat plan: 2×" in pools["lines"][2] and "packrat-later plan: 1×" in pools["lines"][2]
    missing = parse(["--model", "tiny", "--batches", "2", "--profile", str(tmp_path / "none.csv"),
                                         "--later-profile", str(later)])
    pools = peers.pool_plans(missing, [0, 1])
    assert "no profile" in pools["packrat"]["2"]["skipped"] and pools["lines"][2].startswith("packrat-later plan")


def test_a_pool_peer_s_path_is_summed_from_its_stage_medians():
    stages = {"queue": 0.02, "copy": 0.08, "send": 0.0, "wake": 0.05, "locks": 0.01, "decode": 0.1, "model": 10.0,
              "encode": 0.3, "reply": 0.03, "hand_out": 0.04, "total": 10.6}
    packrat = run_of(11.0, 12.0)
    packrat["rounds"][0]["stage_ms"], packrat["rounds"][1]["stage_ms"] = stages, {**stages, "wake": 0.15}
    summary = peers_report.summarise({"1": {"packrat": packrat, "onnxruntime": run_of(10.0)}}, [1])
    assert summary[1]["packrat"]["stage_ms"]["wake"] == pytest.approx(0.10)  # the median over rounds
    assert "stage_ms" not in summary[1]["onnxruntime"]
    text = peers_report.markdown(summary, predicted={1: 11.5})
    line = next(line for line in text.splitlines() if line.startswith("- packrat"))
    assert "hand-off 0.120 ms" in line and "copy 0.080" in line  # queue + send + wake; the copy apart
    assert "predicted 11.50 ms / served 11.50 = 1.000" in line


def test_the_verdict_takes_the_best_peer_that_ran_and_fails_where_one_did_not():
    runs = {"packrat": run_of(10.0), "fat": run_of(9.0), "eager": run_of(20.0), "onnxruntime": run_of(9.9)}
    summary = peers_report.summarise({"8": runs}, [8])
    peer, row, unmeasured = peers_report.best_peer(summary[8])
    assert (peer, row["latency_ms"], unmeasured) == ("onnxruntime", 9.9, [])  # fat is packrat's own, not a peer
    line, = peers_report.verdict_lines(summary)
    assert line == ("B=8: best peer / packrat ≥ 0.98: PASS (onnxruntime / packrat 0.990, median of 1 paired round(s), "
                    "0.990–0.990; packrat − onnxruntime +0.100 ms a batch)")
    behind = peers_report.summarise({"8": {**runs, "openvino-latency": run_of(9.7)}}, [8])
    assert "FAIL (openvino-latency / packrat 0.970" in peers_report.verdict_lines(behind)[0]
    failed = peers_report.summarise({"8": {**runs, "openvino-latency": {"start": {"error": "crashed"}, "rounds": []}}}, [8])
    assert "FAIL" in peers_report.verdict_lines(failed)[0] and "not measured: openvino-latency" in peers_report.verdict_lines(failed)[0]
    # beside the oracle: where it beats the best peer by 10 %, packrat must be 10 % ahead too
    assert peers_report.peer_verdict(1.05, [], ahead=1.2) == (False, [])
    assert peers_report.peer_verdict(1.05, [], ahead=1.05) == (True, [])
    assert peers_report.peer_verdict(1.05, [], ahead=None) == (False, ["no oracle"])


def test_the_best_peer_is_the_one_closest_to_packrat_round_by_round_not_the_lowest_median():
    # openvino missed the fast first round: its median is the higher, yet it ran 5 % ahead of packrat
    runs = {"8": {"packrat": run_of(10.0, 20.0, 30.0), "onnxruntime": run_of(9.7, 19.4, 29.1),
                  "openvino-latency": run_of(None, 19.0, 28.5)}}
    summary = peers_report.summarise(runs, [8])
    assert summary[8]["onnxruntime"]["latency_ms"] < summary[8]["openvino-latency"]["latency_ms"]
    assert peers_report.best_peer(summary[8])[0] == "openvino-latency"
    assert "FAIL (openvino-latency / packrat 0.950" in peers_report.verdict_lines(summary)[0]
