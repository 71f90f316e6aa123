"""Thread-kind profile points: ⌊T/t⌋ sessions as threads of one process, as the pool serves them."""

from __future__ import annotations

import dataclasses
import os

import pytest

from packrat.machine.topology import Topology
from packrat.models import runtimes
from packrat.profiling import measuring, profiler, profiles

pytestmark = [pytest.mark.integration,  # profile-point processes and the ONNX export
              pytest.mark.skipif(not runtimes.installed("onnxruntime"), reason="onnxruntime is not installed"),
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two sessions on cores of their own")]

SETTINGS = profiler.ProfileSettings(model="tiny", warmup=1, iters=3, runtime="onnxruntime-thread", payload="raw")
CORES = sorted(os.sched_getaffinity(0))[:2]
TWO_CORES = Topology((tuple(CORES),))  # a made-up one-socket machine of two of this one's cores


def test_the_profiler_measures_a_thread_runtime_as_threads_and_the_profile_loads_it(tmp_path):
    loaded = measuring.measure(SETTINGS, 1, 2, TWO_CORES)
    assert loaded["copies"] == 2 and loaded["isolated_ms"] is None and loaded["served_isolated_ms"] is None
    assert loaded["session_cores"] == [[CORES[0]], [CORES[1]]]  # threads of one process, not a process a copy
    alone = measuring.measure(SETTINGS, 2, 2, TWO_CORES)
    assert alone["copies"] == 1 and alone["isolated_ms"] == alone["latency_ms"]
    assert alone["served_isolated_ms"] == alone["served_ms"] > 0
    # One session on both cores: its thread pinned to the first, its intra-op thread to the second.
    assert alone["copy_cores"] == [CORES] and alone["session_cores"] == [CORES[:1]]
    out = tmp_path / "tiny.csv"
    with profiles.ProfileWriter(out, profiler.metadata(SETTINGS, TWO_CORES, {"onnxruntime-thread": None})) as writer:
        writer.write(loaded)
        writer.write(alone)
    profile = profiles.load(out)
    assert profile.loaded and set(profile.runtimes.values()) == {"onnxruntime-thread"}
    assert set(profile.served["onnxruntime-thread"]) == {(1, 2), (2, 2)}
    latency, isolated = profile.by_runtime["onnxruntime-thread"][1, 2]  # written rounded
    assert latency == pytest.approx(loaded["latency_ms"], abs=1e-3) and isolated is None


def test_thread_workers_measure_point_after_point_in_one_process():
    with measuring.Workers(dataclasses.replace(SETTINGS, isolated_too=True), 1, TWO_CORES) as workers:
        rows = [workers.measure(batch) for batch in (2, 1)]
    assert [row["batch"] for row in rows] == [2, 1] and rows[0]["pid"] == rows[1]["pid"]  # one process
    for row in rows:
        assert row["copies"] == 2 and row["copy_cores"] == [[CORES[0]], [CORES[1]]] and row["process_cores"] == CORES
        # Each session's thread is a thread of the point's process (found in its /proc/PID/task, else
        # None), not its main thread, one per session, and pinned to its own core.
        assert len(set(row["session_threads"])) == 2 and row["pid"] not in row["session_threads"]
        assert row["session_cores"] == [[CORES[0]], [CORES[1]]]
        assert row["isolated_ms"] > 0 and row["served_isolated_ms"] > 0
        assert row["iterations"] == 3 and row["served_iterations"] == 3
        assert row["latency_ms"] >= row["copy_ms"] > 0  # a round waits for its slowest session
        assert row["served_ms"] > 0 and row["served_model_ms"] > 0 and row["mode"] == "onnxruntime-thread"
    with measuring.Workers(SETTINGS, 2, TWO_CORES) as workers:
        alone = workers.measure(2)
    assert alone["copies"] == 1 and alone["isolated_ms"] == alone["latency_ms"] and alone["session_cores"] == [CORES[:1]]
