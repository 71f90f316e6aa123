"""Runtimes measured no further where dominated (packrat/profiling/dominance.py), and the profiler
dropping them in a grid and in an adaptive run, with fake measurements."""

from __future__ import annotations

import dataclasses

import pytest

from packrat.machine.topology import Topology
from packrat.profiling import profiler
from packrat.profiling.dominance import DROP_AFTER, DominanceWatch, diagonal_first
from packrat.profiling.profiles import choose_runtime, dominated, load

ISOLATED = profiler.ProfileSettings(model="tiny", warmup=1, iters=5, contention=False, served=False)
RUNTIMES = ("inductor", "openvino", "onnxruntime")


def test_the_chosen_runtime_dominates_only_beyond_the_noise():
    figures = {"inductor": (100.0, 0.0), "openvino": (90.0, 0.0), "onnxruntime": (99.0, 0.0)}
    assert choose_runtime(figures) == "openvino"
    assert dominated(figures) == {"inductor", "onnxruntime"}
    assert dominated({"inductor": (100.0, 0.0), "openvino": (99.0, 0.0)}) == set()  # within RUNTIME_MARGIN: a tie
    assert dominated({"inductor": (100.0, 15.0), "openvino": (90.0, 0.0)}) == set()  # within inductor's spread


def test_a_runtime_beaten_at_points_of_other_threads_and_batches_is_dropped():
    watch = DominanceWatch(RUNTIMES)
    slow = {"inductor": (110.0, 0.0), "openvino": (100.0, 0.0), "onnxruntime": (101.0, 0.0)}
    assert watch.point(1, 1, slow) == []
    assert watch.point(1, 2, slow) == []  # the same thread count: not yet a verdict for the others
    assert watch.point(2, 4, slow) == ["inductor"]
    assert watch.active == ("openvino", "onnxruntime")
    assert watch.dropped["inductor"].startswith("dominated at ⟨1, 1⟩ 110.0 ms against openvino's 100.0")
    assert watch.point(1, 4, {"openvino": (100.0, 0.0), "onnxruntime": (100.5, 0.0)}) == []  # ties keep both


def test_a_runtime_within_the_choosing_margin_is_never_dropped():
    watch = DominanceWatch(RUNTIMES)
    close = {"inductor": (101.5, 0.0), "openvino": (100.0, 0.0), "onnxruntime": (104.5, 0.0)}  # 1.5 % and 4.5 % behind
    assert dominated(close) == {"onnxruntime"}
    assert watch.point(1, 1, close) == [] and watch.point(2, 2, close) == ["onnxruntime"]
    assert watch.active == ("inductor", "openvino")


def test_the_grid_is_measured_diagonal_first():
    assert diagonal_first([1, 2], [1, 2, 4, 8]) == [(1, 1), (2, 2), (2, 1), (1, 2), (2, 4), (1, 4), (2, 8), (1, 8)]
    points = diagonal_first(list(range(1, 17)), [1, 2, 4, 8, 16, 32])
    assert points[:3] == [(1, 1), (2, 2), (3, 4)] and len(set(points)) == 96


def test_a_tie_breaks_the_streak_and_a_win_keeps_a_runtime_for_good():
    watch = DominanceWatch(RUNTIMES, drop_after=2)
    slow = {"inductor": (110.0, 0.0), "openvino": (100.0, 0.0), "onnxruntime": (101.0, 0.0)}
    level = {"inductor": (100.5, 0.0), "openvino": (100.0, 0.0), "onnxruntime": (101.0, 0.0)}
    assert watch.point(1, 1, slow) == [] and watch.point(2, 2, level) == [] and watch.point(1, 4, slow) == []
    win = {"inductor": (80.0, 0.0), "openvino": (100.0, 0.0), "onnxruntime": (101.0, 0.0)}
    watch = DominanceWatch(RUNTIMES)
    assert watch.point(1, 1, win) == []
    assert [watch.point(t, b, slow) for t, b in ((2, 2), (1, 4), (2, 8))] == [[], [], []]  # won once: kept
    assert "onnxruntime" not in watch.dropped  # beaten by openvino by 1 %: within the margin


def fake_rows(latency_of):
    def fake_measure(settings, t, b, topology):
        ms = latency_of(settings.runtime, t, b)
        return {"threads": t, "batch": b, "latency_ms": ms, "isolated_ms": ms, "copies": 1, "p50_ms": ms,
                "p99_ms": ms, "std_ms": 0.0, "iterations": 3, "mad_ms": 0.0, "runtime": settings.runtime}
    return fake_measure


def slow_inductor(runtime: str, t: int, b: int) -> float:
    return 10.0 * b / t * (1.2 if runtime == "inductor" else 1.0 if runtime == "openvino" else 1.01)


@pytest.fixture
def measured(monkeypatch):
    calls = []
    fake = fake_rows(slow_inductor)

    def measure(settings, t, b, topology):
        calls.append((settings.runtime, t, b))
        return fake(settings, t, b, topology)

    monkeypatch.setattr(profiler, "measure", measure)
    monkeypatch.setattr(profiler, "check_runtimes", lambda settings, runtimes, say: {r: None for r in runtimes})
    return calls


@pytest.mark.parametrize("adaptive", [False, True], ids=["grid", "adaptive"])
def test_the_profiler_drops_a_dominated_runtime_and_records_why(tmp_path, measured, adaptive):
    out, said = tmp_path / "p.csv", []
    run = profiler.run_adaptive if adaptive else profiler.run
    run(ISOLATED, [1, 2], [1, 2, 4, 8], out, topology=Topology.virtual(2), progress=False, runtimes=RUNTIMES,
        say=said.append, every_runtime=False)
    inductor = [c for c in measured if c[0] == "inductor"]
    assert len(inductor) == DROP_AFTER
    assert {c[1:] for c in measured if c[0] == "openvino"} == {c[1:] for c in measured if c[0] == "onnxruntime"}
    profile = load(out)
    assert profile.metadata["dominated"].startswith("inductor: dominated at ⟨1, 1⟩")
    assert set(profile.runtimes.values()) == {"openvino"}
    assert any(line.startswith("runtime inductor measured no further") for line in said)


def test_every_runtime_measures_them_all(tmp_path, measured):
    profiler.run(ISOLATED, [1, 2], [1, 2], tmp_path / "p.csv", topology=Topology.virtual(2), progress=False,
                 runtimes=RUNTIMES, say=lambda _: None)
    assert len(measured) == 12


def test_a_resumed_grid_judges_the_points_already_in_the_file(tmp_path, measured):
    out = tmp_path / "p.csv"
    quiet = dict(topology=Topology.virtual(2), progress=False, runtimes=RUNTIMES, say=lambda _: None)
    profiler.run(ISOLATED, [1, 2], [1], out, **quiet)  # every runtime at ⟨1, 1⟩
    profiler.run(ISOLATED, [2], [2], out, **quiet)  # ... and ⟨2, 2⟩
    measured.clear()
    profiler.run(dataclasses.replace(ISOLATED), [1, 2], [1, 2], out, every_runtime=False, **quiet)
    assert [c for c in measured if c[0] == "inductor"] == []  # dominated at both points in the file
    assert load(out).metadata["dominated"].startswith("inductor: ")


def test_dominance_is_judged_against_the_fastest_not_the_runtime_a_tie_keeps():
    """ResNet-50 at ⟨1, 1⟩ on 2 cores (served ms, spreads): inductor keeps the point on a tie with
    OpenVINO, but torch-compile is 8.6 % behind OpenVINO, which is what says it will not be chosen
    (ONNX Runtime too, 4.4 % behind)."""
    figures = {"inductor": (40.86, 1.56), "openvino": (39.40, 0.91), "onnxruntime": (41.13, 1.0),
               "torch-compile": (42.77, 1.2)}
    assert choose_runtime(figures) == "inductor"
    assert dominated(figures) == {"onnxruntime", "torch-compile"}  # inductor: within its spread of OpenVINO
