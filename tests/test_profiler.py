"""The profiler: real pinned measurements of the tiny model, resume, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from packrat import profiler
from packrat.measure import summarize
from packrat.profile import load
from packrat.topology import Topology, detect

FAST = profiler.Settings(model="tiny", warmup=1, iters=5)


def test_one_real_point_runs_pinned_with_its_threads():
    core = detect().cores[-1]
    stats = profiler.measure_point(FAST, 1, 2, [core])
    assert stats["cores"] == [core]
    assert stats["torch_threads"] == 1
    assert stats["mode"] == "script"
    assert stats["iterations"] == 5
    assert 0 < stats["p50_ms"] <= stats["p99_ms"]


def test_failed_point_names_the_point():
    with pytest.raises(profiler.ProfilingError, match="threads=1 batch=1 failed: .*unknown model"):
        profiler.measure_point(profiler.Settings(model="no_such_model", iters=1), 1, 1, [0])


def test_summary_statistics():
    stats = summarize([4.0, 1.0, 3.0, 2.0])
    assert stats["latency_ms"] == 2.5 and stats["p50_ms"] == 2.5 and stats["p99_ms"] == 4.0
    assert stats["iterations"] == 4


def test_run_writes_metadata_and_resumes(tmp_path, monkeypatch):
    calls = []

    def fake_measure(settings, t, b, cores):
        calls.append((t, b, tuple(cores)))
        return {"latency_ms": 10.0 * b / t, "p50_ms": 1.0, "p99_ms": 2.0, "std_ms": 0.1, "iterations": 3}

    monkeypatch.setattr(profiler, "measure_point", fake_measure)
    out = tmp_path / "tiny.csv"
    topo = Topology(((0, 1, 2, 3),))
    profiler.run(FAST, [1, 2], [1, 2], out, topology=topo, progress=False)
    assert calls == [(1, 1, (0,)), (1, 2, (0,)), (2, 1, (0, 1)), (2, 2, (0, 1))]
    calls.clear()
    profile = profiler.run(FAST, [1, 2, 4], [1, 2], out, topology=topo, progress=False)
    assert calls == [(4, 1, (0, 1, 2, 3)), (4, 2, (0, 1, 2, 3))]  # only the missing points
    assert len(profile.latency) == 6
    assert profile.metadata["model"] == "tiny" and profile.metadata["cores"] == "4"
    assert {"mode", "torch", "cpu", "date"} <= set(profile.metadata)


def test_run_refuses_more_threads_than_cores(tmp_path):
    with pytest.raises(ValueError, match="--threads: 3 exceeds the 2 cores"):
        profiler.run(FAST, [1, 3], [1], tmp_path / "x.csv", topology=Topology(((0, 1),)), progress=False)


def test_ctrl_c_leaves_a_valid_file_that_resumes(tmp_path):
    out = tmp_path / "tiny.csv"
    cmd = [sys.executable, "-m", "packrat.cli", "profile", "--model", "tiny", "--threads", "1",
           "--batches", "1-6", "--warmup", "1", "--iters", "300", "--out", str(out), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n1,") < 1):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
    _, err = proc.communicate(timeout=30)
    if proc.returncode == 0:
        pytest.skip("profiling finished before the interrupt arrived")
    assert proc.returncode == 130, err
    assert "run the same command to resume" in err
    partial = load(out)
    assert 1 <= len(partial.latency) < 6
    subprocess.run(cmd[:cmd.index("--iters") + 1] + ["3"] + cmd[cmd.index("--iters") + 2:], check=True, timeout=120)
    assert sorted(load(out).latency) == [(1, b) for b in range(1, 7)]
