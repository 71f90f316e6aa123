"""Thread instances: ONNX Runtime sessions in threads of the pool's own process, each on its cores.
Real sessions of the tiny model (its ONNX file exported once per test session)."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from packrat.codec.batch import answer_batch
from packrat.codec.codec import Codec
from packrat.codec.config import CodecConfig
from packrat.machine.threads import task_affinities
from packrat.models import runtimes
from packrat.models.zoo import prepare, resolve
from packrat.serving.pool import child
from packrat.serving.pool.api import InstanceConfig, ModelConfig, Request
from packrat.serving.pool.instance_pool import InstancePool
from packrat.serving.pool.supervisor import Watchdog

pytestmark = [pytest.mark.integration,  # the ONNX export of the model
              pytest.mark.skipif(not runtimes.installed("onnxruntime"), reason="onnxruntime is not installed")]

CORES = sorted(os.sched_getaffinity(0))
RAW = "application/octet-stream"
THREAD = "onnxruntime-thread"
STALL_AT = 100.0  # a sample holding a value above this makes the stalling model's run go on and on


def raw(sample: torch.Tensor) -> Request:
    return Request(sample.numpy().tobytes(), RAW)


def samples(count: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(count, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def expected(inputs: torch.Tensor) -> list[dict]:
    module, _, _ = prepare(resolve("tiny"), 4, "eager")
    codec = Codec(CodecConfig.for_model(resolve("tiny")))
    return [json.loads(a.body) for a in answer_batch(module, codec, [(raw(x).body, RAW) for x in inputs])]


def same(answer, reference: dict) -> bool:
    """The same classes, and scores within float noise of eager's (ONNX Runtime's kernels differ)."""
    got = json.loads(answer.body)["predictions"]
    want = reference["predictions"]
    return answer.status == 200 and [p["class"] for p in got] == [p["class"] for p in want] and \
        all(abs(g["score"] - w["score"]) < 1e-4 for g, w in zip(got, want))


def one_instance_per_core(**settings) -> list[InstanceConfig]:
    return [InstanceConfig(1, 2, (core,), runtime=THREAD, **settings) for core in CORES[:2]]


def test_every_thread_of_a_thread_instance_runs_on_its_cores():
    configs = [InstanceConfig(len(CORES[:2]), 2, tuple(CORES[:2]), runtime=THREAD)]
    if len(CORES) >= 4:
        configs.append(InstanceConfig(2, 2, tuple(CORES[2:4]), runtime=THREAD))
    with InstancePool(ModelConfig("tiny"), configs) as pool:
        inputs = samples(4)
        answers = pool.infer([raw(x) for x in inputs])
        assert all(same(a, e) for a, e in zip(answers, expected(inputs)))
        threads = task_affinities()
        assert all(inst.kind == "thread" for inst in pool.supervisor.instances)
        for inst, config in zip(pool.supervisor.instances, configs):
            mine = {tid: threads[tid] for tid in inst.thread_ids if tid in threads}
            # its own thread, and the session's one intra-op thread per core but the first
            assert len(mine) >= config.threads
            for name, cpus in mine.values():
                assert cpus <= set(config.cores), (name, cpus, config.cores)
            own = threads[inst.worker.native_id][1]
            assert own == {config.cores[0]}  # the calling thread computes on the first core
            assert {frozenset(cpus) for _, cpus in mine.values()} >= {frozenset({core}) for core in config.cores}


@pytest.mark.skipif(len(CORES) < 2, reason="two instances on cores of their own")
def test_thread_instances_answer_like_the_model_and_bad_bodies_alone():
    inputs = samples(6)
    good = [raw(x) for x in inputs]
    bad = [Request(b"not a tensor", RAW), Request(b'{"inputs": NaN}', "application/json"), Request(b"", None)]
    with InstancePool(ModelConfig("tiny"), one_instance_per_core()) as pool:
        answers = pool.infer([good[0], *bad, *good[1:]])
        health = pool.health()
    reference = expected(inputs)
    assert all(same(a, e) for a, e in zip([answers[0], *answers[4:]], reference))
    for answer in answers[1:4]:
        assert 400 <= answer.status < 500 and "\n" not in answer.reason, answer
    assert health.sub_batches >= 2 and health.stage_ms["send"] == 0.0  # handed over, nothing pickled


def stalling_model(source: str, target: str) -> None:
    """tiny's ONNX graph with a Loop added whose trip count is huge when an input value exceeds
    STALL_AT, and zero otherwise; its result (times zero) is added to the output, so it runs."""
    model = onnx.load(source)
    graph = model.graph
    output = graph.output[0].name
    for node in graph.node:
        node.output[:] = ["plain_output" if name == output else name for name in node.output]

    def constant(name, value, dtype=np.float32):
        return numpy_helper.from_array(np.array(value, dtype=dtype), name)

    graph.initializer.extend([constant("stall_at", STALL_AT), constant("stall_scale", 1e15),
                              constant("stall_zero", 0.0), constant("stall_true", True, np.bool_)])
    scalar = lambda name, kind: helper.make_tensor_value_info(name, kind, [])  # noqa: E731
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Add", ["v_in", "one"], ["v_out"])], "stall",
                             [scalar("i", TensorProto.INT64), scalar("cond_in", TensorProto.BOOL),
                              scalar("v_in", TensorProto.FLOAT)],
                             [scalar("cond_out", TensorProto.BOOL), scalar("v_out", TensorProto.FLOAT)],
                             [constant("one", 1.0)])
    graph.node.extend([
        helper.make_node("ReduceMax", ["input"], ["stall_max"], keepdims=0),
        helper.make_node("Sub", ["stall_max", "stall_at"], ["stall_over"]),
        helper.make_node("Relu", ["stall_over"], ["stall_excess"]),
        helper.make_node("Mul", ["stall_excess", "stall_scale"], ["stall_trips"]),
        helper.make_node("Cast", ["stall_trips"], ["stall_count"], to=TensorProto.INT64),
        helper.make_node("Loop", ["stall_count", "stall_true", "stall_zero"], ["stall_v"], body=body),
        helper.make_node("Mul", ["stall_v", "stall_zero"], ["stall_nothing"]),
        helper.make_node("Add", ["plain_output", "stall_nothing"], [output]),
    ])
    onnx.checker.check_model(model)
    onnx.save(model, target)


@pytest.fixture
def shipped_stalling_model(tmp_path) -> str:
    """A folder shipping the stalling model as tiny's ONNX artefact (pools use a shipped one first)."""
    spec = resolve("tiny")
    stalling_model(str(runtimes.ensure_artefact(spec, "onnxruntime")),
                   str(runtimes.artefact_path(spec, "onnxruntime", tmp_path)))
    return str(tmp_path)


def poisoned(sample: torch.Tensor) -> Request:
    stalled = sample.clone()
    stalled[0, 0, 0] = 10 * STALL_AT
    return raw(stalled)


@pytest.mark.skipif(len(CORES) < 2, reason="two instances on cores of their own")
def test_a_run_blocked_in_the_session_is_cancelled_and_its_requests_run_again(shipped_stalling_model):
    inputs = samples(5, seed=2)
    model = ModelConfig("tiny", compile_cache=shipped_stalling_model)
    with InstancePool(model, one_instance_per_core(), watchdog=Watchdog(batch_timeout_s=1.0),
                      request_timeout_s=60) as pool:
        futures = [pool.submit(r) for r in [raw(inputs[0]), poisoned(inputs[1]), *map(raw, inputs[2:])]]
        answers = [f.result(timeout=60) for f in futures]
        health = pool.health()
        after = pool.infer([raw(x) for x in inputs[:2]])  # still serving, on thread instances
        kinds = [inst.kind for inst in pool.supervisor.instances]
    reference = expected(inputs)
    # every good request answered as the model answers it; none lost with the stalled one
    assert all(same(a, e) for a, e in zip([answers[0], *answers[2:]], [reference[0], *reference[2:]]))
    # the poisoned request was on every lost instance's batch: answered 500 after MAX_ATTEMPTS losses
    assert answers[1].status == 500 and "instances were lost" in answers[1].reason
    assert health.watchdog_kills >= 3 and health.requeued >= 2
    assert all(same(a, e) for a, e in zip(after, reference[:2]))
    assert kinds == ["thread", "thread"]  # each cancelled run returned: the same kind came back


def wait_until(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def hang_once_in_python(monkeypatch) -> threading.Event:
    """Thread instances whose run, the first time a poisoned sample reaches one, blocks in Python
    (no cancel() reaches it: the runtime's cancellation cannot end it) until the event returned is
    set; the poisoned sample runs normally after that."""
    released, hung = threading.Event(), threading.Event()
    real = child.load_runtime

    def stubborn_runtime(spec, model, config, runtime, stop_spinning=True):
        module, examples, mode = real(spec, model, config, runtime, stop_spinning)

        def run(*inputs):
            if float(inputs[0].max()) > STALL_AT and not hung.is_set():
                hung.set()
                released.wait(120)
            return module(*inputs)
        return run, examples, mode

    monkeypatch.setattr(child, "load_runtime", stubborn_runtime)  # the threads load in this process
    return released


@pytest.mark.skipif(len(CORES) < 2, reason="two instances on cores of their own")
def test_a_thread_stuck_in_python_is_fenced_off_and_its_requests_run_elsewhere(monkeypatch):
    """Its requests are re-queued and answered by the other instance, none lost; its cores are
    fenced off (nothing started on them) and the listener told, until the thread returns: then its
    cores come back and its slot is respawned, a thread instance again."""
    released = hang_once_in_python(monkeypatch)
    fences: list[frozenset] = []
    inputs = samples(3, seed=3)
    reference = expected(inputs)
    try:
        with InstancePool(ModelConfig("tiny"), one_instance_per_core(), watchdog=Watchdog(batch_timeout_s=0.5),
                          request_timeout_s=120, on_fence=fences.append) as pool:
            answers = pool.infer([poisoned(inputs[0]), raw(inputs[1]), raw(inputs[2])])
            wait_until(lambda: fences, "the stuck thread was not fenced off")
            stuck, health = pool.fenced_cores(), pool.health()
            (slot,) = [inst for inst in pool.supervisor.instances if set(inst.config.cores) & stuck]
            assert len(stuck) == 1 and fences == [stuck] and health.fenced == sorted(stuck)
            assert health.abandoned == 1 and health.ready == 1 and health.unavailable is None and not slot.ready
            again = pool.infer([raw(x) for x in inputs])  # the other instance serves meanwhile
            released.set()
            wait_until(lambda: len(fences) == 2 and pool.health().ready == 2,
                       "the returned thread's slot did not come back")
            assert fences[-1] == frozenset() and not pool.fenced_cores()
            assert [inst.kind for inst in pool.supervisor.instances] == ["thread", "thread"]
    finally:
        released.set()
    assert answers[0].status == 200 and all(same(a, e) for a, e in zip(answers[1:], reference[1:]))
    assert all(same(a, e) for a, e in zip(again, reference))


def thread_engine(tmp_path, restart, **settings):
    """An engine of thread instances of the tiny model on 2 cores: its profile plans two ⟨1 thread,
    batch 2⟩ instances, or one ⟨2 threads, batch 4⟩ with plan "fat"; a batch hangs after 0.5 s."""
    from packrat.serving.engine import Engine
    from packrat.settings import Settings

    (tmp_path / "profile.csv").write_text("# model: tiny\nthreads,batch,latency_ms,runtime\n" + "".join(
        f"{t},{b},{ms},{THREAD}\n" for t, b, ms in ((1, 1, 1.0), (1, 2, 1.0), (1, 4, 2.0), (2, 2, 1.5), (2, 4, 1.6))))
    settings = Settings(model="tiny", profiles=("profile.csv",), max_batch=4, share_node=False, reconfigure=False,
                        cores=2, batch_timeout_s=0.5, request_timeout_s=60, **settings)
    return Engine(settings, tmp_path, "tiny", max_batch=4, asynchronous=False, restart=restart)


@pytest.mark.skipif(len(CORES) < 2, reason="two instances on cores of their own")
def test_the_engine_re_plans_around_a_thread_stuck_in_python(tmp_path, monkeypatch):
    """Issue 64: a thread instance hanging in Python (not in the runtime) has its requests
    re-queued and answered, 0 lost; the next plan leaves its cores out, and takes them back once
    the thread returns. Nothing restarts: cores are left."""
    released = hang_once_in_python(monkeypatch)
    restarts: list[str] = []
    inputs = samples(4, seed=4)
    reference = expected(inputs)
    engine = thread_engine(tmp_path, restarts.append)
    try:
        assert engine.controller.plan.describe().startswith("2×⟨1 threads, batch 2")
        futures = [engine.submit(r) for r in [poisoned(inputs[0]), *map(raw, inputs[1:])]]
        answers = [f.result(60) for f in futures]
        wait_until(lambda: engine.controller.reconfigurations and not engine.controller.switching,
                   "no re-plan followed the fence")
        record, stuck = engine.controller.reconfigurations[-1], engine.pool.fenced_cores()
        assert record.error is None and "fenced off" in record.reason and len(stuck) == 1
        plan = engine.controller.plan
        assert plan.instances and not any(set(i.cores) & stuck for i in plan.instances)
        assert not any(set(config.cores) & stuck for config in engine.pool.configs)
        again = [engine.submit(raw(x)).result(60) for x in inputs]  # served on the cores left
        assert engine.pool.health().ready == len(engine.pool.configs) and not restarts
        released.set()
        wait_until(lambda: not engine.pool.fenced_cores() and len(engine.controller.reconfigurations) >= 2
                   and not engine.controller.switching, "the returned thread's cores were not planned again")
        assert engine.controller.reconfigurations[-1].error is None
        assert any(set(i.cores) & stuck for i in engine.controller.plan.instances)
    finally:
        released.set()
        engine.close()
    assert answers[0].status == 200 and all(same(a, e) for a, e in zip(answers[1:], reference[1:]))
    assert all(same(a, e) for a, e in zip(again, reference)) and not restarts


@pytest.mark.skipif(len(CORES) < 2, reason="a fat instance on 2 cores")
def test_with_no_cores_left_the_engine_refuses_with_the_reason_reports_not_ready_and_restarts(tmp_path, monkeypatch):
    """A fat thread instance stuck in Python: every request is answered 503 with the reason, the
    front ends report not ready, and the engine asks its front end to restart it, once."""
    released = hang_once_in_python(monkeypatch)
    restarts: list[str] = []
    inputs = samples(2, seed=5)
    engine = thread_engine(tmp_path, restarts.append, plan="fat")
    try:
        assert engine.controller.plan.describe().startswith("1×⟨2 threads, batch 4")
        stuck = engine.submit(poisoned(inputs[0])).result(60)
        later = engine.submit(raw(inputs[1])).result(10)
        wait_until(lambda: restarts, "the engine did not ask for a restart")
        health = engine.pool.health()
        readiness = front_ends_ready(engine)
        time.sleep(0.2)
        assert len(restarts) == 1
        released.set()
        wait_until(lambda: engine.pool.health().ready == 1, "the returned thread's slot did not come back")
        back = engine.submit(raw(inputs[1])).result(60)
    finally:
        released.set()
        engine.close()
    for answer in (stuck, later):
        assert answer.status == 503 and "no cores left" in answer.reason, answer
    assert "no cores left" in restarts[0] and health.ready == 0 and "no cores left" in health.unavailable
    assert readiness == {"kserve": False, "ray": False}
    assert back.status == 200


def front_ends_ready(engine) -> dict:
    """What the KServe model's healthy() and the Ray Serve engine's check_health say of `engine`."""
    import asyncio

    ready = {}
    try:
        from packrat.frontends.kserve_server import PackratModel
    except ImportError:
        pass
    else:
        model = PackratModel.__new__(PackratModel)
        model.serving, model.closed = engine, threading.Event()
        ready["kserve"] = asyncio.run(model.healthy())
    try:
        from packrat.frontends.ray_serve import PackratEngine
    except ImportError:
        pass
    else:
        replica = PackratEngine.__new__(PackratEngine)
        replica.engine = engine
        try:
            replica.check_health()
            ready["ray"] = replica.ready()
        except RuntimeError as exc:
            ready["ray"] = "no cores left" not in str(exc)
        finally:
            replica.engine = None  # its __del__ would close the engine
    return ready


@pytest.mark.skipif(len(CORES) < 2, reason="two instances on cores of their own")
def test_a_stuck_load_does_not_hold_up_another_instances_start(monkeypatch):
    """No start lock: an instance whose load never returns leaves the others to start, each with its own threads."""
    from packrat.codec.config import CodecConfig
    from packrat.serving.pool.thread_instance import ThreadInstance

    released = threading.Event()
    real = child.load_runtime

    def slow_on_the_second_core(spec, model, config, runtime, stop_spinning=True):
        if config.cores == (CORES[1],):
            released.wait(120)
        return real(spec, model, config, runtime, stop_spinning)

    monkeypatch.setattr(child, "load_runtime", slow_on_the_second_core)
    codec = CodecConfig.for_model(resolve("tiny"))
    first, second = one_instance_per_core()
    stuck = ThreadInstance(1, ModelConfig("tiny"), second, codec, lambda *_: None)
    try:
        time.sleep(0.5)  # its load is under way, and stays so
        started = ThreadInstance(0, ModelConfig("tiny"), first, codec, lambda *_: None)
        try:
            assert started.wait_ready(30) and started.thread_ids and not stuck.ready
            threads = task_affinities()
            assert {threads[tid][0] for tid in started.thread_ids if tid in threads} == {started.name}
        finally:
            started.close()
        released.set()
        stuck.wait_ready(60)
        assert stuck.thread_ids and not stuck.thread_ids & started.thread_ids
    finally:
        released.set()
        stuck.close()


def test_onnx_runtime_affinities_name_every_thread_but_the_caller():
    assert runtimes.ort_affinities((4, 5, 6, 7), 4) == "6;7;8"
    assert runtimes.ort_affinities((0, 1), 1) == ""
    assert runtimes.instance_kind(THREAD) == "thread" and runtimes.instance_kind("onnxruntime") == "process"
    assert runtimes.process_kind(THREAD) == "onnxruntime" and runtimes.base_runtime("openvino") == "openvino"


def test_a_cancelled_run_raises_and_the_next_runs():
    spec = resolve("tiny")
    runner = runtimes.OrtRunner(runtimes.ensure_artefact(spec, "onnxruntime"), spec, 2, 1, cores=(CORES[0],))
    inputs = spec.example_inputs(2)
    runner.cancel()
    with pytest.raises(runtimes.RunCancelled):
        runner(*inputs)
    started = time.monotonic()
    assert runner(*inputs).shape == (2, 10) and time.monotonic() - started < 5
