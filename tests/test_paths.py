"""The path around a served point (packrat/serving/paths.py, issue 70): the profile's `path_ms`
line read and written, added to the served figures by instance kind so that a plan weighs each
kind's hop, the figure taken from a pool's batches, and one real measurement through a pool."""

from __future__ import annotations

import itertools

import pytest

from packrat.errors import ProfileError
from packrat.machine.topology import Topology, detect
from packrat.profiling import profiler
from packrat.profiling.profiles import ProfileWriter, load, parse_paths, path_at, path_text
from packrat.serving import paths
from packrat.serving.pool.stages import STAGES, StageTimes

META = {"model": "tiny", "mode": "compile", "latency": "isolated", "cores": "2", "payload": "raw"}


def profile_with(tmp_path, rows, path_line: str | None = None):
    """A profile of `rows` (threads, batch, runtime, model ms, served ms), with a `path_ms` note."""
    path = tmp_path / "p.csv"
    with ProfileWriter(path, META) as writer:
        for t, b, runtime, model, served in rows:
            writer.write({"threads": t, "batch": b, "latency_ms": model, "isolated_ms": model, "runtime": runtime,
                          "served_ms": served, "served_isolated_ms": served})
        if path_line is not None:
            writer.note("path_ms", path_line)
    return load(path)


# ---- the line ---------------------------------------------------------------------------------

def test_the_line_round_trips_and_a_kind_named_again_takes_the_later_figures():
    found = {"process": {1: 0.4, 8: 0.6}, "thread": {1: 0.25}}
    assert parse_paths(path_text(found)) == found
    assert parse_paths("process 1:0.4 8:0.6; thread 1:0.2; process 1:0.5") == {"process": {1: 0.5},
                                                                                "thread": {1: 0.2}}
    assert parse_paths("") == {}


@pytest.mark.parametrize("text", ["gpu 1:0.3", "process", "process 1=0.3", "process 0:0.3", "process 1:-1",
                                  "process one:0.3", "thread 1:nan"])
def test_a_malformed_line_is_refused(text):
    with pytest.raises(ValueError):
        parse_paths(text)


def test_between_batches_the_path_runs_straight_and_beyond_them_along_the_nearest_two():
    found = {"process": {1: 0.3, 8: 1.0, 16: 1.2}}
    assert path_at(found, "process", 1) == pytest.approx(0.3)
    assert path_at(found, "process", 4) == pytest.approx(0.3 + 0.7 * 3 / 7)
    assert path_at(found, "process", 12) == pytest.approx(1.1)
    assert path_at(found, "process", 32) == pytest.approx(1.6)  # along 8..16
    assert path_at({"thread": {2: 0.5}}, "thread", 64) == 0.5  # one batch measured: the same at every batch
    assert path_at({"thread": {1: 1.0, 2: 0.2}}, "thread", 8) == 0.0  # a falling line stops at 0
    assert path_at(found, "thread", 4) == 0.0  # a kind not measured: nothing added


# ---- the profile ------------------------------------------------------------------------------

def test_the_served_figures_take_their_kinds_path_and_the_model_figures_do_not(tmp_path):
    rows = [(2, 1, "onnxruntime", 4.0, 4.2), (2, 4, "onnxruntime", 12.0, 12.5),
            (2, 1, "onnxruntime-thread", 4.1, 4.3), (1, 1, "openvino", 6.0, 6.4)]
    bare = profile_with(tmp_path, rows)
    profile = profile_with(tmp_path / "with", rows, "process 1:0.5 4:0.8; thread 1:0.2 4:0.3")
    added = {key: profile.points()[key] - ms for key, ms in bare.points().items()}
    assert added == pytest.approx({(2, 1, "onnxruntime"): 0.5, (2, 4, "onnxruntime"): 0.8,
                                   (2, 1, "onnxruntime-thread"): 0.2, (1, 1, "openvino"): 0.5})
    assert profile.model_points() == bare.model_points()  # what the pool's model stage is compared with
    assert profile.isolated[2, 4] == pytest.approx(12.5 + 0.8)
    assert "the path around it measured through a pool" in profile.describe()
    assert "path" not in bare.describe()


def test_a_process_instance_faster_by_less_than_its_longer_path_gives_way_to_the_thread_one(tmp_path):
    rows = [(2, 1, "onnxruntime", 4.0, 3.0), (2, 1, "onnxruntime-thread", 4.0, 4.25)]  # beyond the margin
    assert profile_with(tmp_path / "a", rows).runtimes[2, 1] == "onnxruntime"
    with_path = profile_with(tmp_path / "b", rows, "process 1:1.6; thread 1:0.2")
    assert with_path.runtimes[2, 1] == "onnxruntime-thread"
    assert with_path.latency[2, 1] == pytest.approx(4.45)


def test_a_profile_with_a_malformed_line_names_it(tmp_path):
    with pytest.raises(ProfileError, match="path_ms"):
        profile_with(tmp_path, [(1, 1, "onnxruntime", 1.0, 1.1)], "process 1:x")


def test_a_corrected_point_keeps_its_path(tmp_path):
    profile = profile_with(tmp_path, [(2, 1, "onnxruntime", 4.0, 4.2)], "process 1:0.5")
    corrected = profile.corrected({(2, 1, "onnxruntime"): 5.0})  # the model stage served a ms slower
    assert corrected.points()[2, 1, "onnxruntime"] == pytest.approx(4.2 + 0.5 + 1.0)


# ---- what is probed ---------------------------------------------------------------------------

def test_each_kind_is_probed_with_a_runtime_that_loads_fast_on_its_most_threads(tmp_path):
    profile = profile_with(tmp_path, [(1, 1, "inductor", 5.0, 5.5), (2, 1, "openvino", 3.0, 3.2),
                                      (1, 4, "openvino", 9.0, 9.5), (1, 1, "onnxruntime-thread", 4.0, 4.1)])
    assert paths.probes(profile) == {"process": ("openvino", 2), "thread": ("onnxruntime-thread", 1)}
    assert paths.unprobed(profile) == []
    alone = profile_with(tmp_path / "i", [(1, 1, "inductor", 5.0, 5.5)])
    assert paths.probes(alone) == {} and paths.unprobed(alone) == ["process"]


class StagedPool:
    """A pool whose batches take `wall_ms` each on the clock, `inside_ms` of it in the served
    figure's stages."""

    def __init__(self, clock, walls_ms, insides_ms):
        self.clock, self.walls, self.insides = clock, iter(walls_ms), iter(insides_ms)
        self.times = StageTimes()

    def infer(self, requests):
        from packrat.serving.pool.api import Answer

        wall, inside = next(self.walls), next(self.insides)
        self.clock.now += wall / 1e3
        gaps = [0.0] * len(STAGES)
        gaps[STAGES.index("model")] = inside / 1e3
        gaps[STAGES.index("reply")] = (wall - inside) / 1e3
        stamps = list(itertools.accumulate([100.0, *gaps]))
        self.times.add(stamps, len(requests))
        return [Answer(200, b"{}")] * len(requests)

    def stage_sums(self, stages):
        return self.times.sums(stages)


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def test_the_path_is_the_median_of_each_batchs_time_less_its_served_stages_per_size():
    clock = Clock()
    # two warm-up batches per size (slow, left out), then the sizes 1 and 4 in turns
    walls = [50.0] * 4 + [5.0, 9.0, 5.5, 9.5, 9.0, 9.2, 5.2, 9.4, 5.1, 30.0]
    insides = [1.0] * 4 + [4.6, 8.0, 5.0, 8.6, 4.4, 8.4, 4.8, 8.6, 4.8, 8.0]
    pool = StagedPool(clock, walls, insides)
    found = paths.timed_paths(pool, object(), [1, 4], warmup=2, sub_batches=5, clock=clock)
    assert found == pytest.approx({1: 0.4, 4: 0.9})
    assert pool.stage_sums(("model",))[-10:] == pytest.approx(insides[4:])


def test_slow_batches_end_the_rounds_at_the_budget_but_never_before_the_fewest():
    clock = Clock()
    pool = StagedPool(clock, [1000.0] * 40, [999.0] * 40)  # a second a batch
    found = paths.timed_paths(pool, object(), [1, 8], warmup=1, sub_batches=20, clock=clock, budget_s=3.0)
    assert found == pytest.approx({1: 1.0, 8: 1.0})
    assert pool.times.sub_batches == 2 + 2 * paths.MIN_SUB_BATCHES


def test_a_refused_request_fails_the_probe():
    from packrat.serving.pool.api import Answer

    class Refusing:
        def infer(self, requests):
            return [Answer.error(503, "no instance")] * len(requests)

    with pytest.raises(RuntimeError, match="503"):
        paths.answered(Refusing(), [object()])


# ---- measured through a real pool ---------------------------------------------------------------

def test_the_profile_of_a_model_notes_each_kinds_path_measured_through_a_pool(tmp_path):
    """The tiny model profiled on one core under both ONNX Runtime kinds: its `path_ms` line holds a
    figure per kind and batch, which its served figures then include."""
    cores = detect().cores[:1]
    settings = profiler.ProfileSettings(model="tiny", warmup=1, iters=3, payload="raw")
    out = tmp_path / "tiny.csv"
    said = []
    profiler.search_profile(settings, [1], [1, 2], out, topology=Topology((tuple(cores),)), progress=False,
                            runtimes=("onnxruntime", "onnxruntime-thread"), say=said.append, full_grid=True,
                            path_probe=paths.measure_paths)
    profile = load(out)
    found = parse_paths(profile.metadata["path_ms"])
    assert set(found) == {"process", "thread"} and all(set(f) == {1, 2} for f in found.values())
    assert all(ms > 0 for figures in found.values() for ms in figures.values())
    assert any(line.startswith("path around process instances (onnxruntime, 1 threads)") for line in said)
    raw_served = float(next(r for r in profile.rows if r["runtime"] == "onnxruntime" and r["batch"] == "2")["served_ms"])
    assert profile.points()[1, 2, "onnxruntime"] == pytest.approx(raw_served + found["process"][2], abs=1e-3)
