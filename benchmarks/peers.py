"""Packrat's plan against what users would pick instead, side by side, on the same cores.

    .venv/bin/python benchmarks/peers.py [--model resnet50] [--batches 1,4,8] [--cores N]
                                         [--rounds 3] [--iters 10] [--warmup 2] [--peers packrat,fat,eager,...]
                                         [--profile profiles/MODEL.csv] [--json OUT]

One model (--model: resnet50, bert_base, or any zoo model; tiny for smoke tests) at each batch size
B of --batches, on T cores: the physical cores this process may use, one logical CPU each, as
packrat's topology counts them (or the first --cores of them). Every peer answers the same B
samples (the zoo's spec.example_inputs(B), from the zoo module's seeded weights) with all T cores:

  packrat              the plan for (T, B) from the profile (--profile, default profiles/MODEL.csv as
                       `packrat profile` writes it; its primary figure, loaded where it has one, or
                       --latency), run as packrat serves it without TorchServe: an InstancePool of the
                       plan's instances, each pinned to its own cores, each in the runtime the profile
                       measured fastest at its ⟨t, b⟩ (`packrat profile --runtimes`: inductor in the
                       profile's graph mode, --packrat-mode to override; OpenVINO; ONNX Runtime). A run submits the B samples as B requests (raw
                       little-endian tensor bytes for a single-input model; a KServe v2 JSON body with
                       one entry per named input for a multi-input one such as bert_base) and waits for
                       every answer. No plan for B from the profile: packrat is skipped at that B.
  fat                  the same pool with one inductor instance ⟨T threads, batch B⟩: the usual single-process
                       server, and the pool's own overhead (codec, shared memory, dispatch) made visible.
  eager                PyTorch eager under torch.inference_mode, torch.set_num_threads(T).
  script               TorchScript: models.prepare(..., "script") (trace, freeze, optimize_for_inference).
  compile              packrat's compile mode, as its instances run it: models.prepare(..., "compile")
                       (inductor with frozen weights; packrat builds it once per model as an AOTInductor
                       package with a dynamic batch, kept in COMPILE_CACHE_ENV's folder).
  torch-compile        what a user writes: torch.compile(module, dynamic=False) with inductor's freezing
                       on, one static graph per B (compiled in that B's setup).
  openvino-latency     openvino.convert_model(module, example_input=inputs), reshaped to a static
                       batch B, compiled for "CPU" with PERFORMANCE_HINT LATENCY,
                       INFERENCE_NUM_THREADS T, INFERENCE_PRECISION_HINT f32; one infer request.
  openvino-throughput  the same model at batch 1, compiled with PERFORMANCE_HINT THROUGHPUT (its
                       automatic streams), INFERENCE_NUM_THREADS T, f32; a run puts the B samples as B
                       infer requests on an AsyncInferQueue of the compiled model's
                       OPTIMAL_NUMBER_OF_INFER_REQUESTS and waits for all of them (latency = the whole
                       batch's).
  onnxruntime          the module exported to ONNX once before the rounds (dynamic batch axis;
                       --onnx-exporter: auto tries torch's dynamo exporter, which needs onnxscript, then
                       the legacy TorchScript one), an InferenceSession (CPUExecutionProvider, all graph
                       optimisations) with intra_op_num_threads T, ORT_SEQUENTIAL.
  onnxruntime-parallel the same model with execution_mode ORT_PARALLEL: independent graph branches
                       run at once on the inter-op pool. --ort-parallel-threads INTER:INTRA (default
                       T:1, so no more than T threads compute at once, as for every other peer); a
                       chain of operators (ResNet, BERT) has little to run in parallel, so this is the
                       knob users reach for rather than a fast setting.

Every peer runs in a fresh process pinned to the T cores, with torch.set_num_threads(T) and one
inter-op thread (packrat's and fat's instances pin themselves to their own cores inside those).
Interleaved rounds (--rounds): each round runs every peer once, in a shuffled order, and each peer's
process runs the batch sizes in a shuffled order; at each B it prepares (compile, convert, start the
pool: "setup s"), runs --warmup untimed batches, then --iters timed ones and keeps their median. The
table gives, per B, the median over rounds of those medians, its ratio to packrat's (peer / packrat:
above 1, packrat is faster) and the largest absolute difference of the peer's outputs from eager's
on the same inputs (packrat and fat: their KServe v2 answers to the same samples, after the timed
runs), marked DIFFERS above 1e-3 of the outputs' largest magnitude. Inductor's cache
(TORCHINDUCTOR_CACHE_DIR) and packrat's compiled packages (COMPILE_CACHE_ENV) are fresh
directories per run of this script, so round 1's setups compile cold and later rounds' load what
round 1 built. A peer whose packages are missing is reported as
"not installed (pip install ...)" and skipped (pip install -e '.[peers]' installs them all).
--json OUT keeps every figure: each run's samples, setups and notes, the summary and the tables.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import child_json, doc_parser, error_text, fresh_compile_caches, pin, pool_requests
from packrat.bench.pool import answered
from packrat.bench.results import write_json
from packrat.bench.rounds import in_rounds
from packrat.profiling.profiles import default_path as default_profile_path
from packrat.cli.types import int_list

PEERS = ("packrat", "fat", "eager", "script", "compile", "torch-compile", "openvino-latency", "openvino-throughput",
         "onnxruntime", "onnxruntime-parallel")
TORCH_PEERS = ("eager", "script", "compile", "torch-compile")
POOL_PEERS = ("packrat", "fat")
OPENVINO_PEERS = ("openvino-latency", "openvino-throughput")
ORT_PEERS = ("onnxruntime", "onnxruntime-parallel")
NEEDS = {peer: ("openvino",) for peer in OPENVINO_PEERS} | {peer: ("onnxruntime",) for peer in ORT_PEERS}
EXPORTERS = ("auto", "dynamo", "legacy")
DIFF_TOLERANCE = 1e-3  # relative to the reference outputs' largest magnitude
RESULT = "PEERS-RESULT "  # prefix of a child's result line on stdout (libraries print there too)
V2_TYPES = {"float32": "FP32", "float64": "FP64", "float16": "FP16", "int64": "INT64", "int32": "INT32",
            "int16": "INT16", "int8": "INT8", "uint8": "UINT8", "bool": "BOOL"}
EXPORT_BATCH = 2  # the example batch for ONNX export and OpenVINO conversion (1 could be specialised)


# ---- pure: the report from JSON-able results ---------------------------------------------------

def missing_packages(peer: str, installed=lambda name: importlib.util.find_spec(name) is not None) -> str | None:
    """'not installed (pip install ...)' when a package the peer needs is missing, else None."""
    missing = [name for name in NEEDS.get(peer, ()) if not installed(name)]
    return f"not installed (pip install {' '.join(missing)})" if missing else None


def diff_stats(output, reference) -> dict:
    """Largest absolute difference of `output` from `reference` (numpy arrays), and relative to the
    reference's largest magnitude; differs when that exceeds DIFF_TOLERANCE."""
    import numpy as np

    output, reference = np.asarray(output, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if output.shape != reference.shape:
        return {"max_abs_diff": None, "relative_diff": None, "differs": True,
                "why": f"shape {list(output.shape)} vs eager's {list(reference.shape)}"}
    if not (np.isfinite(output).all() and np.isfinite(reference).all()):
        return {"max_abs_diff": None, "relative_diff": None, "differs": True, "why": "non-finite outputs"}
    worst = float(np.abs(output - reference).max()) if output.size else 0.0
    scale = float(np.abs(reference).max()) if reference.size else 0.0
    relative = worst / scale if scale > 0 else worst
    return {"max_abs_diff": worst, "relative_diff": relative, "differs": relative > DIFF_TOLERANCE}


def ratio(ms: float | None, packrat_ms: float | None) -> float | None:
    """peer / packrat: above 1, packrat is faster."""
    if ms is None or not packrat_ms:
        return None
    return ms / packrat_ms


def summarise(runs: dict[str, list[dict]], batches: list[int], skipped: dict[str, str] | None = None) -> dict:
    """Per B, per peer: the median over rounds of each run's median latency, the median setup, the
    worst output difference from eager's over the rounds, the ratio to packrat, the first note; a
    peer with no good run at B gets its first error (or skip reason) instead. `runs[peer]` is that
    peer's child results, one per round ({"batches": {"B": {...}}} or {"error": ...}); `skipped`
    holds peers that never ran (not installed), with why."""
    summary: dict[int, dict[str, dict]] = {}
    for batch in batches:
        rows: dict[str, dict] = {}
        for peer, peer_runs in runs.items():
            entries = [run.get("batches", {}).get(str(batch)) or {"error": run.get("error", "no result")}
                       for run in peer_runs]
            good = [e for e in entries if e.get("latency_ms") is not None]
            if not good:
                first = next((e for e in entries if "skipped" in e), None) or (entries[0] if entries else {})
                rows[peer] = {"error": first.get("skipped") or first.get("error") or "not run"}
                if "skipped" in first:
                    rows[peer]["skipped"] = True
                continue
            diffs = [e for e in good if "max_abs_diff" in e]
            known = [e for e in diffs if e["max_abs_diff"] is not None]
            row = {"latency_ms": statistics.median(e["latency_ms"] for e in good),
                   "rounds": len(good), "failed_rounds": len(entries) - len(good),
                   "setup_s": statistics.median(e["setup_s"] for e in good) if all("setup_s" in e for e in good)
                   else None,
                   "max_abs_diff": max((e["max_abs_diff"] for e in known), default=None),
                   "relative_diff": max((e["relative_diff"] for e in known), default=None),
                   "differs": any(e.get("differs") for e in diffs),
                   "diff_why": next((e["why"] for e in diffs if e.get("why")), None),
                   "note": next((e["note"] for e in good if e.get("note")), "")}
            rows[peer] = row
        for peer, why in (skipped or {}).items():
            rows[peer] = {"error": why, "skipped": True}
        packrat_ms = rows.get("packrat", {}).get("latency_ms")
        for row in rows.values():
            if "latency_ms" in row:
                row["vs_packrat"] = ratio(row["latency_ms"], packrat_ms)
        summary[batch] = {peer: rows[peer] for peer in sorted(rows, key=_peer_order)}
    return summary


def _peer_order(peer: str) -> tuple[int, str]:
    return (PEERS.index(peer) if peer in PEERS else len(PEERS), peer)


def _diff_text(row: dict) -> str:
    if row.get("max_abs_diff") is None:
        return "DIFFERS (" + row["diff_why"] + ")" if row.get("diff_why") else "-"
    return f"{row['max_abs_diff']:.1e}" + (" DIFFERS" if row.get("differs") else "")


def markdown(summary: dict, header: str = "", plans: dict | None = None) -> str:
    """One table per B: peer, median ms, vs packrat, max |Δ| vs eager, setup s, notes. `plans` maps
    B to a line about packrat's plan at that B."""
    lines = [header, ""] if header else []
    for batch, rows in summary.items():
        lines += [f"### B = {batch}", ""]
        if plans and plans.get(batch):
            lines += [plans[batch], ""]
        lines += ["| peer | median ms | vs packrat | max abs Δ vs eager | setup s | notes |",
                  "|---|---:|---:|---:|---:|---|"]
        for peer, row in rows.items():
            if "latency_ms" not in row:
                lines.append(f"| {peer} | - | - | - | - | {_cell(row['error'])} |")
                continue
            vs = f"{row['vs_packrat']:.2f}" if row.get("vs_packrat") is not None else "-"
            setup = f"{row['setup_s']:.1f}" if row.get("setup_s") is not None else "-"
            note = row.get("note", "")
            if row.get("failed_rounds"):
                note = (note + "; " if note else "") + f"{row['failed_rounds']} round(s) failed"
            lines.append(f"| {peer} | {row['latency_ms']:.2f} | {vs} | {_diff_text(row)} | {setup} | {_cell(note)} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def v2_body(names: list[str], arrays: list, index: int) -> bytes:
    """A KServe v2 request for sample `index` of the batch `arrays` (numpy, one per named input)."""
    inputs = []
    for name, array in zip(names, arrays):
        sample = array[index:index + 1]
        inputs.append({"name": name, "shape": list(sample.shape), "datatype": V2_TYPES[str(sample.dtype)],
                       "data": sample.reshape(-1).tolist()})
    return json.dumps({"inputs": inputs}, separators=(",", ":")).encode()


def v2_output(body: bytes):
    """The first output of a KServe v2 answer, as a numpy array of its shape."""
    import numpy as np

    output = json.loads(body)["outputs"][0]
    return np.asarray(output["data"], dtype=np.float64).reshape(output["shape"])


def parse_cores(count: int | None, allowed: list[int]) -> list[int]:
    """The first --cores of the cores this process may use (all of them when None)."""
    if count is None:
        return list(allowed)
    if not 1 <= count <= len(allowed):
        raise SystemExit(f"--cores {count}: this process may use {len(allowed)} core(s) ({allowed})")
    return list(allowed[:count])


def parse_peers(text: str) -> list[str]:
    peers = list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in peers if p not in PEERS]
    if unknown or not peers:
        raise SystemExit(f"unknown peer(s) {unknown}: choose from {','.join(PEERS)}")
    return peers


def parse_ratio(text: str, threads: int) -> tuple[int, int]:
    """--ort-parallel-threads INTER:INTRA, T standing for the cores."""
    try:
        inter, intra = (threads if part.strip().upper() == "T" else int(part) for part in text.split(":"))
    except ValueError:
        raise SystemExit(f"--ort-parallel-threads {text!r}: expected INTER:INTRA, e.g. T:1 or 2:1") from None
    if inter < 1 or intra < 1:
        raise SystemExit(f"--ort-parallel-threads {text!r}: thread counts must be >= 1")
    return inter, intra


# ---- the children: one peer, every B, in a fresh pinned process ---------------------------------

def _first_output(result):
    """A module's (first) output tensor: some return tuples or lists."""
    while isinstance(result, (tuple, list)):
        result = result[0]
    return result


class TorchRunner:
    """eager, script, compile: models.prepare in that graph mode (call under inference_mode)."""

    def __init__(self, spec, batch: int, mode: str):
        import warnings

        from packrat.models.zoo import prepare

        if mode == "torch-compile":  # the user's own: torch.compile, inductor, frozen weights, static shapes
            import torch
            import torch._inductor.config as inductor_config

            inductor_config.freezing = True
            self.module, self.inputs = torch.compile(spec.build(), dynamic=False), spec.example_inputs(batch)
            self.note = ""
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.module, self.inputs, used = prepare(spec, batch, graph_mode=mode)
        why = next((str(w.message) for w in caught if "failed" in str(w.message)), "")
        self.note = "" if used == mode else f"{mode} failed, ran {used}" + (f": {why[:200]}" if why else "")

    def run(self):
        return self.module(*self.inputs)

    def outputs(self, result):
        return _first_output(result).detach().float().numpy()

    def close(self) -> None:
        pass


class OpenVinoModel:
    """The zoo module converted once per process (ov.convert_model), compiled per B."""

    def __init__(self, spec, threads: int):
        import openvino as ov

        started = time.perf_counter()
        self.ov, self.spec, self.threads = ov, spec, threads
        self.model = ov.convert_model(spec.build(), example_input=spec.example_inputs(EXPORT_BATCH))
        self.core = ov.Core()
        self.convert_s = time.perf_counter() - started

    def compile(self, batch: int, hint: str):
        model = self.model.clone()
        model.reshape({i: [batch, *s.shape] for i, s in enumerate(self.spec.inputs)})  # static: the fastest
        return self.core.compile_model(model, "CPU", {"PERFORMANCE_HINT": hint, "INFERENCE_NUM_THREADS": self.threads,
                                                      "INFERENCE_PRECISION_HINT": "f32"})


class OpenVinoLatency:
    def __init__(self, converted: OpenVinoModel, batch: int):
        compiled = converted.compile(batch, "LATENCY")
        self.request = compiled.create_infer_request()
        self.inputs = [x.numpy() for x in converted.spec.example_inputs(batch)]
        self.note = (f"convert_model {converted.convert_s:.1f} s; {compiled.get_property('NUM_STREAMS')} stream(s), "
                     f"{compiled.get_property('INFERENCE_NUM_THREADS')} threads")

    def run(self):
        return self.request.infer(self.inputs, share_inputs=True)

    def outputs(self, result):
        return result[0]

    def close(self) -> None:
        pass


class OpenVinoThroughput:
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
        self.note = (f"convert_model {converted.convert_s:.1f} s; {compiled.get_property('NUM_STREAMS')} streams, "
                     f"{requests} requests of batch 1")

    def run(self):
        for index, sample in enumerate(self.samples):
            self.queue.start_async(sample, userdata=index, share_inputs=True)
        self.queue.wait_all()
        return self.answers

    def outputs(self, result):
        import numpy as np

        return np.concatenate(result)

    def close(self) -> None:
        pass


class OrtRunner:
    def __init__(self, session, spec, batch: int, note: str):
        names = [s.name for s in spec.inputs]
        arrays = [x.numpy() for x in spec.example_inputs(batch)]
        # an input the graph does not use may have been dropped by the exporter
        self.feeds = {i.name: arrays[names.index(i.name)] for i in session.get_inputs()}
        self.session, self.note = session, note

    def run(self):
        return self.session.run(None, self.feeds)

    def outputs(self, result):
        return result[0]

    def close(self) -> None:
        pass


def ort_session(path: str, threads: int, parallel: tuple[int, int] | None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
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


class PoolRunner:
    """packrat, fat: an InstancePool of the given instances; a run is B requests, all answered."""

    def __init__(self, spec, model: str, instances: list[dict], mode: str, batch: int):
        from packrat.serving.pool.api import InstanceConfig, ModelConfig, Request
        from packrat.serving.pool.instance_pool import InstancePool

        configs = [InstanceConfig(i["threads"], i["batch"], tuple(i["cores"]), 0, i.get("expected_ms"),
                                  i.get("runtime", "inductor")) for i in instances]
        self.pool = InstancePool(ModelConfig(model, graph_mode=mode), configs)
        self.requests = pool_requests(spec, batch)
        arrays = [x.numpy() for x in spec.example_inputs(batch)]
        names = [s.name for s in spec.inputs]
        # v2 JSON whatever the inputs: its answers hold the outputs, to compare with eager's
        self.checks = [Request(v2_body(names, arrays, i), "application/json") for i in range(batch)]
        used = self.pool.mode
        self.note = self.pool.describe() + (f"; {used}" if used == mode else f"; ran {used}, not {mode}")

    def run(self):
        return answered(self.pool, self.requests)

    def outputs(self, _result):
        import numpy as np

        return np.concatenate([v2_output(a.body) for a in answered(self.pool, self.checks)])

    def close(self) -> None:
        self.pool.close()


def child(peer: str, config: dict, round_index: int) -> dict:
    """Runs in the fresh process: every B (shuffled) for one peer; figures and output files."""
    started = time.perf_counter()
    pin(config["cores"])
    import numpy as np
    import torch

    from packrat.models.zoo import resolve

    spec = resolve(config["model"])
    batches = list(config["batches"])
    random.Random(config["seed"] * 1_000_003 + round_index * 1009 + PEERS.index(peer)).shuffle(batches)
    shared: dict = {}
    results: dict[str, dict] = {}
    for batch in batches:
        try:
            results[str(batch)] = time_batch(peer, spec, batch, config, shared, round_index, np, torch)
        except Exception as exc:  # one B's failure is reported, the others still run
            results[str(batch)] = {"error": error_text(exc)}
    return {"peer": peer, "round": round_index, "order": batches, "batches": results,
            "child_s": time.perf_counter() - started}


def prepare_shared(peer: str, spec, config: dict, shared: dict) -> None:
    """What a peer's process prepares once for every B (not in any B's setup): OpenVINO's
    conversion, onnxruntime's session."""
    threads = len(config["cores"])
    if peer in OPENVINO_PEERS and "openvino" not in shared:
        shared["openvino"] = OpenVinoModel(spec, threads)
    if peer in ORT_PEERS and "ort" not in shared:
        begun = time.perf_counter()
        parallel = tuple(config["ort_parallel"]) if peer == "onnxruntime-parallel" else None
        session, threads_text = ort_session(config["onnx"]["path"], threads, parallel)
        shared["ort"] = (session, f"{config['onnx']['exporter']} exporter; {threads_text}; session "
                                  f"{time.perf_counter() - begun:.1f} s")


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


def time_batch(peer: str, spec, batch: int, config: dict, shared: dict, round_index: int, np, torch) -> dict:
    if peer in POOL_PEERS and "skipped" in config["pools"][peer][str(batch)]:
        return {"skipped": config["pools"][peer][str(batch)]["skipped"]}
    mode = torch.inference_mode() if peer in TORCH_PEERS else contextlib.nullcontext()
    with mode:
        prepare_shared(peer, spec, config, shared)
        begun = time.perf_counter()
        runner = runner_for(peer, spec, batch, config, shared)
        try:
            runner.run()  # the first run belongs to the setup (a graph mode's first call, a pool's warm-up)
            setup_s = time.perf_counter() - begun
            timed = round_index > 0  # round 0: eager's outputs only, the reference when eager is not a peer
            for _ in range(config["warmup"] if timed else 0):
                runner.run()
            times, result = [], None
            for _ in range(config["iters"] if timed else 0):
                t0 = time.perf_counter()
                result = runner.run()
                times.append((time.perf_counter() - t0) * 1e3)
            if result is None:
                result = runner.run()
            output = np.asarray(runner.outputs(result), dtype=np.float32)
        finally:
            runner.close()
    path = Path(config["scratch"]) / "outputs" / f"{peer}-r{round_index}-b{batch}.npy"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, output)
    return {"latency_ms": statistics.median(times) if times else None, "samples_ms": times, "setup_s": setup_s,
            "note": runner.note, "output": str(path)}


def build_onnx(config: dict, exporter: str) -> dict:
    """Export the zoo module to ONNX with a dynamic batch axis (in a pinned child, once)."""
    pin(config["cores"])
    import torch

    from packrat.models.zoo import resolve

    spec = resolve(config["model"])
    names = [s.name for s in spec.inputs]
    examples = spec.example_inputs(EXPORT_BATCH)
    path = Path(config["scratch"]) / "onnx" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    tries = ([e for e in ("dynamo", "legacy") if e != "dynamo" or importlib.util.find_spec("onnxscript")]
             if exporter == "auto" else [exporter])
    failures = []
    for name in tries:
        started = time.perf_counter()
        try:
            with torch.no_grad():
                if name == "dynamo":
                    batch = torch.export.Dim("batch", min=1, max=4096)
                    torch.onnx.export(spec.build(), examples, str(path), dynamo=True, input_names=names,
                                      output_names=["output"], dynamic_shapes=tuple({0: batch} for _ in names),
                                      verbose=False)
                else:
                    torch.onnx.export(spec.build(), examples, str(path), dynamo=False, input_names=names,
                                      output_names=["output"], opset_version=17,
                                      dynamic_axes={n: {0: "batch"} for n in [*names, "output"]})
            return {"path": str(path), "exporter": name, "export_s": time.perf_counter() - started,
                    "failures": failures}
        except Exception as exc:
            failures.append(f"{name}: {error_text(exc)}")
    if exporter == "auto" and not importlib.util.find_spec("onnxscript"):
        failures.append("dynamo: not tried (pip install onnxscript)")
    return {"error": "ONNX export failed: " + "; ".join(failures)}


# ---- the parent --------------------------------------------------------------------------------

def versions() -> dict[str, str]:
    found = {}
    for name in ("torch", "openvino", "onnxruntime", "onnx", "onnxscript"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def pool_plans(args, cores: list[int]) -> dict:
    """packrat's plan and the fat instance per B, and the pools' graph mode, for the children."""
    from packrat.models.modes import MODES
    from packrat.errors import NoPlanError
    from packrat.planning.planner import Planner
    from packrat.errors import ProfileError
    from packrat.profiling.profiles import load
    from packrat.machine.topology import detect

    threads, topology = len(cores), detect(set(cores))
    path = args.profile or default_profile_path(args.model)
    pools: dict = {"packrat": {}, "fat": {}, "profile": str(path), "lines": {}}
    profile, why = None, None
    if not path.exists():
        why = (f"no profile {path}: measure one with `packrat profile --model {args.model} "
               f"--batches {','.join(map(str, args.batches))} --out {path}` (or give --profile)")
    else:
        try:
            profile = load(path)
        except ProfileError as exc:
            why = f"profile unusable: {exc}"
    mode = args.packrat_mode
    if mode is None:
        mode = (profile.metadata.get("mode") if profile else None) or "compile"
        if mode not in MODES:
            pools["mode_note"] = f"the profile's mode {mode!r} is not served here: its pools run compile"
            mode = "compile"
    pools["mode"] = mode
    latency = None
    if profile is not None:
        latency = args.latency or profile.figures[0]
        pools.update(latency=latency, metadata=profile.metadata)
    for batch in args.batches:
        fat_ms = profile.isolated.get((threads, batch)) if profile is not None else None  # the watchdog's yardstick
        pools["fat"][str(batch)] = {"instances": [{"threads": threads, "batch": batch, "cores": cores,
                                                   "expected_ms": fat_ms}]}
        if profile is None:
            pools["packrat"][str(batch)] = {"skipped": why}
            continue
        try:
            items = profile.items(latency)
            plan = Planner(items, threads, batch, profile.runtimes).plan(threads, batch, topology)
        except (NoPlanError, ProfileError, ValueError) as exc:
            pools["packrat"][str(batch)] = {"skipped": f"no plan for B={batch} from {path}: {exc}"}
            pools["lines"][batch] = f"packrat: no plan for B={batch} from {path} ({exc})"
            continue
        pools["packrat"][str(batch)] = {"instances": [{"threads": i.threads, "batch": i.batch, "cores": list(i.cores),
                                                       "expected_ms": i.latency_ms, "runtime": i.runtime}
                                                      for i in plan.instances],
                                        "describe": plan.describe(), "predicted_ms": plan.expected_latency_ms}
        fat = f"{plan.fat_latency_ms:.1f} ms" if plan.fat_latency_ms else "not profiled"
        pools["lines"][batch] = (f"packrat plan: {plan.describe()}, predicted {plan.expected_latency_ms:.1f} ms "
                                 f"(fat ⟨{threads}, {batch}⟩ {fat}; {latency} latencies of {path}, {mode} mode)")
    return pools


def run_child(args, command: list[str], env: dict) -> dict:
    return child_json(command, marker=RESULT, env=env, timeout=args.timeout)


def child_command(args, config_path: Path, peer: str, round_index: int) -> list[str]:
    return [sys.executable, __file__, "--child", peer, "--config", str(config_path), "--round", str(round_index)]


def add_diffs(runs: dict[str, list[dict]], reference: dict[str, str]) -> None:
    """Each run's output difference from eager's at that B (the first eager run's outputs)."""
    import numpy as np

    for peer_runs in runs.values():
        for run in peer_runs:
            for batch, entry in run.get("batches", {}).items():
                if entry.get("output") and reference.get(batch):
                    entry.update(diff_stats(np.load(entry["output"]), np.load(reference[batch])))


def reference_outputs(runs: dict[str, list[dict]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for run in runs.get("eager", []) + runs.get("_reference", []):
        for batch, entry in run.get("batches", {}).items():
            if entry.get("output") and batch not in found:
                found[batch] = entry["output"]
    return found


def _progress(round_index: int, peer: str, result: dict) -> str:
    if "error" in result:
        return f"round {round_index} {peer}: {result['error']}"
    parts = []
    for batch in sorted(result["batches"], key=int):
        entry = result["batches"][batch]
        parts.append(f"B={batch} " + (f"{entry['latency_ms']:.2f} ms (setup {entry['setup_s']:.1f} s)"
                                      if entry.get("latency_ms") is not None
                                      else entry.get("error") or entry.get("skipped") or "?"))
    return f"round {round_index} {peer} ({result['child_s']:.0f} s): " + "; ".join(parts)


def run(args) -> int:
    allowed = _physical_cores()
    cores = parse_cores(args.cores, allowed)
    threads = len(cores)
    peers = parse_peers(args.peers)
    skipped = {peer: why for peer in peers if (why := missing_packages(peer))}
    active = [p for p in peers if p not in skipped]
    found = versions()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="packrat-peers-") as scratch:
        env = fresh_compile_caches(Path(scratch))
        config = {"model": args.model, "cores": cores, "batches": args.batches, "iters": args.iters,
                  "warmup": args.warmup, "seed": args.seed, "scratch": scratch,
                  "ort_parallel": list(parse_ratio(args.ort_parallel_threads, threads))}
        if any(p in POOL_PEERS for p in active):
            config["pools"] = pool_plans(args, cores)
        if any(p in ORT_PEERS for p in active):
            config_path = Path(scratch) / "config.json"
            config_path.write_text(json.dumps(config))
            built = run_child(args, [sys.executable, __file__, "--build-onnx", args.onnx_exporter,
                                     "--config", str(config_path)], env)
            if "error" in built:
                print(f"onnx: {built['error']}", flush=True)
                for peer in ORT_PEERS:
                    if peer in active:
                        skipped[peer] = built["error"]
                active = [p for p in active if p not in ORT_PEERS]
            else:
                print(f"onnx: exported with the {built['exporter']} exporter in {built['export_s']:.1f} s"
                      + (f" (failed first: {'; '.join(built['failures'])})" if built["failures"] else ""), flush=True)
                config["onnx"] = built
        config_path = Path(scratch) / "config.json"
        config_path.write_text(json.dumps(config))
        runs: dict[str, list[dict]] = {peer: [] for peer in active}
        if "eager" not in active and active:  # outputs to compare with: eager's, once, untimed
            reference = run_child(args, child_command(args, config_path, "eager", 0), env)
            runs["_reference"] = [reference]
        for round_index, peer in in_rounds(active, args.rounds, rng):
            result = run_child(args, child_command(args, config_path, peer, round_index), env)
            runs[peer].append(result)
            print(_progress(round_index, peer, result), flush=True)
        add_diffs(runs, reference_outputs(runs))
    for peer_runs in runs.values():  # the output files went with the scratch directory
        for run in peer_runs:
            for entry in run.get("batches", {}).values():
                entry.pop("output", None)
    runs.pop("_reference", None)
    summary = summarise(runs, args.batches, skipped)
    pools = config.get("pools", {})
    header = (f"{args.model}, T = {threads} cores {cores}; torch {found['torch']}, openvino {found['openvino']}, "
              f"onnxruntime {found['onnxruntime']}"
              + (f" ({config['onnx']['exporter']} ONNX exporter)" if config.get("onnx") else "")
              + f"; medians over {args.rounds} round(s) of each run's median of {args.iters} timed batches "
              f"(after {args.warmup} warm-up); vs packrat = peer / packrat (above 1: packrat is faster)"
              + (f"; {pools['mode_note']}" if pools.get("mode_note") else ""))
    table = markdown(summary, header, pools.get("lines"))
    print("\n" + table)
    if args.json:
        meta = {"model": args.model, "threads": threads, "cores": cores, "batches": args.batches,
                "rounds": args.rounds, "iters": args.iters, "warmup": args.warmup, "seed": args.seed,
                "peers": peers, "versions": found, "onnx": config.get("onnx"),
                "ort_parallel_threads": config["ort_parallel"],
                "pools": {k: v for k, v in pools.items() if k != "lines"}, "plans": pools.get("lines", {}),
                "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
        write_json(args.json, {"meta": meta, "runs": runs, "summary": summary, "markdown": table})
        print(f"all figures: {args.json}")
    return 0


def _physical_cores() -> list[int]:
    from packrat.machine.topology import detect

    return list(detect().cores)


def parser() -> argparse.ArgumentParser:
    p = doc_parser(__doc__)
    p.add_argument("--model", default="resnet50", help="zoo model (default resnet50; e.g. bert_base, tiny)")
    p.add_argument("--batches", type=int_list, default=[1, 4, 8], help="batch sizes B (default 1,4,8)")
    p.add_argument("--cores", type=int, default=None, metavar="N",
                   help="T: the first N physical cores of this process (default: all of them)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each running every peer once (default 3)")
    p.add_argument("--iters", type=int, default=10, help="timed batches per peer and B in a round (default 10)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed batches per peer and B before them, besides the setup's first run (default 2)")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma list (default: all: {','.join(PEERS)})")
    p.add_argument("--profile", type=Path, default=None,
                   help="packrat's profile CSV, as `packrat profile` writes it (default profiles/MODEL.csv)")
    p.add_argument("--latency", choices=("loaded", "isolated"), default=None,
                   help="which profiled figure to plan with (default: the profile's primary one)")
    p.add_argument("--packrat-mode", choices=("compile", "script", "eager"), default=None,
                   help="graph mode of packrat's and fat's instances (default: the profile's mode)")
    p.add_argument("--onnx-exporter", choices=EXPORTERS, default="auto",
                   help="torch.onnx exporter: dynamo (needs onnxscript), legacy (TorchScript-based), or auto: "
                        "dynamo, then legacy if it fails (default auto)")
    p.add_argument("--ort-parallel-threads", default="T:1", metavar="INTER:INTRA",
                   help="onnxruntime-parallel's inter-op and intra-op threads, T for the cores (default T:1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the round orders (default 0)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one peer's process may take (default 3600)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write every figure here")
    p.add_argument("--child", choices=PEERS, help=argparse.SUPPRESS)
    p.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--build-onnx", choices=EXPORTERS, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.child or args.build_onnx:
        config = json.loads(args.config.read_text())
        result = child(args.child, config, args.round) if args.child else build_onnx(config, args.build_onnx)
        print(RESULT + json.dumps(result), flush=True)
        return 0
    if args.rounds < 1 or args.iters < 1 or args.warmup < 0:
        raise SystemExit("--rounds and --iters must be >= 1, --warmup >= 0")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
