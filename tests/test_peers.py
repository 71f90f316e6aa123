"""packrat bench peers (packrat/bench/peers.py): its summary, ratios and tables from made-up runs, and one smoke run on `tiny`."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from packrat.bench import peers


def parse(argv: list[str]):
    """`packrat bench peers ARGV`'s arguments."""
    from packrat.cli.main import build_parser

    return build_parser().parse_args(["bench", "peers", *argv])


def entry(ms: float, diff: float = 0.0, rel: float | None = None, note: str = "", setup: float = 1.0) -> dict:
    return {"latency_ms": ms, "samples_ms": [ms], "setup_s": setup, "note": note, "max_abs_diff": diff,
            "relative_diff": diff if rel is None else rel, "differs": (diff if rel is None else rel) > 1e-3}


def test_ratio_is_peer_over_packrat():
    assert peers.ratio(20.0, 10.0) == 2.0
    assert peers.ratio(5.0, 10.0) == 0.5
    assert peers.ratio(None, 10.0) is None and peers.ratio(5.0, None) is None and peers.ratio(5.0, 0.0) is None


def test_summary_medians_over_rounds_ratios_and_failures():
    runs = {
        "packrat": [{"batches": {"1": entry(10.0), "4": {"skipped": "no plan for B=4"}}},
                    {"batches": {"1": entry(12.0), "4": {"skipped": "no plan for B=4"}}},
                    {"batches": {"1": entry(11.0), "4": {"skipped": "no plan for B=4"}}}],
        "eager": [{"batches": {"1": entry(30.0, setup=0.5), "4": entry(80.0)}},
                  {"error": "exit 1: boom"},
                  {"batches": {"1": entry(20.0, setup=1.5), "4": entry(60.0)}}],
        "openvino-latency": [{"batches": {"1": entry(5.0, 2e-2, 5e-3, note="1 stream(s)"), "4": {"error": "E: bad"}}}],
    }
    summary = peers.summarise(runs, [1, 4], skipped={"onnxruntime": "not installed (pip install onnxruntime)"})
    one, four = summary[1], summary[4]
    assert list(one) == ["packrat", "eager", "openvino-latency", "onnxruntime"]  # the declared order
    assert one["packrat"]["latency_ms"] == 11.0 and one["packrat"]["vs_packrat"] == 1.0
    assert one["eager"]["latency_ms"] == 25.0 and one["eager"]["rounds"] == 2 and one["eager"]["failed_rounds"] == 1
    assert one["eager"]["setup_s"] == 1.0
    assert one["eager"]["vs_packrat"] == pytest.approx(25.0 / 11.0)
    assert one["openvino-latency"]["differs"] and one["openvino-latency"]["max_abs_diff"] == 2e-2
    assert one["openvino-latency"]["note"] == "1 stream(s)"
    assert one["onnxruntime"] == {"error": "not installed (pip install onnxruntime)", "skipped": True}
    assert four["packrat"] == {"error": "no plan for B=4", "skipped": True}
    assert four["eager"]["latency_ms"] == 70.0 and four["eager"]["vs_packrat"] is None  # no packrat to compare
    assert four["openvino-latency"] == {"error": "E: bad"}


def test_markdown_rows():
    runs = {"packrat": [{"batches": {"2": entry(10.0)}}],
            "fat": [{"batches": {"2": entry(15.0, note="⟨2 threads | batch 2⟩")}}],
            "openvino-throughput": [{"batches": {"2": entry(9.0, 0.5, 0.01)}}]}
    summary = peers.summarise(runs, [2], skipped={"onnxruntime-parallel": "not installed (pip install onnxruntime)"})
    table = peers.markdown(summary, "tiny, T = 2", {2: "packrat plan: 2×⟨1 threads, batch 1⟩"})
    assert table.startswith("tiny, T = 2\n")
    assert "### B = 2" in table and "packrat plan: 2×⟨1 threads, batch 1⟩" in table
    assert "| packrat | 10.00 | 1.00 | 0.0e+00 | 1.0 |  |" in table
    assert "| fat | 15.00 | 1.50 | 0.0e+00 | 1.0 | ⟨2 threads \\| batch 2⟩ |" in table
    assert "| openvino-throughput | 9.00 | 0.90 | 5.0e-01 DIFFERS | 1.0 |  |" in table
    assert "| onnxruntime-parallel | - | - | - | - | not installed (pip install onnxruntime) |" in table


def test_diff_stats():
    reference = np.array([[1.0, -4.0], [2.0, 0.5]])
    close = peers.diff_stats(reference + 1e-4, reference)
    assert close["max_abs_diff"] == pytest.approx(1e-4) and close["relative_diff"] == pytest.approx(2.5e-5)
    assert not close["differs"]
    far = peers.diff_stats(reference + np.array([[0.0, 0.01], [0.0, 0.0]]), reference)
    assert far["differs"] and far["relative_diff"] == pytest.approx(0.0025)
    assert peers.diff_stats(reference[:1], reference)["differs"]
    assert peers.diff_stats(reference * np.nan, reference)["why"] == "non-finite outputs"


def test_missing_packages_and_parsing():
    assert peers.missing_packages("openvino-latency", installed=lambda name: False) == \
        "not installed (pip install openvino)"
    assert peers.missing_packages("onnxruntime", installed=lambda name: True) is None
    assert peers.missing_packages("eager", installed=lambda name: False) is None
    assert parse(["--peers", "eager,fat,eager"]).peers == ["eager", "fat"]
    with pytest.raises(SystemExit):
        parse(["--peers", "eager,tensorrt"])
    assert peers.parse_ratio("T:1", 8) == (8, 1) and peers.parse_ratio("2:4", 8) == (2, 4)
    with pytest.raises(SystemExit):
        peers.parse_ratio("0:1", 8)
    assert peers.parse_cores(None, [0, 2, 4]) == [0, 2, 4] and peers.parse_cores(2, [0, 2, 4]) == [0, 2]
    with pytest.raises(SystemExit):
        peers.parse_cores(4, [0, 1])


def test_v2_requests_and_answer():
    from packrat.models.zoo import resolve

    requests = peers.pool_requests(resolve("tiny"), 2, v2=True)
    assert len(requests) == 2 and {r.content_type for r in requests} == {"application/json"}
    body = json.loads(requests[1].body)["inputs"][0]
    assert body["datatype"] == "FP32" and len(body["data"]) == np.prod(body["shape"])
    answer = json.dumps({"model_name": "m", "outputs": [{"name": "output0", "shape": [1, 2], "datatype": "FP32",
                                                         "data": [0.5, -1.0]}]}).encode()
    assert peers.v2_output(answer).tolist() == [[0.5, -1.0]]


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
    runs = {"packrat": [{"batches": {"1": {"latency_ms": 11.0, "setup_s": 1.0, "stage_ms": stages}}},
                        {"batches": {"1": {"latency_ms": 12.0, "setup_s": 1.0, "stage_ms": {**stages, "wake": 0.15}}}}],
            "onnxruntime": [{"batches": {"1": {"latency_ms": 10.0, "setup_s": 0.5}}}]}
    summary = peers.summarise(runs, [1])
    assert summary[1]["packrat"]["stage_ms"]["wake"] == pytest.approx(0.10)  # the median over rounds
    assert "stage_ms" not in summary[1]["onnxruntime"]
    text = peers.markdown(summary, predicted={1: 11.5})
    line = next(line for line in text.splitlines() if line.startswith("- packrat"))
    assert "hand-off 0.120 ms" in line and "copy 0.080" in line  # queue + send + wake; the copy apart
    assert "predicted 11.50 ms / served 11.50 = 1.000" in line


def test_the_verdict_takes_the_best_peer_that_ran_and_fails_where_one_did_not():
    rows = {"packrat": entry(10.0), "fat": entry(9.0), "eager": entry(20.0), "onnxruntime": entry(9.9)}
    summary = peers.summarise({name: [{"batches": {"8": row}}] for name, row in rows.items()}, [8])
    assert peers.best_peer(summary[8]) == ("onnxruntime", 9.9, [])  # fat is packrat's own, not a peer
    line, = peers.verdict_lines(summary)
    assert line == "B=8: best peer / packrat ≥ 0.98: PASS (onnxruntime / packrat 0.990)"
    behind = peers.summarise({**{n: [{"batches": {"8": r}}] for n, r in rows.items()},
                              "openvino-latency": [{"batches": {"8": entry(9.7)}}]}, [8])
    assert "FAIL (openvino-latency / packrat 0.970)" in peers.verdict_lines(behind)[0]
    failed = peers.summarise({n: [{"batches": {"8": r}}] for n, r in rows.items()} | {"openvino-latency": [
        {"error": "crashed"}]}, [8])
    assert "FAIL" in peers.verdict_lines(failed)[0] and "not measured: openvino-latency" in peers.verdict_lines(failed)[0]
    # beside the oracle: where it beats the best peer by 10 %, packrat must be 10 % ahead too
    assert peers.peer_verdict(1.05, [], ahead=1.2) == (False, [])
    assert peers.peer_verdict(1.05, [], ahead=1.05) == (True, [])
    assert peers.peer_verdict(1.05, [], ahead=None) == (False, ["no oracle"])
