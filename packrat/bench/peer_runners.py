"""The peers of packrat bench peers (peers.py runs them): each in a process of its own, pinned to the
cores, started once (harness.Worker), a runner per batch size B built there and timed in rounds."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import statistics
import time

from packrat.bench.harness import error_text, pin, pool_requests
from packrat.bench.rounds import elapsed_ms
from packrat.serving.settling import answered

PEERS = ("packrat", "packrat-later", "fat", "eager", "script", "compile", "torch-compile", "openvino-latency", "openvino-throughput",
         "onnxruntime", "onnxruntime-parallel")
TORCH_PEERS = ("eager", "script", "compile", "torch-compile")
POOL_PEERS = ("packrat", "packrat-later", "fat")
OPENVINO_PEERS = ("openvino-latency", "openvino-throughput")
ORT_PEERS = ("onnxruntime", "onnxruntime-parallel")
NEEDS = {peer: ("openvino",) for peer in OPENVINO_PEERS} | {peer: ("onnxruntime",) for peer in ORT_PEERS}


def missing_packages(peer: str, installed=lambda name: importlib.util.find_spec(name) is not None) -> str | None:
    """'not installed (pip install ...)' when a package the peer needs is missing, else None."""
    missing = [name for name in NEEDS.get(peer, ()) if not installed(name)]
    return f"not installed (pip install {' '.join(missing)})" if missing else None


def v2_output(body: bytes):
    """The first output of a KServe v2 answer, as a numpy array of its shape."""
    import numpy as np

    output = json.loads(body)["outputs"][0]
    return np.asarray(output["data"], dtype=np.float64).reshape(output["shape"])


class Runner:
    """One peer at one B: run() a batch, outputs(run's result) as numpy, close()."""
    note = ""

    def outputs(self, result):
        return result[0]

    def close(self) -> None:
        pass


class TorchRunner(Runner):
    """eager, script, compile: models.prepare in that graph mode (call under inference_mode)."""

    def __init__(self, spec, batch: int, mode: str):
        import warnings

        from packrat.models.zoo import prepare

        if mode == "torch-compile":  # the user's own: torch.compile, inductor, frozen weights, static shapes
            import torch
            import torch._inductor.config as inductor_config

            inductor_config.freezing = True
            self.module, self.inputs = torch.compile(spec.build(), dynamic=False), spec.example_inputs(batch)
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.module, self.inputs, used = prepare(spec, batch, graph_mode=mode)
        why = next((str(w.message) for w in caught if "failed" in str(w.message)), "")
        self.note = "" if used == mode else f"{mode} failed, ran {used}" + (f": {why[:200]}" if why else "")

    def run(self):
        return self.module(*self.inputs)

    def outputs(self, result):
        while isinstance(result, (tuple, list)):  # some modules return tuples or lists: their first output
            result = result[0]
        return result.detach().float().numpy()


class OpenVinoModel:
    """The zoo module's IR as packrat converts it (the first process builds it), read once, compiled per B."""

    def __init__(self, spec, threads: int):
        import openvino as ov

        from packrat.models.runtimes import ensure_artefact

        started = time.perf_counter()
        self.ov, self.spec, self.threads, self.core = ov, spec, threads, ov.Core()
        self.model = self.core.read_model(str(ensure_artefact(spec, "openvino")))
        self.convert_s = time.perf_counter() - started

    def compile(self, batch: int, hint: str):
        model = self.model.clone()
        model.reshape({i: [batch, *s.shape] for i, s in enumerate(self.spec.inputs)})  # static: the fastest
        return self.core.compile_model(model, "CPU", {"PERFORMANCE_HINT": hint, "INFERENCE_NUM_THREADS": self.threads,
                                                      "INFERENCE_PRECISION_HINT": "f32"})


class OpenVinoLatency(Runner):
    def __init__(self, converted: OpenVinoModel, batch: int):
        compiled = converted.compile(batch, "LATENCY")
        self.request = compiled.create_infer_request()
        self.inputs = [x.numpy() for x in converted.spec.example_inputs(batch)]
        self.note = (f"IR {converted.convert_s:.1f} s; {compiled.get_property('NUM_STREAMS')} stream(s), "
                     f"{compiled.get_property('INFERENCE_NUM_THREADS')} threads")

    def run(self):
        return self.request.infer(self.inputs, share_inputs=True)


class OpenVinoThroughput(Runner):
    def __init__(self, converted: OpenVinoModel, batch: int):
        compiled = converted.compile(1, "THROUGHPUT")
        requests = compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
        self.queue = converted.ov.AsyncInferQueue(compiled, requests)
        arrays = [x.numpy() for x in converted.spec.example_inputs(batch)]
        self.samples = [[a[i:i + 1] for a in arrays] for i in range(batch)]
        self.answers: list = [None] * batch

        def done(request, index: int) -> None:
            self.answers[index] = request.get_output_tensor(0).data.copy()

        self.queue.set_callback(done)
        self.note = (f"IR {converted.convert_s:.1f} s; {compiled.get_property('NUM_STREAMS')} streams, "
                     f"{requests} requests of batch 1")

    def run(self):
        for index, sample in enumerate(self.samples):
            self.queue.start_async(sample, userdata=index, share_inputs=True)
        self.queue.wait_all()
        return self.answers

    def outputs(self, result):
        import numpy as np

        return np.concatenate(result)


class OrtRunner(Runner):
    def __init__(self, session, spec, batch: int, note: str):
        names = [s.name for s in spec.inputs]
        arrays = [x.numpy() for x in spec.example_inputs(batch)]
        # an input the graph does not use may have been dropped by the exporter
        self.feeds = {i.name: arrays[names.index(i.name)] for i in session.get_inputs()}
        self.session, self.note = session, note

    def run(self):
        return self.session.run(None, self.feeds)


def ort_session(path: str, threads: int, parallel: tuple[int, int] | None, stop_spinning: bool = False):
    """An ONNX session: sequential with `threads`, or ORT_PARALLEL with `parallel`; `stop_spinning` frees the cores."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if stop_spinning:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    if parallel is None:
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    else:
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        options.inter_op_num_threads, options.intra_op_num_threads = parallel
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    threads_text = (f"intra {threads}, sequential" if parallel is None
                    else f"inter {parallel[0]}, intra {parallel[1]}, parallel")
    return session, threads_text


class PoolRunner(Runner):
    """packrat, fat: an InstancePool of the given instances; a run is B requests, all answered."""

    def __init__(self, spec, model: str, instances: list[dict], mode: str, batch: int):
        from packrat.serving.pool.api import InstanceConfig, ModelConfig
        from packrat.serving.pool.instance_pool import InstancePool

        configs = [InstanceConfig(i["threads"], i["batch"], tuple(i["cores"]), 0, i.get("expected_ms"),
                                  i.get("runtime", "inductor")) for i in instances]
        self.pool = InstancePool(ModelConfig(model, graph_mode=mode), configs)
        self.requests = pool_requests(spec, batch)
        self.checks = pool_requests(spec, batch, v2=True)  # v2 answers hold the outputs, to compare with eager's
        used = self.pool.mode
        self.note = self.pool.describe() + (f"; {used}" if used == mode else f"; ran {used}, not {mode}")

    def run(self):
        return answered(self.pool, self.requests)

    def forget_stages(self) -> None:
        self.pool.stages.clear()

    def stage_ms(self) -> dict:
        """The median ms of each stage of the sub-batches since forget_stages (pool.stages)."""
        return self.pool.stages.medians()

    def outputs(self, _result):
        import numpy as np

        return np.concatenate([v2_output(a.body) for a in answered(self.pool, self.checks)])

    def close(self) -> None:
        self.pool.close()


def serve(connection, peer: str, config: dict) -> None:
    """A peer's pinned process answering {"op": "start" | "time" | "stop", "batch": B} until the connection
    closes; what it builds stays up across rounds."""
    pin(config["cores"])
    import numpy as np
    import torch

    from packrat.models.zoo import resolve

    spec, shared, runners = resolve(config["model"]), {}, {}
    ops = {"start": lambda batch: start_runner(peer, spec, batch, config, shared, runners, np),
           "time": lambda batch: time_runner(runners[batch], config["iters"]),
           "stop": lambda batch: runners.pop(batch).close() or {}}
    while True:
        try:
            request = connection.recv()
        except (EOFError, KeyboardInterrupt):  # the parent is done, or interrupted
            break
        try:
            with torch.inference_mode() if peer in TORCH_PEERS else contextlib.nullcontext():
                answer = ops[request["op"]](request["batch"])
        except Exception as exc:  # one B's failure is reported, the process goes on
            answer = {"error": error_text(exc)}
        connection.send(answer)
    for runner in runners.values():  # left up by an interrupted parent: a pool's processes end with it
        runner.close()


def prepare_shared(peer: str, spec, config: dict, shared: dict) -> None:
    """What a peer's process prepares once for every B: OpenVINO's IR, onnxruntime's session (packrat's artefacts)."""
    threads = len(config["cores"])
    if peer in OPENVINO_PEERS and "openvino" not in shared:
        shared["openvino"] = OpenVinoModel(spec, threads)
    if peer in ORT_PEERS and "ort" not in shared:
        from packrat.models.runtimes import ensure_artefact

        begun = time.perf_counter()
        parallel = tuple(config["ort_parallel"]) if peer == "onnxruntime-parallel" else None
        session, threads_text = ort_session(str(ensure_artefact(spec, "onnxruntime")), threads, parallel)
        shared["ort"] = (session, f"{threads_text}; model and session {time.perf_counter() - begun:.1f} s")


def runner_for(peer: str, spec, batch: int, config: dict, shared: dict):
    if peer in TORCH_PEERS:
        return TorchRunner(spec, batch, peer)
    if peer in OPENVINO_PEERS:
        kind = OpenVinoLatency if peer == "openvino-latency" else OpenVinoThroughput
        return kind(shared["openvino"], batch)
    if peer in ORT_PEERS:
        return OrtRunner(shared["ort"][0], spec, batch, shared["ort"][1])
    plan = config["pools"][peer][str(batch)]
    return PoolRunner(spec, config["model"], plan["instances"], config["pools"]["mode"], batch)


def start_runner(peer: str, spec, batch: int, config: dict, shared: dict, runners: dict, np) -> dict:
    """The peer's runner at B built into `runners`: its first run (the setup's end), --warmup more, its outputs."""
    if peer in POOL_PEERS and "skipped" in config["pools"][peer][str(batch)]:
        return {"skipped": config["pools"][peer][str(batch)]["skipped"]}
    prepare_shared(peer, spec, config, shared)
    begun = time.perf_counter()
    runner = runner_for(peer, spec, batch, config, shared)
    try:
        runner.run()  # the first run belongs to the setup (a graph mode's first call, a pool's warm-up)
        setup_s = time.perf_counter() - begun
        for _ in range(config["warmup"]):
            runner.run()
        output = np.asarray(runner.outputs(runner.run()), dtype=np.float32)
    except BaseException:
        runner.close()
        raise
    runners[batch] = runner
    return {"setup_s": setup_s, "note": runner.note, "output": output}


ROUND_WARMUP = 1  # untimed batches opening each round: another peer just had the cores (its threads may still spin)


def time_runner(runner: Runner, iters: int) -> dict:
    """One round of a started runner: ROUND_WARMUP untimed batches, then `iters` timed ones."""
    for _ in range(ROUND_WARMUP):
        runner.run()
    if isinstance(runner, PoolRunner):
        runner.forget_stages()
    times = [elapsed_ms(runner.run) for _ in range(iters)]
    stages = {"stage_ms": runner.stage_ms()} if isinstance(runner, PoolRunner) else {}
    return {"latency_ms": statistics.median(times), "samples_ms": times, **stages}
