"""Runtimes measured no further where dominated (packrat/profiling/dominance.py), and the profiler
dropping them in a grid and in an adaptive run, with fake measurements."""

from __future__ import annotations

import dataclasses

import pytest

from packrat.machine.topology import Topology
from packrat.profiling import profiler
from packrat.profiling.dominance import DROP_AFTER, DominanceWatch, corners, diagonal_first
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
    watch = DominanceWatch(RUNTIMES, 2, 4)
    slow = {"inductor": (110.0, 0.0), "openvino": (100.0, 0.0), "onnxruntime": (101.0, 0.0)}
    assert watch.point(1, 1, slow) == []
    assert watch.point(1, 2, slow) == []  # the same thread count: not yet a verdict for the others
    assert watch.point(2, 4, slow) == ["inductor"]
    assert watch.active == ("openvino", "onnxruntime")
    assert watch.dropped["inductor"].startswith("dominated at ⟨1, 1⟩ 110.0 ms against openvino's 100.0")
    assert watch.point(1, 4, {"openvino": (100.0, 0.0), "onnxruntime": (100.5, 0.0)}) == []  # ties keep both


def test_a_runtime_within_the_choosing_margin_is_never_dropped():
    watch = DominanceWatch(RUNTIMES, 2, 4)
    close = {"inductor": (101.5, 0.0), "openvino": (100.0, 0.0), "onnxruntime": (104.5, 0.0)}  # 1.5 % and 4.5 % behind
    assert dominated(close) == {"onnxruntime"}
    assert watch.point(1, 1, close) == [] and watch.point(2, 2, close) == ["onnxruntime"]
    assert watch.active == ("inductor", "openvino")


def test_the_grid_is_measured_diagonal_first():
    assert diagonal_first([1, 2], [1, 2, 4, 8]) == [(1, 1), (2, 8), (1, 2), (2, 4), (2, 2), (1, 4), (2, 1), (1, 8)]
    points = diagonal_first(list(range(1, 17)), [1, 2, 4, 8, 16, 32])
    assert points[:4] == [(1, 1), (16, 32), (4, 2), (7, 4)] and len(set(points)) == 96
    assert diagonal_first([2], [1, 4]) == [(2, 1), (2, 4)] and diagonal_first([2], [1]) == [(2, 1)]


def test_a_tie_breaks_the_streak_and_a_win_keeps_a_runtime_for_good():
    watch = DominanceWatch(RUNTIMES, 2, 4, drop_after=2)
    slow = {"inductor": (110.0, 0.0), "openvino": (100.0, 0.0), "onnxruntime": (101.0, 0.0)}
    level = {"inductor": (100.5, 0.0), "openvino": (100.0, 0.0), "onnxruntime": (101.0, 0.0)}
    assert watch.point(1, 1, slow) == [] and watch.point(2, 2, level) == [] and watch.point(1, 4, slow) == []
    win = {"inductor": (80.0, 0.0), "openvino": (100.0, 0.0), "onnxruntime": (101.0, 0.0)}
    watch = DominanceWatch(RUNTIMES, 2, 4)
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
    inductor = [c[1:] for c in measured if c[0] == "inductor"]
    verdict = diagonal_first([1, 2], [1, 2, 4, 8])[:DROP_AFTER]  # the opposite corners: ⟨1, 1⟩ and ⟨2, 8⟩
    assert inductor == verdict + [c for c in corners([1, 2], [1, 2, 4, 8]) if c not in verdict]
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
    assert [c for c in measured if c[0] == "inductor"] == []  # dominated at the points in the file; its corners there
    assert load(out).metadata["dominated"].startswith("inductor: ")


def test_dominance_is_judged_against_the_fastest_not_the_runtime_a_tie_keeps():
    """ResNet-50 at ⟨1, 1⟩ on 2 cores (served ms, spreads): inductor keeps the point on a tie with
    OpenVINO, but torch-compile is 8.6 % behind OpenVINO, which is what says it will not be chosen
    (ONNX Runtime too, 4.4 % behind)."""
    figures = {"inductor": (40.86, 1.56), "openvino": (39.40, 0.91), "onnxruntime": (41.13, 1.0),
               "torch-compile": (42.77, 1.2)}
    assert choose_runtime(figures) == "inductor"
    assert dominated(figures) == {"onnxruntime", "torch-compile"}  # inductor: within its spread of OpenVINO


THREADS_16, BATCHES_16 = [1, 2, 4, 8, 16], [1, 2, 4, 8, 16, 32]


def test_a_verdict_needs_points_in_the_grids_large_half_of_threads_and_of_batches():
    slow = {"inductor": (110.0, 0.0), "openvino": (100.0, 0.0)}
    watch = DominanceWatch(("inductor", "openvino"), 16, 32)
    assert [watch.point(t, b, slow) for t, b in ((1, 1), (2, 2), (4, 4), (8, 8))] == [[], [], [], []]
    assert watch.point(16, 16, slow) == ["inductor"]  # 8 threads and batch 16 reached: half of 16 and of 32
    assert corners(THREADS_16, BATCHES_16) == [(16, 1), (16, 32), (8, 16)]
    assert corners([1, 2], [1, 2, 4, 8]) == [(2, 1), (2, 8), (1, 4)]
    assert corners([2], [1]) == [(2, 1)]


def scales_better(runtime: str, t: int, b: int) -> float:
    """openvino 20 % slower than onnxruntime on 1-2 threads, level on 4-8, 20 % faster on 16;
    inductor 20 % slower everywhere but at ⟨16, 1⟩, where it is 30 % faster."""
    base = 10.0 * b / t
    if runtime == "openvino":
        return base * (1.2 if t <= 2 else 1.0 if t <= 8 else 0.8)
    if runtime == "inductor":
        return base * (0.7 if (t, b) == (16, 1) else 1.2)
    return base


def write_table(path, latency_of, runtimes=("inductor", "openvino", "onnxruntime")):
    """A recorded isolated profile of every runtime at every point of the 16-core grid."""
    rows = [fake_rows(latency_of)(dataclasses.replace(ISOLATED, runtime=r), t, b, None)
            for t in THREADS_16 for b in BATCHES_16 for r in runtimes]
    head = "# model: tiny\n# mode: compile\n# latency: isolated\n"
    columns = list(rows[0])
    path.write_text(head + ",".join(columns) + "\n" + "".join(",".join(str(row[c]) for c in columns) + "\n"
                                                             for row in rows))
    return path


@pytest.mark.parametrize("replayed", [False, True], ids=["measured", "replayed"])
def test_on_16_cores_a_runtime_that_wins_at_16_threads_is_kept_and_one_dropped_is_taken_back_at_a_corner(
        tmp_path, monkeypatch, measured, replayed):
    """The rule as it was (two points, any threads and batches, the small ones first) dropped
    openvino after ⟨1, 1⟩ and ⟨2, 2⟩ here and never saw it win at 16 threads."""
    out, said = tmp_path / "p.csv", []
    common = dict(topology=Topology.virtual(16), progress=False, runtimes=RUNTIMES, say=said.append,
                  every_runtime=False)
    if replayed:  # the rule applied to a recorded table, as a live profile applies it
        table = write_table(tmp_path / "recorded.csv", scales_better)
        profiler.run_adaptive(ISOLATED, THREADS_16, BATCHES_16, out, replay=table, **common)
    else:
        monkeypatch.setattr(profiler, "measure", fake_rows(scales_better))
        profiler.run(ISOLATED, THREADS_16, BATCHES_16, out, **common)
    profile = load(out)
    assert "openvino: dominated" not in profile.metadata.get("dominated", "")
    assert profile.runtimes[16, 2] == "openvino" and profile.runtimes[16, 32] == "openvino"
    assert profile.metadata["dominated"].startswith("inductor: dominated at ⟨1, 1⟩")
    assert profile.runtimes[16, 1] == "inductor"  # timed again at the corner, and fastest there
    assert "⟨16, 1⟩ 0.4 ms against openvino's 0.5" in profile.metadata["re-timed"]
    assert "(taken at ⟨16, 1⟩, where the choosing rule picks it)" in profile.metadata["re-timed"]
    assert any(line.startswith("runtime inductor timed again at the grid's corners") for line in said)


def test_a_runtime_slower_everywhere_is_still_dropped_on_16_cores_and_its_corners_say_so(tmp_path, measured):
    out = tmp_path / "p.csv"
    profiler.run(ISOLATED, THREADS_16, BATCHES_16, out, topology=Topology.virtual(16), progress=False,
                 runtimes=RUNTIMES, say=lambda _: None, every_runtime=False)
    inductor = [c[1:] for c in measured if c[0] == "inductor"]
    assert len(inductor) < len(THREADS_16) * len(BATCHES_16) / 2  # dropped early enough to save most points
    assert set(corners(THREADS_16, BATCHES_16)) <= set(inductor)  # and timed at every corner
    profile = load(out)
    assert profile.metadata["re-timed"].endswith("(taken at none)")
    assert "inductor" not in set(profile.runtimes.values())
