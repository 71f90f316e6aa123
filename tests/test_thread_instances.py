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


@pytest.mark.skipif(len(CORES) < 2, reason="two instances on cores of their own")
def test_a_thread_that_does_not_return_gives_its_cores_to_a_process(monkeypatch):
    """A run that ignores cancellation (here a module without cancel(), blocked in Python): the
    thread is abandoned and a process instance of the runtime takes its cores; no request is lost."""
    released = threading.Event()
    real = child.load_runtime

    def stubborn_runtime(spec, model, config, runtime, stop_spinning=True):
        module, examples, mode = real(spec, model, config, runtime, stop_spinning)

        def run(*inputs):
            if float(inputs[0].max()) > STALL_AT:
                released.wait(120)
            return module(*inputs)
        return run, examples, mode

    monkeypatch.setattr(child, "load_runtime", stubborn_runtime)  # the threads load in this process
    inputs = samples(3, seed=3)
    try:
        with InstancePool(ModelConfig("tiny"), one_instance_per_core(), watchdog=Watchdog(batch_timeout_s=0.5),
                          request_timeout_s=120) as pool:
            answers = pool.infer([poisoned(inputs[0]), raw(inputs[1]), raw(inputs[2])])
            kinds = sorted(inst.kind for inst in pool.supervisor.instances)
            abandoned = pool.supervisor.abandoned
    finally:
        released.set()
    reference = expected(inputs)
    assert all(same(a, e) for a, e in zip(answers[1:], reference[1:]))
    assert answers[0].status == 200  # the process instance runs the plain session: nothing stalls there
    assert abandoned >= 1 and "process" in kinds


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
