"""Thread-kind profile points: ⌊T/t⌋ sessions as threads of one process, as the pool serves them."""

from __future__ import annotations

import os

import pytest

from packrat.machine.topology import Topology
from packrat.models import runtimes
from packrat.profiling import profiler, profiles

pytestmark = [pytest.mark.integration,  # profile-point processes and the ONNX export
              pytest.mark.skipif(not runtimes.installed("onnxruntime"), reason="onnxruntime is not installed"),
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two sessions on cores of their own")]

SETTINGS = profiler.ProfileSettings(model="tiny", warmup=1, iters=3, runtime="onnxruntime-thread", payload="raw")


def test_a_thread_point_runs_its_sessions_in_one_process_on_their_cores():
    cores = sorted(os.sched_getaffinity(0))[:2]
    row = profiler.measure_point(SETTINGS, 1, 2, cores, "--thread-copies", f"{cores[0]};{cores[1]}")
    assert row["copy_cores"] == [[cores[0]], [cores[1]]] and row["copies"] == 2
    # one process, a thread of its own per session (not its main thread, not a process per copy)
    assert len(set(row["session_threads"])) == 2 and row["pid"] not in row["session_threads"]
    assert row["process_cores"] == cores
    assert row["served_ms"] > 0 and row["latency_ms"] > 0 and row["iterations"] == 3


def test_the_profiler_measures_a_thread_runtime_as_threads_and_the_profile_loads_it(tmp_path):
    topology = Topology.virtual(2)
    loaded = profiler.measure(SETTINGS, 1, 2, topology)
    alone = profiler.measure(SETTINGS, 2, 2, topology)
    assert loaded["copies"] == 2 and loaded["isolated_ms"] is None and len(loaded["session_threads"]) == 2
    assert alone["copies"] == 1 and alone["isolated_ms"] == alone["latency_ms"]
    out = tmp_path / "tiny.csv"
    profiler.run(SETTINGS, [1, 2], [2], out, topology=topology, progress=False, runtimes=("onnxruntime-thread",),
                 say=lambda *_: None)
    profile = profiles.load(out)
    assert set(profile.runtimes.values()) == {"onnxruntime-thread"} and (1, 2) in profile.served["onnxruntime-thread"]
