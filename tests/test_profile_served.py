"""A profile of what is served (issue 41): each point's served figure (decode + model + encode of a
sub-batch, as a pool instance answers it) beside the model-only one; files with and without it,
resuming them, planning and choosing runtimes on it, corrections from the pool's model stage, and
one real served point of the tiny model."""

from __future__ import annotations

import dataclasses
import json

import pytest

from packrat.errors import ProfileError
from packrat.machine.topology import Topology, detect
from packrat.planning.planner import Planner
from packrat.profiling import measuring, profiler, profiles
from packrat.profiling.profiles import COLUMNS, NO_SERVED_COLUMNS, Profile, ProfileWriter, load

LOADED = {"model": "tiny", "mode": "compile", "latency": "loaded", "cores": "2", "payload": "jpeg"}


def served_row(t: int, b: int, model: float, served: float, *, runtime: str = "inductor", copies: int = 1,
               isolated: float | None = None, served_isolated: float | None = None, mad: float = 0.0,
               served_mad: float = 0.0) -> dict:
    alone = copies == 1
    return {"threads": t, "batch": b, "latency_ms": model, "copies": copies, "runtime": runtime, "mad_ms": mad,
            "isolated_ms": model if alone else isolated, "served_ms": served, "served_mad_ms": served_mad,
            "served_isolated_ms": served if alone else served_isolated}


def write_profile(path, rows, metadata=LOADED):
    with ProfileWriter(path, metadata) as writer:
        for row in rows:
            writer.write(row)
    return load(path)


# ---- the file ---------------------------------------------------------------------------------

def test_served_columns_round_trip_and_the_profile_plans_on_them(tmp_path):
    path = tmp_path / "p.csv"
    profile = write_profile(path, [served_row(1, 2, 4.0, 9.0, copies=2, isolated=3.5, served_isolated=8.0,
                                              served_mad=0.3),
                                   served_row(2, 2, 3.0, 7.0)])
    assert path.read_text().splitlines()[len(LOADED)] == ",".join(COLUMNS)
    assert COLUMNS[-3:] == ("served_ms", "served_isolated_ms", "served_mad_ms")
    assert profile.basis == "served" and profile.has_served and profile.payload == "jpeg"
    assert profile.latency == {(1, 2): 9.0, (2, 2): 7.0} and profile.isolated == {(1, 2): 8.0, (2, 2): 7.0}
    assert profile.items() == [(1, 2, 9.0), (2, 2, 7.0)] and profile.items("isolated") == [(1, 2, 8.0), (2, 2, 7.0)]
    assert profile.by_runtime["inductor"] == {(1, 2): (4.0, 3.5), (2, 2): (3.0, 3.0)}  # the model alone, kept
    assert profile.served_spread["inductor"][1, 2] == 0.3
    assert profile.points() == {(1, 2, "inductor"): 9.0, (2, 2, "inductor"): 7.0}
    assert profile.model_points() == {(1, 2, "inductor"): 4.0, (2, 2, "inductor"): 3.0}
    assert "served figures" in profile.describe() and "jpeg" in profile.describe()
    model = profile.on("model")
    assert model.basis == "model" and model.latency == {(1, 2): 4.0, (2, 2): 3.0}
    assert model.isolated == {(1, 2): 3.5, (2, 2): 3.0} and "model-only" in model.describe()
    assert model.on("served").latency == profile.latency
    with pytest.raises(ValueError, match="basis must be one of served, model"):
        profile.on("decode")


def test_a_served_figure_under_a_noisy_model_figure_is_kept(tmp_path):
    """A model-only mean that a noisy machine inflated past the served one does not replace it (the
    served figure is the planned one as measured; only a correction moves it)."""
    profile = write_profile(tmp_path / "p.csv", [served_row(2, 1, 94.6, 18.1)])
    assert profile.latency == {(2, 1): 18.1} and profile.corrected({}).latency == {(2, 1): 18.1}
    assert profile.corrected({(2, 1, "inductor"): 90.0}).latency == {(2, 1): 90.0}  # at least its model stage


def test_a_loaded_point_measured_loaded_only_lacks_its_lone_served_figure(tmp_path):
    profile = write_profile(tmp_path / "p.csv", [served_row(1, 1, 4.0, 9.0, copies=2), served_row(2, 1, 3.0, 7.0)])
    assert profile.basis == "served" and profile.figures == ("loaded",)
    assert profile.isolated == {(2, 1): 7.0}


@pytest.mark.parametrize("header", [NO_SERVED_COLUMNS, profiles.NO_MAD_COLUMNS, profiles.NO_RUNTIME_COLUMNS])
def test_a_profile_from_before_served_figures_loads_and_resumes_in_its_layout(tmp_path, header):
    path = tmp_path / "old.csv"
    values = {"threads": "1", "batch": "1", "latency_ms": "10", "isolated_ms": "10", "copies": "1"}
    path.write_text("# model: tiny\n# latency: loaded\n" + ",".join(header) + "\n"
                    + ",".join(values.get(column, "") for column in header) + "\n")
    profile = load(path)
    assert profile.basis == "model" and not profile.has_served and profile.payload is None
    assert profile.latency == {(1, 1): 10.0} and "model-only" in profile.describe()
    with ProfileWriter(path, {"model": "tiny", "latency": "loaded"}) as writer:
        assert not writer.served
        writer.write(served_row(2, 1, 5.0, 9.0))  # its served figure has no column here: dropped
    assert path.read_text().splitlines()[2] == ",".join(header)
    resumed = load(path)
    assert resumed.basis == "model" and resumed.latency == {(1, 1): 10.0, (2, 1): 5.0}
    with pytest.raises(ProfileError, match="no served figures for every point"):
        resumed.on("served")


def test_a_profile_with_served_figures_for_some_points_only_plans_on_the_model(tmp_path):
    path = tmp_path / "p.csv"
    with ProfileWriter(path, LOADED) as writer:
        writer.write(served_row(1, 1, 4.0, 9.0))
        writer.write({**served_row(2, 1, 3.0, 7.0), "served_ms": None, "served_isolated_ms": None})
    profile = load(path)
    assert profile.basis == "model" and profile.latency == {(1, 1): 4.0, (2, 1): 3.0} and profile.payload is None


@pytest.mark.parametrize("row,message", [
    ("1,1,2,2,1,,,,,inductor,,abc,,", "row 3: served_ms is not a number: 'abc'"),
    ("1,1,2,2,1,,,,,inductor,,0,,", "row 3: served_ms must be > 0"),
    ("1,1,2,2,1,,,,,inductor,,3,3,x", "row 3: served_mad_ms is not a number"),
    ("1,1,2,2,1,,,,,inductor,,3,,", "row 3: served_isolated_ms is not a number"),  # alone: it was measured
])
def test_bad_served_figures_name_the_row(tmp_path, row, message):
    path = tmp_path / "p.csv"
    path.write_text("# latency: loaded\n" + ",".join(COLUMNS) + "\n" + row + "\n")
    with pytest.raises(ProfileError, match=message):
        load(path)


# ---- planning and runtimes on the served figure ------------------------------------------------

def test_the_planner_plans_on_the_served_figures_and_on_the_model_alone_when_asked(tmp_path):
    """On the model alone two 1-thread instances win; decoding (as served) makes the split lose to one
    2-thread instance, whose decoders share the batch."""
    profile = write_profile(tmp_path / "p.csv", [served_row(1, 1, 4.0, 12.0, copies=2, served_isolated=11.0),
                                                 served_row(2, 2, 5.0, 10.0)])
    served = Planner(profile.items(), 2, 2, profile.runtimes).plan(2, 2)
    model = profile.on("model")
    alone = Planner(model.items(), 2, 2, model.runtimes).plan(2, 2)
    assert [(i.threads, i.batch) for i in served.instances] == [(2, 2)] and served.expected_latency_ms == 10.0
    assert [(i.threads, i.batch) for i in alone.instances] == [(1, 1), (1, 1)] and alone.expected_latency_ms == 4.0


def test_the_runtime_is_chosen_on_the_figure_planned_with(tmp_path):
    """openvino runs the model faster, but serves the batch no faster beyond the noise (say, torch
    decoding beside it on one thread): the served profile keeps inductor; on the model alone, openvino."""
    profile = write_profile(tmp_path / "p.csv", [
        served_row(1, 1, 10.0, 20.0, mad=0.1, served_mad=0.5),
        served_row(1, 1, 8.0, 19.8, runtime="openvino", mad=0.1, served_mad=0.5),
        served_row(1, 2, 20.0, 40.0, mad=0.1, served_mad=0.5),
        served_row(1, 2, 19.9, 30.0, runtime="onnxruntime", mad=0.1, served_mad=0.5)])
    assert profile.runtimes == {(1, 1): "inductor", (1, 2): "onnxruntime"}
    assert profile.latency == {(1, 1): 20.0, (1, 2): 30.0}
    assert profile.fallbacks()[1, 1] == ("openvino", "inductor")  # fastest served first
    model = profile.on("model")
    assert model.runtimes == {(1, 1): "openvino", (1, 2): "inductor"} and model.latency == {(1, 1): 8.0, (1, 2): 20.0}
    kept = profile.only(["inductor"])
    assert kept.basis == "served" and kept.latency == {(1, 1): 20.0, (1, 2): 40.0}
    assert profile.only(["onnxruntime"]).items() == [(1, 2, 30.0)]


def test_a_served_correction_of_the_model_stage_moves_the_served_figure():
    """The pool times its instances' model stage: a correction compares it with the model-only figure
    and moves the served figure by as much (decoding and encoding as measured)."""
    from packrat.planning.planner import Instance, Plan
    from packrat.serving.correcting import PlanCorrector

    base = Profile(latency={})
    base.add("inductor", 1, 2, 7.0, 7.0, 0.0, (12.0, 12.0, 0.0))
    base.add("inductor", 2, 4, 12.0, 12.0, 0.0, (20.0, 20.0, 0.0))
    base = base.on("served")
    corrector = PlanCorrector(base, None, wall=lambda: 1e9)
    split = Plan(2, 4, (Instance(1, 2, 12.0), Instance(1, 2, 12.0)), 12.0, None)
    assert corrector.update({(1, 2, "inductor"): (7.1, 0.1, 40)}) == []  # the model as profiled: nothing to do
    made = corrector.update({(1, 2, "inductor"): (10.0, 0.1, 40)})
    assert [(c.profile_ms, c.served_ms) for c in made] == [(7.0, 10.0)]
    assert corrector.profile.latency[1, 2] == 15.0 and corrector.profile.basis == "served"
    assert corrector.profile.model_points()[1, 2, "inductor"] == 10.0
    assert corrector.expected_ms(split) == 15.0
    status = corrector.status(split, {(1, 2, "inductor"): (10.0, 0.1, 40)})
    assert status["instances"][0]["predicted_ms"] == 7.0 and status["instances"][0]["planned_ms"] == 15.0


def test_plan_cli_plans_on_the_model_alone_when_asked(tmp_path, capsys):
    from packrat.cli.main import main

    path = tmp_path / "p.csv"
    write_profile(path, [served_row(1, 1, 4.0, 12.0, copies=2, served_isolated=11.0), served_row(2, 2, 5.0, 10.0)])
    assert main(["plan", "--profile", str(path), "--threads", "2", "--batch", "2", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["basis"] == "served" and body["expected_latency_ms"] == 10.0
    assert main(["plan", "--profile", str(path), "--threads", "2", "--batch", "2", "--json", "--model-only"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["basis"] == "model" and body["expected_latency_ms"] == 4.0


# ---- the profiler ------------------------------------------------------------------------------

FAST = profiler.ProfileSettings(model="tiny", warmup=1, iters=3, contention=False)


def fake_point(calls: list):
    def measure_point(settings, t, b, cores):
        calls.append((t, b, settings.served, settings.payload))
        stats = {"latency_ms": 2.0 * b / t, "p50_ms": 1.0, "p99_ms": 2.0, "std_ms": 0.1, "iterations": 3,
                 "mad_ms": 0.1}
        if settings.served:
            stats.update(served_ms=5.0 * b / t, served_mad_ms=0.2)
        return stats
    return measure_point


def workers_of(measure_point):
    """measuring.Workers whose every batch is `measure_point(settings, threads, batch, cores)`, alone."""
    class Workers:
        load_s = measure_s = 0.0

        def __init__(self, settings, threads, topology):
            self.settings, self.threads, self.cores = settings, threads, topology.cores_for(threads)

        def measure(self, batch):
            stats = measure_point(self.settings, self.threads, batch, self.cores)
            return {"threads": self.threads, "batch": batch, "copies": 1, "runtime": self.settings.runtime, **stats,
                    "isolated_ms": stats["latency_ms"], "served_isolated_ms": stats.get("served_ms")}

        def close(self):
            pass
    return Workers


def test_the_profiler_writes_served_figures_and_the_payload(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(profiler, "Workers", workers_of(fake_point(calls)))
    monkeypatch.setattr(profiler, "_build", lambda *args: [])
    profile = profiler.run(FAST, [1], [1, 2], tmp_path / "p.csv", topology=Topology(((0,),)), progress=False)
    assert calls == [(1, 1, True, None), (1, 2, True, None)]
    assert profile.metadata["payload"] == "jpeg" and profile.basis == "served"
    assert profile.latency == {(1, 1): 5.0, (1, 2): 10.0} and profile.isolated == profile.latency
    assert profile.on("model").latency == {(1, 1): 2.0, (1, 2): 4.0}
    assert profile.rows[0]["served_mad_ms"] == "0.2000"


def test_resuming_keeps_to_what_the_file_holds(tmp_path, monkeypatch):
    calls, said = [], []
    monkeypatch.setattr(profiler, "Workers", workers_of(fake_point(calls)))
    monkeypatch.setattr(profiler, "_build", lambda *args: [])
    topology = Topology(((0,),))
    out = tmp_path / "p.csv"
    profiler.run(FAST, [1], [1], out, topology=topology, progress=False)
    with pytest.raises(ProfileError, match=r"holds a profile with payload 'jpeg', not model-only ones; choose "
                                           r"another --out \(or resume it with --payload jpeg\)"):
        profiler.run(dataclasses.replace(FAST, served=False), [1], [2], out, topology=topology, progress=False)
    with pytest.raises(ProfileError, match="payload 'jpeg', not payload 'raw'"):
        profiler.run(dataclasses.replace(FAST, payload="raw"), [1], [2], out, topology=topology, progress=False)
    profiler.run(dataclasses.replace(FAST, payload="jpeg"), [1], [2], out, topology=topology, progress=False)
    assert load(out).basis == "served" and len(load(out).latency) == 2

    older = tmp_path / "old.csv"
    older.write_text("# model: tiny\n# mode: compile\n" + ",".join(NO_SERVED_COLUMNS) + "\n1,1,3,3,1,,,,,inductor,\n")
    calls.clear()
    profiler.run(FAST, [1], [1], older, topology=topology, progress=False, say=said.append)
    assert calls == [] and said == []  # nothing to measure: nothing to say
    profile = profiler.run(FAST, [1], [1, 2], older, topology=topology, progress=False, say=said.append)
    assert calls == [(1, 2, False, None)]  # measured model-only, as the file holds
    assert said == [f"{older} holds model-only figures: its missing points are measured model-only too (choose "
                    f"another --out for served figures)"]
    assert profile.basis == "model" and "payload" not in profile.metadata
    with pytest.raises(ProfileError, match="holds a profile with model-only figures, not payload 'raw'"):
        profiler.run(dataclasses.replace(FAST, payload="raw"), [1], [4], older, topology=topology, progress=False)


def test_the_point_command_asks_for_the_payload():
    cmd, _ = measuring._command(FAST, 1, 2, [0])
    assert cmd[cmd.index("--payload") + 1] == "natural"
    cmd, _ = measuring._command(dataclasses.replace(FAST, payload="raw"), 1, 2, [0])
    assert cmd[cmd.index("--payload") + 1] == "raw"
    assert "--payload" not in measuring._command(dataclasses.replace(FAST, served=False), 1, 2, [0])[0]


def test_the_payload_is_the_models_natural_one_as_served():
    from packrat.models.zoo import resolve

    assert profiler.payload_kind(FAST) == "jpeg"
    # a zoo token model has no tokenizer: its instances read token ids, not text
    assert resolve("tiny_text").tokenizer is None
    assert profiler.payload_kind(dataclasses.replace(FAST, model="tiny_text")) == "raw"
    with pytest.raises(ValueError, match="a text payload needs a tokenizer: tiny_text comes without one"):
        profiler.payload_kind(dataclasses.replace(FAST, model="tiny_text", payload="text"))
    with pytest.raises(ValueError, match="a jpeg payload needs an image model"):
        profiler.payload_kind(dataclasses.replace(FAST, model="tiny_text", payload="jpeg"))
    with pytest.raises(ValueError, match="jpeg, text or raw"):
        profiler.payload_kind(dataclasses.replace(FAST, payload="json"))


def test_the_search_runs_on_the_served_figure(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(profiler, "Workers", workers_of(fake_point(calls)))
    monkeypatch.setattr(profiler, "_build", lambda *args: [])
    done = profiler.search_profile(FAST, [1], [1, 2, 4], tmp_path / "p.csv", topology=Topology(((0,),)),
                                   progress=False)
    assert done.profile.basis == "served" and all(served for _, _, served, _ in calls)
    assert measuring.planned_ms({"latency_ms": 2.0, "served_ms": 5.0}) == 5.0
    assert measuring.planned_ms({"latency_ms": 2.0, "served_ms": None}) == 2.0


def test_profile_cli_flags(tmp_path):
    from packrat.cli.main import build_parser
    from packrat.cli.profile import profile_settings

    parser = build_parser()
    settings = profile_settings(parser.parse_args(["profile", "--model", "tiny"]))
    assert settings.served and settings.payload is None
    settings = profile_settings(parser.parse_args(["profile", "--model", "tiny", "--payload", "raw"]))
    assert settings.served and settings.payload == "raw"
    assert not profile_settings(parser.parse_args(["profile", "--model", "tiny", "--model-only"])).served
    with pytest.raises(SystemExit):
        parser.parse_args(["profile", "--model-only", "--payload", "raw"])


# ---- the served batch, in this process -------------------------------------------------------

@pytest.mark.parametrize("kind,in_rows", [("raw", {0, 1, 2}), ("jpeg", set())])
def test_a_served_batch_lays_bodies_out_as_the_pools_parent_and_answers_them(kind, in_rows):
    from packrat.codec.batch import Decoders
    from packrat.codec.codec import Codec
    from packrat.codec.config import CodecConfig
    from packrat.codec.payloads import payload_of
    from packrat.models.zoo import resolve
    from packrat.profiling.point import ServedBatch

    spec = resolve("tiny")
    codec = Codec(CodecConfig.for_model(spec))
    body, content_type = payload_of(spec, kind)
    batch = ServedBatch(codec, Decoders(1), body, content_type, 3)
    batch.run(spec.build())  # each run writes the bodies first, as the pool's parent does
    assert batch.in_rows == in_rows and all(bytes(b) == body for b, _, _ in batch.bodies)
    ms, stages = batch.run(spec.build())
    assert ms > 0 and len(stages) == 3 and sum(stages) <= ms + 1.0


def test_a_served_batch_that_is_not_answered_200_fails_loudly():
    from packrat.codec.batch import Decoders
    from packrat.codec.codec import Codec
    from packrat.codec.config import CodecConfig
    from packrat.codec.payloads import TEXT
    from packrat.models.zoo import resolve
    from packrat.profiling.point import ServedBatch, ServedFailed

    spec = resolve("tiny_text")  # no tokenizer: text is refused with 400
    batch = ServedBatch(Codec(CodecConfig.for_model(spec)), Decoders(1), TEXT.encode(), "text/plain", 2)
    with pytest.raises(ServedFailed, match="2 of 2 requests failed; request 0 answered 400: .*without a tokenizer"):
        batch.run(spec.build())


# ---- real points --------------------------------------------------------------------------------

@pytest.mark.integration
def test_one_real_served_point_of_tiny_times_the_model_and_the_served_batch(tmp_path):
    """Eager (nothing compiled), 1 thread, batch 2 of JPEG photos: decoding dominates the tiny model."""
    core = detect().cores[-1]
    settings = dataclasses.replace(FAST, graph_mode="eager")
    stats = measuring.measure_point(settings, 1, 2, [core])
    assert stats["served_iterations"] == 3 and stats["iterations"] == 3
    assert stats["served_ms"] > stats["latency_ms"] > 0 and stats["served_decode_ms"] > 0
    assert stats["torch_threads"] == 1 and stats["cores"] == [core]


@pytest.mark.integration
def test_a_loaded_served_point_runs_its_served_rounds_in_lockstep(tmp_path):
    cores = detect().cores
    if len(cores) < 2:
        pytest.skip("needs two cores")
    topology = Topology((tuple(cores[:2]),))
    settings = dataclasses.replace(FAST, graph_mode="eager", contention=True, payload="raw")
    row = measuring.measure(settings, 1, 1, topology)
    assert row["copies"] == 2 and row["served_iterations"] == 3
    assert row["served_ms"] > 0 and row["served_isolated_ms"] is None


def test_two_kinds_or_runtimes_within_each_others_noise_never_swap_on_a_coin_toss():
    """The planner prefers one kind or runtime over another only by more than their points' spread
    (issue 63): within it, the first of RUNTIMES, and of one runtime's kinds the thread kind (whose
    served figure holds its whole path; the process kind's hop is not in it)."""
    from packrat.profiling.profiles import choose_runtime

    tied = {"onnxruntime": (6.64, 0.28), "onnxruntime-thread": (6.65, 0.31), "openvino": (7.93, 0.54)}
    assert choose_runtime(tied) == "onnxruntime-thread"
    assert choose_runtime({**tied, "onnxruntime": (6.0, 0.28)}) == "onnxruntime"  # beyond the noise
    # a noisy figure must beat the chosen one by its own spread too
    assert choose_runtime({"openvino": (10.0, 0.1), "onnxruntime": (9.0, 1.5)}) == "openvino"
    # each step keeps the first runtime nothing beats beyond the noise
    chain = {"inductor": (10.0, 0.1), "openvino": (7.0, 0.1), "onnxruntime-thread": (6.95, 0.1), "onnxruntime": (5.0, 0.1)}
    assert choose_runtime(chain) == "onnxruntime"
    assert choose_runtime({k: v for k, v in chain.items() if k != "onnxruntime"}) == "openvino"
