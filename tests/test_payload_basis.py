"""The figures a plan is made on follow the bodies served (packrat/serving/payloads.py, the tuner,
the pool's counts): served figures of the profile's payload, or the model's own for raw tensors."""

from __future__ import annotations

import pytest
from test_trials import profile_of, tuner_for

from packrat.profiling.profiles import Profile
from packrat.serving.payloads import MIN_BODIES, BodyCounts, PayloadWatch, basis_for


def test_raw_bodies_plan_on_the_model_figures_unless_the_profile_served_raw_ones():
    assert basis_for("jpeg", 1.0) == "model" and basis_for("jpeg", 0.0) == "served"
    assert basis_for("text", 0.9) == "model"
    assert basis_for("raw", 1.0) == "served" and basis_for("raw", 0.0) == "served"  # nothing times a decode
    assert basis_for(None, 0.0) == "model"  # a model-only profile


def test_the_basis_moves_on_a_clear_majority_of_enough_bodies():
    watch = PayloadWatch("jpeg", "served")
    assert watch.look(MIN_BODIES - 1, 0) is None  # too few to judge: kept for the next look
    assert watch.look(1, 0) == "model" and watch.basis == "model"
    assert watch.judged == (MIN_BODIES, 0) and watch.pending == (0, 0)
    assert watch.look(10, 10) is None  # half and half: the basis stays
    assert watch.look(0, MIN_BODIES) == "served"
    assert watch.look(0, MIN_BODIES) is None  # already there
    status = watch.status()
    assert (status["planned_on"], status["profile_payload"]) == ("served", "jpeg")
    assert status["bodies_last_judged"] == {"raw": 0, "decoded": MIN_BODIES}


def test_a_raw_profile_or_a_model_only_one_never_moves():
    assert PayloadWatch("raw", "served").look(0, 100) is None
    assert PayloadWatch(None, "model").look(100, 0) is None


def test_the_counts_restart_at_each_take():
    counts = BodyCounts()
    counts.raw += 3
    counts.decoded += 1
    assert counts.take() == (3, 1) and counts.take() == (0, 0)


def served_profile(points: dict, payload: str = "jpeg") -> Profile:
    """A profile of model-only figures and served ones (model + decode) from `payload` bodies."""
    profile = Profile(latency={}, metadata={"payload": payload})
    for (t, b, runtime), (model_ms, served_ms) in points.items():
        profile.add(runtime, t, b, model_ms, model_ms, 0.0, (served_ms, served_ms, 0.0))
    return profile.on("served")


# SqueezeNet-like at B = 4 on 2 cores: decoding JPEGs dominates the split, not the fat instance's run
POINTS = {(2, 4, "inductor"): (12.0, 30.0), (1, 2, "inductor"): (14.0, 20.0), (1, 4, "inductor"): (20.0, 40.0),
          (2, 2, "inductor"): (7.0, 16.0)}


def test_raw_tensor_clients_move_the_plan_to_the_model_figures_and_back():
    """Planned on JPEG figures, the split (20 ms served) beats fat (30); clients that send raw tensors
    pay the model alone, where fat (12) beats the split (14): the tuner switches once the bodies
    show it, and back when JPEGs return."""
    now = [0.0]
    tuner, controller, pool = tuner_for(served_profile(POINTS), {}, now)
    assert controller.plan.describe() == "2×⟨1 threads, batch 2⟩"
    pool.bodies = [MIN_BODIES, 0]
    tuner.look()
    assert tuner.corrector.profile.basis == "model"
    assert controller.plan.describe() == "1×⟨2 threads, batch 4⟩"
    assert controller.requests[-1].startswith("model figures: ")
    tuner.look()  # nothing new: no switch
    assert len(controller.requests) == 1
    now[0] += 120  # past the cool-down
    pool.bodies = [0, MIN_BODIES]
    tuner.look()
    assert tuner.corrector.profile.basis == "served" and controller.plan.describe() == "2×⟨1 threads, batch 2⟩"
    assert tuner.status()["payload"]["planned_on"] == "served"


@pytest.mark.parametrize("payload", ["raw", None])
def test_no_switch_where_the_profile_has_one_kind_of_figure(payload):
    now = [0.0]
    profile = served_profile(POINTS, "raw") if payload else profile_of({k: v[0] for k, v in POINTS.items()})
    tuner, controller, pool = tuner_for(profile, {}, now)
    plan = controller.plan.describe()
    pool.bodies = [0, 5 * MIN_BODIES]
    tuner.look()
    assert controller.plan.describe() == plan and not controller.requests


def test_status_says_which_figures_the_plan_is_made_on():
    from packrat.cli.status import served_lines

    payload = PayloadWatch("jpeg", "model", judged=(30, 2)).status()
    lines = served_lines({"instances": [], "corrections": [], "payload": payload})
    assert lines == ["planned on the model's own figures (raw tensors skip the decode); last bodies judged: "
                     "30 raw, 2 decoded"]
    assert served_lines({"instances": [], "corrections": [], "payload": PayloadWatch(None, "model").status()}) == []


def test_a_benchmark_sending_raw_tensors_plans_as_the_engine_would():
    from packrat.serving.payloads import planned_for

    assert planned_for(served_profile(POINTS), raw_share=1.0).basis == "model"
    assert planned_for(served_profile(POINTS), raw_share=0.0).basis == "served"
    assert planned_for(served_profile(POINTS, "raw"), raw_share=1.0).basis == "served"


def test_decoded_bodies_move_thread_instances_to_processes_and_raw_ones_back():
    """Thread instances (ONNX Runtime in the server's process) are planned where faster; once most
    bodies are decoded (JSON, images) the plan moves to process instances at once, though slower on
    paper: a decode in a thread holds the interpreter lock the front end needs. Raw tensors again:
    back to the threads, by the figures."""
    now = [0.0]
    points = {(1, 2, "onnxruntime-thread"): 9.0, (2, 4, "onnxruntime-thread"): 12.0,
              (1, 2, "onnxruntime"): 10.0, (2, 4, "onnxruntime"): 13.0}
    tuner, controller, pool = tuner_for(profile_of(points), {}, now)
    assert {i.runtime for i in controller.plan.instances} == {"onnxruntime-thread"}
    pool.bodies = [0, MIN_BODIES]
    tuner.look()
    assert {i.runtime for i in controller.plan.instances} == {"onnxruntime"}
    assert "interpreter lock" in controller.requests[-1]
    now[0] += 120  # past the cool-down
    pool.bodies = [MIN_BODIES, 0]
    tuner.look()
    assert {i.runtime for i in controller.plan.instances} == {"onnxruntime-thread"}


def test_a_profile_without_process_points_keeps_its_threads():
    now = [0.0]
    tuner, controller, pool = tuner_for(profile_of({(1, 2, "onnxruntime-thread"): 9.0,
                                                    (2, 4, "onnxruntime-thread"): 12.0}), {}, now)
    pool.bodies = [0, MIN_BODIES]
    tuner.look()
    assert {i.runtime for i in controller.plan.instances} == {"onnxruntime-thread"} and not controller.requests
