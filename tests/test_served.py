"""Plans corrected from what is served (packrat/serving/served.py, correcting.py, the engine)."""

from __future__ import annotations

import json
import os
import time

import pytest

from packrat.planning.planner import Instance, Plan
from packrat.profiling.profiles import Profile
from packrat.serving import served
from packrat.serving.correcting import PlanCorrector, corrections_file
from packrat.serving.served import Correction, ServedLatencies, corrections_from, disagrees, served_key
from packrat.settings import SERVED_DIR_ENV

NOW = 1_700_000_000.0


def profile_of(points: dict) -> Profile:
    profile = Profile(latency={})
    for (t, b, runtime), latency in points.items():
        profile.add(runtime, t, b, latency, latency)
    return profile


def test_only_whole_planned_batches_outside_settling_are_samples():
    latencies = ServedLatencies(window=5)
    key = (1, 2, "inductor")
    latencies.add(key, 10.0, 1, now=1.0)  # a sub-batch of 1: a smaller batch than the point
    latencies.settle(until=5.0)
    latencies.add(key, 99.0, 2, now=4.0)  # while settling
    for ms in (10.0, 11.0, 12.0, 13.0, 14.0, 15.0):
        latencies.add(key, ms, 2, now=6.0)
    assert latencies.figures(min_samples=6) == {}
    (median, error, samples), = latencies.figures(min_samples=5).values()
    assert (median, samples) == (13.0, 5) and error > 0  # the last 5


def test_rounds_are_kept_beside_the_model_stage_and_forgotten_with_it():
    latencies = ServedLatencies(window=5)
    key = (2, 1, "onnxruntime")
    for ms in (2.0, 2.1, 2.2):
        latencies.add(key, ms, 1, now=1.0, round_ms=ms + 0.5)
    latencies.add(key, 2.3, 1, now=1.0)  # a sub-batch without its round: the model stage alone
    assert latencies.figures(min_samples=4)[key][0] == pytest.approx(2.15)
    assert latencies.figures(min_samples=4, rounds=True) == {}
    assert latencies.figures(min_samples=3, rounds=True)[key][0] == pytest.approx(2.6)
    latencies.settle(until=2.0)
    assert latencies.figures(min_samples=1) == {} == latencies.figures(min_samples=1, rounds=True)


def test_the_key_is_the_runtime_the_instance_runs():
    assert served_key(2, 4, "compile") == (2, 4, "inductor") == served_key(2, 4, "eager")
    assert served_key(2, 4, "openvino") == (2, 4, "openvino")


def test_a_figure_is_corrected_beyond_the_noise_only():
    assert not disagrees(100.0, 104.0, 0.1)  # within the margin
    assert not disagrees(100.0, 120.0, 12.0)  # beyond the margin, within twice its error
    assert disagrees(100.0, 120.0, 1.0) and disagrees(100.0, 80.0, 1.0)  # either way


def test_corrections_replace_join_expire_and_leave_unknown_points_alone():
    profile_ms = {(1, 2, "inductor"): 10.0, (2, 4, "inductor"): 20.0}
    old = Correction(2, 4, "inductor", 20.0, 30.0, 50, NOW - served.MAX_AGE_S - 1)
    got = corrections_from({(1, 2, "inductor"): (13.0, 0.1, 30), (9, 9, "inductor"): (5.0, 0.1, 30)},
                           profile_ms, {old.key: old}, NOW)
    assert list(got) == [(1, 2, "inductor")] and got[1, 2, "inductor"].served_ms == 13.0
    # a later figure is judged against the correction, not the profile, with a wider margin: the
    # machine drifts, and a plan must not flap on it
    again = corrections_from({(1, 2, "inductor"): (14.5, 0.1, 30)}, profile_ms, got, NOW + 60)
    assert again == got
    moved = corrections_from({(1, 2, "inductor"): (15.5, 0.1, 30)}, profile_ms, got, NOW + 60)
    assert moved[1, 2, "inductor"].served_ms == 15.5


def test_a_switch_needs_a_margin_and_a_cool_down():
    policy = served.SwitchPolicy(clock=lambda: 0.0)
    assert policy.decide("a", 100.0, "b", 90.0) == "switch"
    assert policy.decide("a", 100.0, "b", 96.0) == "keep"  # within the margin
    assert policy.decide("a", 100.0, "a", 50.0) == "keep"  # the same plan


def plan_of(*instances: tuple[int, int, float], threads: int = 2) -> Plan:
    chosen = tuple(Instance(t, b, ms) for t, b, ms in instances)
    return Plan(threads, sum(b for _, b, _ in instances), chosen, max(ms for *_, ms in instances), None)


def test_an_optimistic_split_is_corrected_and_the_faster_plan_expected(tmp_path):
    profile = profile_of({(1, 2, "inductor"): 7.0, (2, 4, "inductor"): 12.0})
    corrector = PlanCorrector(profile, tmp_path / "served.json", wall=lambda: NOW)
    split = plan_of((1, 2, 7.0), (1, 2, 7.0))
    assert corrector.expected_ms(split) == 7.0
    made = corrector.update({(1, 2, "inductor"): (15.0, 0.2, 40)})
    assert [(c.key, c.profile_ms, c.served_ms) for c in made] == [((1, 2, "inductor"), 7.0, 15.0)]
    assert corrector.expected_ms(split) == 15.0 and corrector.profile.latency[1, 2] == 15.0
    assert corrector.update({(1, 2, "inductor"): (15.1, 0.2, 40)}) == []  # the same figure: nothing new
    status = corrector.status(split, {(1, 2, "inductor"): (15.1, 0.2, 40)})
    assert status["instances"][0] == {"threads": 1, "batch": 2, "runtime": "inductor", "predicted_ms": 7.0,
                                      "planned_ms": 15.0, "served_ms": 15.1, "samples": 40}
    # kept on file: a restart plans with it
    restarted = PlanCorrector(profile, tmp_path / "served.json", wall=lambda: NOW + 10)
    assert restarted.profile.latency[1, 2] == 15.0
    assert json.loads((tmp_path / "served.json").read_text())["corrections"][0]["served_ms"] == 15.0


def test_a_model_sharing_the_node_reads_the_kept_corrections_but_keeps_none_of_its_own(tmp_path):
    profile = profile_of({(1, 2, "inductor"): 7.0, (2, 4, "inductor"): 12.0})
    path = tmp_path / "served.json"
    PlanCorrector(profile, path, wall=lambda: NOW).update({(1, 2, "inductor"): (15.0, 0.2, 40)})
    member = PlanCorrector(profile, path, wall=lambda: NOW + 10, keep=False)
    assert member.profile.latency[1, 2] == 15.0  # made with the cores to itself: planned with
    assert member.update({(2, 4, "inductor"): (300.0, 1.0, 40)})  # served beside other models ...
    assert member.profile.latency[2, 4] == 300.0  # ... planned with while it serves ...
    kept = json.loads(path.read_text())["corrections"]
    assert [(c["threads"], c["batch"]) for c in kept] == [(1, 2)]  # ... but not kept for a restart


def test_a_correction_can_change_a_points_runtime():
    """openvino served twice its figure; inductor, measured in the same profile run, is inferred at
    half that ratio (10 × √2) and now leads; once served as profiled, its figure stands."""
    profile = profile_of({(1, 1, "inductor"): 10.0, (1, 1, "openvino"): 8.0})
    assert profile.runtimes[1, 1] == "openvino"
    corrector = PlanCorrector(profile, None, wall=lambda: NOW)
    corrector.update({(1, 1, "openvino"): (16.0, 0.1, 30)})
    assert corrector.profile.runtimes[1, 1] == "inductor"
    assert corrector.profile.latency[1, 1] == pytest.approx(10.0 * 2 ** 0.5)
    corrector.update({(1, 1, "openvino"): (16.0, 0.1, 30), (1, 1, "inductor"): (10.1, 0.1, 30)})
    assert corrector.profile.latency[1, 1] == 10.0 and corrector.inferred == {}


def test_a_correction_carries_halfway_to_the_points_that_share_its_cause():
    profile_ms = {(1, 4, "openvino"): 64.2, (1, 4, "onnxruntime"): 66.6, (1, 2, "openvino"): 33.0,
                  (1, 8, "openvino"): 130.0, (1, 16, "openvino"): 260.0, (2, 4, "openvino"): 40.0}
    corrections = {(1, 4, "openvino"): Correction(1, 4, "openvino", 64.2, 213.0, 27, NOW)}
    found = served.inferred_from(corrections, profile_ms)
    ratio = (213.0 / 64.2) ** 0.5  # half the log-ratio: never as far as what was served
    assert found[1, 4, "onnxruntime"].inferred_ms == pytest.approx(66.6 * ratio)
    assert found[1, 4, "onnxruntime"].rule == "runtimes of a served point"
    assert found[1, 2, "openvino"].inferred_ms == pytest.approx(33.0 * ratio)
    assert found[1, 8, "openvino"].rule == "batches next to a served point"
    assert (1, 16, "openvino") not in found and (2, 4, "openvino") not in found  # no shared cause: as profiled
    assert (1, 2, "openvino") not in served.inferred_from(corrections, profile_ms, {(1, 2, "openvino")})
    both = {**corrections, (1, 16, "openvino"): Correction(1, 16, "openvino", 260.0, 130.0, 30, NOW)}
    between = served.inferred_from(both, profile_ms)[1, 8, "openvino"]  # both neighbours: their mean
    assert between.inferred_ms == pytest.approx(130.0 * ((213.0 / 64.2) * 0.5) ** 0.25)


def test_status_lists_the_inferred_figures():
    from packrat.cli.status import served_lines

    corrector = PlanCorrector(profile_of({(1, 1, "inductor"): 10.0, (1, 2, "inductor"): 20.0}), None,
                              wall=lambda: NOW)
    corrector.update({(1, 1, "inductor"): (40.0, 0.1, 30)})
    (inferred,) = corrector.status(type("Plan", (), {"instances": []})(), {})["inferred"]
    assert (inferred["batch"], inferred["inferred_ms"]) == (2, pytest.approx(40.0))
    (line,) = served_lines({"instances": [], "corrections": [], "inferred": [inferred]})
    assert line == ("inferred ⟨1 threads, batch 2⟩: profile 20.00 ms → 40.00 ms, not served (batches next to "
                    "a served point: ⟨1, 1, inductor⟩)")


def test_a_damaged_file_costs_the_corrections_only(tmp_path, caplog):
    path = tmp_path / "served.json"
    path.write_text("{not json")
    corrector = PlanCorrector(profile_of({(1, 1, "inductor"): 1.0}), path)
    assert corrector.corrections == {} and "ignoring the served latencies" in caplog.text


def test_the_file_is_named_by_the_model_and_the_profiles_bytes(tmp_path):
    profile = tmp_path / "p.csv"
    profile.write_text("threads,batch,latency_ms\n1,1,2\n")
    first = corrections_file("my/model", profile)
    assert first.name.startswith("my_model-") and first.suffix == ".json"
    profile.write_text("threads,batch,latency_ms\n1,1,3\n")  # taken again: its corrections start afresh
    assert corrections_file("my/model", profile) != first
    assert str(first).startswith(os.environ[SERVED_DIR_ENV.name])


@pytest.mark.integration
def test_a_plan_whose_split_figures_were_too_optimistic_is_corrected_and_the_better_one_on_paper_tried(tmp_path):
    """tiny's profile says two 1-thread instances of batch 2 take 0.002 ms and the fat instance
    0.004 ms: the split is planned, served far slower, corrected. The fat plan is then better on
    paper, on the profile's figure alone: it is tried, not switched to, and the trial's verdict
    comes from what both served (kept, reverted, or given up early: on a loaded machine the fat
    instance's first rounds served 1.4 ms against the split's 1.0). No request fails, both served figures are kept, and a restart
    plans on them (here on the profile's last unserved point, 0.01 ms: served slower, it would be
    corrected and tried in turn)."""
    from packrat.serving.engine import Engine
    from packrat.serving.pool.api import Request
    from packrat.settings import Settings

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    (tmp_path / "profile.csv").write_text("# model: tiny\n# mode: eager\nthreads,batch,latency_ms\n"
                                          "1,2,0.002\n2,4,0.004\n1,4,0.01\n2,2,0.01\n")
    settings = Settings(model="tiny", profiles=("profile.csv",), max_batch=4, share_node=False, reconfigure=False)
    body = bytes(3 * 32 * 32 * 4)
    engine = Engine(settings, tmp_path, "tiny", max_batch=4, asynchronous=False)
    try:
        assert engine.controller.plan.describe() == "2×⟨1 threads, batch 2⟩"
        engine.reconfigure = True  # follows what is served, not the load (which stays at 4)
        answers = []
        deadline = time.monotonic() + 120
        while not engine.tuner.trials.history and time.monotonic() < deadline:
            futures = [engine.submit(Request(body, "application/octet-stream")) for _ in range(4)]
            answers += [f.result(30).status for f in futures]
            if len(answers) % 40 == 0:
                engine.check_served()
        engine.controller.wait_idle(60)
        (trial,) = engine.tuner.trials.history
        first = engine.controller.reconfigurations[0]
        assert first.error is None and first.reason.startswith("trial: served latencies")
        assert trial.plan == "1×⟨2 threads, batch 4⟩" and trial.outcome.startswith(("kept", "reverted: served", "given up: served"))
        assert set(answers) == {200} and all(r.failed_requests == 0 for r in engine.controller.reconfigurations)
        corrected = {(c["threads"], c["batch"]): c["profile_ms"] for c in engine.status()["served"]["corrections"]}
        assert corrected == {(1, 2): 0.002, (2, 4): 0.004}  # the trial's figures are planned with
    finally:
        engine.close()
    restarted = Engine(settings, tmp_path, "tiny", max_batch=4, asynchronous=False)
    try:  # it plans on them: neither served plan is taken on the profile's figure again
        assert {(c.threads, c.batch) for c in restarted.corrector.corrections.values()} == {(1, 2), (2, 4)}
        assert restarted.controller.plan.describe() not in ("2×⟨1 threads, batch 2⟩", "1×⟨2 threads, batch 4⟩")
    finally:
        restarted.close()


def test_status_prints_predicted_planned_served_and_each_correction():
    from packrat.cli.status import served_lines

    lines = served_lines({"instances": [
        {"threads": 1, "batch": 2, "runtime": "inductor", "predicted_ms": 7.0, "planned_ms": 15.0, "served_ms": 15.1,
         "samples": 40},
        {"threads": 1, "batch": 2, "runtime": "openvino", "predicted_ms": 6.0, "planned_ms": 6.0, "samples": 0}],
        "corrections": [Correction(1, 2, "inductor", 7.0, 15.0, 40, NOW).to_json()]})
    assert lines[0] == "served ⟨1 threads, batch 2⟩: predicted 7.00 ms, planned with 15.00 ms, served 15.10 ms (40 batches)"
    assert lines[1] == "served ⟨1 threads, batch 2, openvino⟩: predicted 6.00 ms, served not yet"  # null dropped
    assert lines[2].startswith("correction ") and lines[2].endswith(
        ": ⟨1 threads, batch 2⟩ profile 7.00 ms → served 15.00 ms (40 batches)")
    assert served_lines(None) == []


def test_a_switch_held_back_by_the_cool_down_happens_when_it_ends():
    """The second correction of issue 42's run landed 10 s into the cool-down: the better plan it
    found is held back, then switched to at the first look after the cool-down, with no new
    correction; a plan that later figures make no better is dropped."""
    now = [0.0]
    policy = served.SwitchPolicy(cooldown_s=60.0, clock=lambda: now[0])
    assert policy.decide("fat", 213.0, "one core", 66.6) == "switch"
    policy.switched()
    now[0] = 10.0
    assert policy.decide("one core", 213.0, "both cores", 120.0) == "hold"
    assert policy.status() == {"plan": "both cores", "current_ms": 213.0, "proposed_ms": 120.0,
                               "cooldown_left_s": 50.0}
    now[0] = 59.9
    assert policy.decide("one core", 213.0, "both cores", 120.0) == "hold"
    now[0] = 60.0
    assert policy.decide("one core", 213.0, "both cores", 120.0) == "switch"
    policy.switched()
    assert policy.status() is None
    now[0] = 70.0
    assert policy.decide("both cores", 120.0, "other", 60.0) == "hold"
    assert policy.decide("both cores", 120.0, "other", 118.0) == "keep" and policy.status() is None


def test_status_says_which_plan_the_cool_down_holds_back():
    from packrat.cli.status import served_lines

    lines = served_lines({"instances": [], "corrections": [], "held_back": {
        "plan": "1×⟨2 threads, batch 4⟩", "current_ms": 213.0, "proposed_ms": 120.0, "cooldown_left_s": 49.6}})
    assert lines == ["held back by the cool-down (50 s left): 1×⟨2 threads, batch 4⟩, expected 120.00 ms "
                     "against 213.00 ms as served"]


def test_a_skewed_profile_makes_one_point_faster_in_every_figure(tmp_path):
    from packrat.bench.correction import skewed_profile

    source = tmp_path / "p.csv"
    source.write_text("# model: tiny\nthreads,batch,latency_ms,isolated_ms,runtime,served_ms,served_isolated_ms\n"
                      "1,4,100,,inductor,120,\n1,4,90,,openvino,110,\n1,2,50,,inductor,60,\n2,4,60,60,inductor,70,70\n")
    skewed_profile(source, tmp_path / "s.csv", 0.5, 2, point=(1, 4))
    rows = (tmp_path / "s.csv").read_text().splitlines()
    assert rows[0] == "# model: tiny"
    assert rows[2:] == ["1,4,50.0000,,inductor,60.0000,", "1,4,45.0000,,openvino,55.0000,", "1,2,50,,inductor,60,",
                        "2,4,60,60,inductor,70,70"]
    skewed_profile(source, tmp_path / "all.csv", 0.5, 2)  # every split point
    assert (tmp_path / "all.csv").read_text().splitlines()[4] == "1,2,25.0000,,inductor,30.0000,"
