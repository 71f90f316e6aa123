"""An instance against its profile point (packrat/bench/instance.py, benchmarks/instance_gap.py), and
what made instances slower than their points: torch's own threads beside another runtime's, and the
finite-number check of every input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.bench.instance import format_gaps, summary
from packrat.codec.samples import all_finite
from packrat.models.runtimes import torch_threads

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "instance_gap.py"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=0, max_size=40),
       st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
def test_all_finite_agrees_with_isfinite(values, dtype):
    tensor = torch.tensor(values, dtype=torch.float64).to(dtype)
    assert all_finite(tensor) == bool(torch.isfinite(tensor).all())


def test_torch_runs_one_thread_beside_another_runtime():
    for mode in ("compile", "eager", "script", "ios"):
        assert torch_threads(mode, 4) == 4  # torch runs the model: all of them
    for runtime in ("openvino", "onnxruntime"):
        assert torch_threads(runtime, 4) == 1


def test_summary_takes_medians_over_rounds_and_ratios_to_the_point():
    result = summary({"point": [10.0, 12.0, 11.0], "model": [11.0, 11.5, 30.0], "batch": [13.0, 12.0, 14.0]},
                     model="m", runtime="inductor", threads=2, batch=4, mode="eager", stage_ms={"decode": 0.5})
    assert result["median_ms"] == {"point": 11.0, "model": 11.5, "batch": 13.0}
    assert result["spread_ms"]["model"] == [11.0, 30.0] and result["rounds"] == 3
    assert result["model_vs_point"] == pytest.approx(11.5 / 11.0)
    table = format_gaps([result])
    assert "| m | inductor | 2 | 4 | 11.00 (10.00–12.00) | 11.50 (11.00–30.00) | 1.045 |" in table


@pytest.mark.integration
def test_the_benchmark_measures_a_point_and_an_instance(tmp_path):
    out = tmp_path / "gap.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--models", "tiny", "--runtimes", "inductor", "--batches", "2",
                           "--threads", "1", "--rounds", "1", "--iters", "3", "--graph-mode", "eager",
                           "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (result,) = json.loads(out.read_text())["results"]
    assert result["mode"] == "eager" and result["threads"] == 1 and result["batch"] == 2
    assert all(value > 0 for value in result["median_ms"].values())
    assert {"decode", "model", "encode"} <= set(result["stage_ms"])
    assert "| tiny | inductor | 1 | 2 |" in done.stdout
