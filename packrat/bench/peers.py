"""Packrat's plan against what users would pick instead, side by side, on the same cores.

One zoo model at each batch size B of --batches, on T cores (the physical cores this process may
use, or the first --cores of them); every peer answers the same B samples (spec.example_inputs(B))
with all T cores:

  packrat              the plan for (T, B) from the profile (its primary figure, or --latency) as
                       packrat serves it without TorchServe: an InstancePool of the plan's instances,
                       each pinned to its cores, in the runtime the profile measured fastest at its
                       ⟨t, b⟩; a run is B requests (raw tensor bytes; KServe v2 JSON for several
                       inputs), all answered. Skipped at a B the profile cannot plan.
  packrat-later        the same, planned on --later-profile (how far apart two profiles' plans
                       serve), or on the profile as --served-corrections corrected it while serving.
  fat                  the same pool with one inductor instance ⟨T threads, batch B⟩: the pool's own
                       overhead (codec, shared memory, dispatch) made visible.
  eager, script        PyTorch eager; TorchScript (trace, freeze, optimize_for_inference).
  compile              packrat's compile mode, as its instances run it (AOTInductor packages).
  torch-compile        what a user writes: torch.compile(module, dynamic=False), freezing on.
  openvino-latency     the IR packrat converts (models.runtimes), static batch B, PERFORMANCE_HINT LATENCY,
                       INFERENCE_NUM_THREADS T, f32; one infer request.
  openvino-throughput  the same at batch 1 with PERFORMANCE_HINT THROUGHPUT (its streams): the B samples
                       as B requests on an AsyncInferQueue, the latency the whole batch's.
  onnxruntime          the ONNX file packrat exports (models.runtimes: dynamo, dynamic batch), an
                       InferenceSession with intra_op_num_threads T, ORT_SEQUENTIAL.
  onnxruntime-parallel the same in ORT_PARALLEL (--ort-parallel-threads): the knob users reach for,
                       little to run in parallel in ResNet or BERT.

Every peer runs in a process of its own pinned to the T cores (torch with T threads, one inter-op
thread), started once: at each B it is set up there once ("setup s": its build and first batch),
runs --warmup untimed batches and keeps its outputs; then --rounds interleaved rounds each run every
peer in a shuffled order: one untimed batch (another peer just had the cores), then --iters timed
ones, their median the round's figure. Per B: the median over rounds (min–max); vs packrat, the
median over rounds of the peer's figure over packrat's in the same round (min–max), on which the
verdict rests; the outputs' largest difference from eager's (DIFFERS above 1e-3 of their largest
magnitude). Under 2 GiB free, the peers left wait for a later group, timed beside packrat; a peer
whose process ended is started again at the next B, and says so. Compile caches are fresh per run
(unless --keep-caches); a peer missing its packages is "not installed (pip install ...)". --json
keeps every figure, also of an interrupted run.
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
import importlib.metadata
import importlib.util
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from packrat.bench.harness import MEMORY_RESERVE_MIB, Worker, available_mib, error_text, fresh_compile_caches, \
    local_topology, pin, pool_requests
from packrat.bench.results import fmt_num, markdown_table, span, write_json
from packrat.serving.settling import answered
from packrat.bench.rounds import elapsed_ms, grouped_rounds, median_spread, paired
from packrat.profiling.profiles import default_path as default_profile_path

PEERS = ("packrat", "packrat-later", "fat", "eager", "script", "compile", "torch-compile", "openvino-latency", "openvino-throughput",
         "onnxruntime", "onnxruntime-parallel")
TORCH_PEERS = ("eager", "script", "compile", "torch-compile")
POOL_PEERS = ("packrat", "packrat-later", "fat")
OPENVINO_PEERS = ("openvino-latency", "openvino-throughput")
ORT_PEERS = ("onnxruntime", "onnxruntime-parallel")
NEEDS = {peer: ("openvino",) for peer in OPENVINO_PEERS} | {peer: ("onnxruntime",) for peer in ORT_PEERS}


# ---- pure: the report from JSON-able results ---------------------------------------------------

def missing_packages(peer: str, installed=lambda name: importlib.util.find_spec(name) is not None) -> str | None:
    """'not installed (pip install ...)' when a package the peer needs is missing, else None."""
    missing = [name for name in NEEDS.get(peer, ()) if not installed(name)]
    return f"not installed (pip install {' '.join(missing)})" if missing else None


def diff_stats(output, reference) -> dict:
    """packrat.models.runtimes.deviation of `output` from `reference`, and whether it differs by more
    than packrat's TOLERANCE of the reference's largest magnitude (or cannot be compared)."""
    from packrat.models.runtimes import TOLERANCE, deviation

    found = deviation(output, reference)
    return {**found, "differs": "why" in found or found["relative_diff"] > TOLERANCE}


def by_round(run: dict | None) -> dict[tuple[int, int], float]:
    """A peer's figure in each (group, round) it was timed in."""
    return {(r["group"], r["round"]): r["latency_ms"] for r in (run or {}).get("rounds", [])
            if r.get("latency_ms") is not None}


def summarise(runs: dict[str, dict[str, dict]], batches: list[int], skipped: dict[str, str] | None = None) -> dict:
    """Per B, per peer: the median over rounds of each round's median latency and the rounds'
    min–max, the setup, the outputs' difference from eager's, the note; vs packrat, the median over
    rounds of the peer's figure over packrat's in the same round (paired), with their min–max. A peer
    never timed at B gets its start's error (or skip reason) instead. `runs[B][peer]` is {"start":
    {...}, "rounds": [{"group", "round", "latency_ms" or "error", ...}]}; `skipped` holds peers that
    never ran (not installed), with why."""
    summary: dict[int, dict[str, dict]] = {}
    for batch in batches:
        table, rows = runs.get(str(batch), {}), {}
        for peer, run in table.items():
            start, good = run.get("start", {}), [r for r in run.get("rounds", []) if r.get("latency_ms") is not None]
            if not good:
                failed = next((r["error"] for r in run.get("rounds", []) if "error" in r), None)
                rows[peer] = {"error": start.get("skipped") or start.get("error") or failed or "not run",
                              **({"skipped": True} if "skipped" in start else {})}
                continue
            figures = median_spread([r["latency_ms"] for r in good])
            row = {"latency_ms": figures["median"], "spread_ms": figures["spread"], "rounds": len(good),
                   "failed_rounds": len(run["rounds"]) - len(good), "setup_s": start.get("setup_s"),
                   "max_abs_diff": start.get("max_abs_diff"), "relative_diff": start.get("relative_diff"),
                   "differs": bool(start.get("differs")), "diff_why": start.get("why"),
                   "note": "; ".join(filter(None, (start.get("note"), start.get("restarted"))))}
            staged = [r["stage_ms"] for r in good if r.get("stage_ms")]
            if staged:  # each stage's median over the rounds of its per-round medians
                row["stage_ms"] = {stage: statistics.median(s[stage] for s in staged) for stage in staged[0]}
            ratios = paired(by_round(run), by_round(table.get("packrat")))
            if ratios:
                row.update(vs_packrat=statistics.median(ratios), vs_packrat_spread=[min(ratios), max(ratios)],
                           paired_rounds=len(ratios))
            rows[peer] = row
        for peer, why in (skipped or {}).items():
            rows[peer] = {"error": why, "skipped": True}
        summary[batch] = {peer: rows[peer] for peer in sorted(rows, key=lambda p: (PEERS.index(p) if p in PEERS
                                                                                    else len(PEERS), p))}
    return summary


PEER_TARGET = 0.98  # best peer / packrat at every B, for every peer that runs here
AHEAD_TARGET = 1.10  # ... and this much where the oracle beats the best peer by as much
OWN = ("packrat", "packrat-later", "fat")  # packrat's own pools: not peers


def best_peer(rows: dict[str, dict]) -> tuple[str | None, dict, list[str]]:
    """(the other peer closest to packrat: the lowest paired vs packrat, else the fastest; its row;
    the peers that could not be measured) of one B's rows."""
    others = {p: r for p, r in rows.items() if p not in OWN}
    timed = {p: r for p, r in others.items() if r.get("latency_ms") is not None}
    best = min(timed, default=None, key=lambda p: (timed[p].get("vs_packrat") is None, timed[p].get("vs_packrat", 0.0),
                                                   timed[p]["latency_ms"]))
    return best, timed.get(best, {}), sorted(p for p in others if p not in timed)


def peer_verdict(ratio: float | None, unmeasured: Sequence[str], ahead: float | None = None,
                 oracle_needed: bool = True) -> tuple[bool, list[str]]:
    """(met, what was missing): best peer / packrat ≥ AHEAD_TARGET where the oracle beats the best
    peer by that much (`ahead`: best peer / oracle), else ≥ PEER_TARGET. Missed where a peer, or the
    oracle when `oracle_needed`, could not be measured: the target that applies is then not known."""
    missing = ([f"not measured: {', '.join(unmeasured)}"] if unmeasured else []) + \
        (["no oracle"] if oracle_needed and ahead is None else [])
    target = AHEAD_TARGET if ahead is not None and ahead >= AHEAD_TARGET else PEER_TARGET
    return ratio is not None and not missing and ratio >= target, missing


def verdict_lines(summary: dict[int, dict[str, dict]]) -> list[str]:
    """Per B: the best peer against packrat, paired per round, PASS or FAIL on PEER_TARGET by the
    rounds' median (the oracle's part of the target is `packrat bench oracle`'s)."""
    lines = []
    for batch, rows in summary.items():
        peer, row, unmeasured = best_peer(rows)
        value = row.get("vs_packrat")
        met, missing = peer_verdict(value, unmeasured, oracle_needed=False)
        shown = (f"{peer} / packrat {value:.3f}, median of {row['paired_rounds']} paired round(s), "
                 f"{span(row['vs_packrat_spread'], 3)}" if value is not None else "packrat or every peer not measured")
        lines.append(f"B={batch}: best peer / packrat ≥ {PEER_TARGET}: {'PASS' if met else 'FAIL'} ({shown}"
                     + (f"; {'; '.join(missing)}" if missing else "") + ")")
    return lines


def _diff_text(row: dict) -> str:
    if row.get("max_abs_diff") is None:
        return "DIFFERS (" + row["diff_why"] + ")" if row.get("diff_why") else "-"
    return f"{row['max_abs_diff']:.1e}" + (" DIFFERS" if row.get("differs") else "")


def markdown(summary: dict, header: str = "", plans: dict | None = None, predicted: dict | None = None) -> str:
    """One table per B: peer, median ms (rounds' min–max), vs packrat paired (min–max), max |Δ| vs
    eager, setup s, notes; then a line per pool peer on its path (path_line). `plans` maps B to a
    line about packrat's plan at that B, `predicted` B to the plan's predicted ms."""
    lines = [header, ""] if header else []
    for batch, rows in summary.items():
        lines += [f"### B = {batch}", ""]
        if plans and plans.get(batch):
            lines += [plans[batch], ""]
        cells = []
        for peer, row in rows.items():
            if "latency_ms" not in row:
                cells.append([peer, "-", "-", "-", "-", row["error"]])
                continue
            failed = [f"{row['failed_rounds']} round(s) failed"] if row.get("failed_rounds") else []
            vs = f"{fmt_num(row.get('vs_packrat'), 2)} ({span(row.get('vs_packrat_spread'))})" if "vs_packrat" in row else "-"
            cells.append([peer, f"{row['latency_ms']:.2f} ({span(row['spread_ms'])})", vs, _diff_text(row),
                          fmt_num(row.get("setup_s")), "; ".join([row["note"]] * bool(row.get("note")) + failed)])
        lines += [markdown_table(["peer", "median ms (rounds' min–max)", "vs packrat, paired (min–max)",
                                  "max abs Δ vs eager", "setup s", "notes"], cells), ""]
        lines += [path_line(peer, row, (predicted or {}).get(batch) if peer == "packrat" else None)
                  for peer, row in rows.items() if row.get("stage_ms")]
        lines += [""] if any(row.get("stage_ms") for row in rows.values()) else []
    return "\n".join(lines).rstrip() + "\n"


HAND_OFF = ("queue", "send", "wake")  # a sub-batch's way to its instance, the batch's copy apart


def path_line(peer: str, row: dict, predicted_ms: float | None) -> str:
    """A pool peer's path at one B: the hand-off (medians of queue + send + wake), the copy, the
    codec and the model stage per sub-batch, and packrat's prediction against what it served."""
    stages = row["stage_ms"]
    hand_off = sum(stages.get(stage, 0.0) for stage in HAND_OFF)
    text = (f"- {peer} per sub-batch (medians): hand-off {hand_off:.3f} ms (queue {stages['queue']:.3f}, send "
            f"{stages['send']:.3f}, wake {stages['wake']:.3f}), copy {stages['copy']:.3f}, decode "
            f"{stages['decode']:.3f}, model {stages['model']:.2f}, encode {stages['encode']:.3f}, reply "
            f"{stages['reply']:.3f}, hand-out {stages['hand_out']:.3f}")
    if predicted_ms:
        text += f"; predicted {predicted_ms:.2f} ms / served {row['latency_ms']:.2f} = {predicted_ms / row['latency_ms']:.3f}"
    return text


def v2_output(body: bytes):
    """The first output of a KServe v2 answer, as a numpy array of its shape."""
    import numpy as np

    output = json.loads(body)["outputs"][0]
    return np.asarray(output["data"], dtype=np.float64).reshape(output["shape"])


# ---- the children: one process per peer, pinned to the cores, started once ----------------------

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
    """The zoo module's IR, as packrat converts it (built by the first process, read by the others),
    read once per process and compiled per B."""

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
    """An InferenceSession of the ONNX file: sequential with `threads` intra-op threads, or with
    `parallel` (inter-op, intra-op threads) in ORT_PARALLEL; with `stop_spinning`, its pools' threads
    stop spinning when a run ends (as packrat's runtime's do), so they leave the cores to whatever
    runs next in the process."""
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
    """A peer's process (harness.Worker), pinned to the cores, answering the parent's requests
    ({"op": "start" | "time" | "stop", "batch": B}) until the connection closes: what it builds (IR,
    session, compiled module, pool) stays up across rounds."""
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
    """What a peer's process prepares once for every B (not in any B's setup): OpenVINO's IR,
    onnxruntime's session (of packrat's artefacts, built by the first process that needs them)."""
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
    """The peer's runner at B built and kept in `runners`: its first run (the setup's end), --warmup
    more, and its outputs (for the comparison with eager's)."""
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


# ---- the parent --------------------------------------------------------------------------------

def pool_plans(args, cores: list[int]) -> dict:
    """packrat's plan (and packrat-later's) and the fat instance per B, and the pools' graph mode,
    for the children."""
    from packrat.machine.topology import detect
    from packrat.models.modes import MODES

    topology = detect(set(cores))
    path = args.profile or default_profile_path(args.model)
    profile, why = read_profile(args, path)
    pools: dict = {"fat": {}, "profile": str(path), "lines": {}}
    mode = args.packrat_mode
    if mode is None:
        mode = (profile.metadata.get("mode") if profile else None) or "compile"
        if mode not in MODES:
            pools["mode_note"] = f"the profile's mode {mode!r} is not served here: its pools run compile"
            mode = "compile"
    pools["mode"] = mode
    if profile is not None:
        pools.update(latency=args.latency or profile.figures[0], metadata=profile.metadata)
    for batch in args.batches:
        fat_ms = profile.isolated.get((len(cores), batch)) if profile is not None else None  # the watchdog's yardstick
        pools["fat"][str(batch)] = {"instances": [{"threads": len(cores), "batch": batch, "cores": cores,
                                                   "expected_ms": fat_ms}]}
    pools["packrat"] = plans_of(args, profile, why, path, cores, topology, pools["lines"], "packrat plan", mode)
    if profile is not None and args.settle_s > 0:
        pools["settled"] = settled_plans(args, profile, topology, mode, pools["packrat"], pools["lines"])
    later_lines: dict = {}
    if args.later_profile:
        later, later_why = read_profile(args, args.later_profile)
        if later is not None and args.served_corrections:  # as that engine plans with it: its corrections
            from packrat.serving.correcting import PlanCorrector  # and the figures inferred from them

            if not args.served_corrections.exists():
                raise SystemExit(f"packrat bench peers: no served-latency file {args.served_corrections}")
            later = PlanCorrector(later, args.served_corrections, keep=False).profile
            pools["served_corrections"] = str(args.served_corrections)
        pools["later_profile"] = str(args.later_profile)
        pools["packrat-later"] = plans_of(args, later, later_why, args.later_profile, cores, topology,
                                          later_lines, "packrat-later plan", mode)
    else:
        pools["packrat-later"] = {str(b): {"skipped": "no --later-profile"} for b in args.batches}
    for batch, line in later_lines.items():
        pools["lines"][batch] = "\n\n".join(filter(None, (pools["lines"].get(batch), line)))
    return pools


def settled_plans(args, profile, topology, mode: str, plans: dict, lines: dict) -> dict:
    """packrat's plans as an engine serves them: the near-ties at each B timed side by side and the
    faster taken (serving/settling.py), on the same cores, before the peers start; each B's line
    says which and why. B -> the settlement (JSON)."""
    from packrat.models.zoo import resolve
    from packrat.serving.settling import model_pools, settle_batches

    batches = [b for b in args.batches if "instances" in plans[str(b)]]
    if not batches or (args.latency or profile.figures[0]) != profile.figures[0]:
        return {}  # settling times the plans of the primary figures, as a server plans on them
    pools = model_pools(args.model, mode, max(batches))
    try:
        found = settle_batches(profile, resolve(args.model), pools, topology, batches, args.settle_s,
                               say=lambda line: print(line, flush=True))
    finally:
        pools.close()
    for settlement in found:
        plans[str(settlement.batch)] = pool_plan(settlement.plan)
        lines[settlement.batch] = f"{lines.get(settlement.batch, '')}\n\n{settlement.line()}".strip()
    return {str(s.batch): s.to_json() for s in found}


def pool_plan(plan) -> dict:
    """A plan as the children build its pool: its instances, what it is, its prediction."""
    return {"instances": [{"threads": i.threads, "batch": i.batch, "cores": list(i.cores), "expected_ms": i.latency_ms,
                           "runtime": i.runtime} for i in plan.instances],
            "describe": plan.describe(), "predicted_ms": plan.expected_latency_ms}


def read_profile(args, path: Path):
    """(the profile at `path`, None) or (None, why it cannot be used)."""
    from packrat.errors import ProfileError
    from packrat.profiling.profiles import held
    from packrat.serving.payloads import planned_for

    measure = f"`packrat profile --model {args.model} --batches {','.join(map(str, args.batches))} --out {path}`"
    try:  # the pools answer raw tensors: planned as the engine plans for them
        profile = held(path)
    except ProfileError as exc:
        return None, f"profile unusable: {exc}"
    if profile is None:
        return None, (f"no profile {path}: measure one with {measure} (or give --profile)" if not path.exists()
                      else f"{path} holds no points: measure them with {measure} (it resumes)")
    return planned_for(profile, raw_share=1.0), None


def plans_of(args, profile, why: str | None, path: Path, cores: list[int], topology, lines: dict, name: str,
             mode: str) -> dict:
    """Per B, the plan `profile` gives for all of `cores` (its instances and prediction), or why none;
    a line per B about it goes into `lines`."""
    from packrat.errors import NoPlanError, ProfileError
    from packrat.planning.planner import Planner

    plans, threads = {}, len(cores)
    for batch in args.batches:
        if profile is None:
            plans[str(batch)] = {"skipped": why}
            continue
        latency = args.latency or profile.figures[0]
        try:
            plan = Planner(profile.items(latency), threads, batch, profile.runtimes).plan(threads, batch, topology)
        except (NoPlanError, ProfileError, ValueError) as exc:
            plans[str(batch)] = {"skipped": f"no plan for B={batch} from {path}: {exc}"}
            lines[batch] = f"{name}: no plan for B={batch} from {path} ({exc})"
            continue
        plans[str(batch)] = pool_plan(plan)
        fat = f"{plan.fat_latency_ms:.1f} ms" if plan.fat_latency_ms else "not profiled"
        lines[batch] = (f"{name}: {plan.describe()}, predicted {plan.expected_latency_ms:.1f} ms "
                        f"(fat ⟨{threads}, {batch}⟩ {fat}; {latency} latencies of {path}, {mode} mode)")
    return plans


def measure(peers: list[str], batches: list[int], rounds: int, ask, rng=None, memory_low=lambda: False,
            say=print, runs: dict | None = None) -> dict:
    """Per B (a string), per peer: its start and its rounds (summarise's input), into `runs`. At each
    B every peer is started once, then timed in `rounds` interleaved rounds on what it started, beside
    packrat; where memory_low() after a start, the peers left start in a later group (rounds.
    grouped_rounds). `ask(peer, request)` answers a request ({"op": "start" | "time" | "stop",
    "batch": B}) in the peer's process; an answer with "ended" says that process ended: the peer is
    timed no further at this B."""
    runs = {} if runs is None else runs
    for batch in batches:
        table = runs[str(batch)] = {}
        if "eager" not in peers and peers:  # outputs to compare with: eager's, untimed
            table["_reference"] = {"start": ask("eager", {"op": "start", "batch": batch}), "rounds": []}
            if "setup_s" in table["_reference"]["start"]:
                ask("eager", {"op": "stop", "batch": batch})

        def start(peer: str, batch=batch, table=table) -> bool:
            answer = table.setdefault(peer, {"rounds": []})["start"] = ask(peer, {"op": "start", "batch": batch})
            say(f"B={batch} {peer}: " + (f"set up in {answer['setup_s']:.1f} s" if "setup_s" in answer
                                         else answer.get("skipped") or answer.get("error", "?")))
            return "setup_s" in answer

        def time_one(peer: str, group: int, r: int, batch=batch, table=table) -> bool:
            answer = ask(peer, {"op": "time", "batch": batch})
            table[peer]["rounds"].append({"group": group, "round": r, **answer})
            return not answer.get("ended")

        anchors = ["packrat"] if "packrat" in peers else []
        grouped_rounds(anchors, [p for p in peers if p not in anchors], start, time_one,
                       lambda peer, batch=batch: ask(peer, {"op": "stop", "batch": batch}), rounds, rng, memory_low,
                       lambda group, r, batch=batch, table=table: say(round_line(batch, group, r, table)))
    return runs


def round_line(batch: int, group: int, r: int, table: dict) -> str:
    """One round's figures, each peer's over packrat's in the same round beside it."""
    done = {peer: e for peer, run in table.items() for e in run["rounds"] if (e["group"], e["round"]) == (group, r)}
    packrat = done.get("packrat", {}).get("latency_ms")
    parts = [f"{peer} " + (f"{e['latency_ms']:.2f} ms" + (f" ({e['latency_ms'] / packrat:.2f})" if packrat else "")
                           if e.get("latency_ms") is not None else e.get("error", "?")) for peer, e in done.items()]
    return f"B={batch} round {r}" + (f" (group {group + 1})" if group else "") + ": " + ", ".join(parts)


def add_diffs(runs: dict[str, dict[str, dict]]) -> None:
    """Each start's output difference from eager's at that B (eager's own, or the untimed
    "_reference" start's), the outputs themselves dropped."""
    for table in runs.values():
        reference = next((t["start"].get("output") for p in ("eager", "_reference") if (t := table.get(p))), None)
        for run in table.values():
            output = run["start"].pop("output", None)
            if output is not None and reference is not None:
                run["start"].update(diff_stats(output, reference))


def with_later(peers: list[str], later_profile: Path | None) -> list[str]:
    """The peers to run: packrat-later beside packrat when there is a later profile, never without."""
    peers = [p for p in peers if p != "packrat-later"]
    if later_profile is None:
        return peers
    at = peers.index("packrat") + 1 if "packrat" in peers else 0
    return peers[:at] + ["packrat-later"] + peers[at:]


def run(args) -> int:
    cores = list(local_topology(args.cores, "--cores").cores)
    threads = len(cores)
    if args.served_corrections and args.later_profile is None:  # the same profile, as served
        args.later_profile = args.profile or default_profile_path(args.model)
    peers = with_later(args.peers, args.later_profile)
    skipped = {peer: why for peer in peers if (why := missing_packages(peer))}
    active = [p for p in peers if p not in skipped]
    found = {name: importlib.metadata.version(name) if importlib.util.find_spec(name) else "not installed"
             for name in ("torch", "openvino", "onnxruntime", "onnx", "onnxscript")}
    runs, interrupted = {}, False
    with tempfile.TemporaryDirectory(prefix="packrat-peers-") as scratch:
        env = None if args.keep_caches else fresh_compile_caches(Path(scratch))  # None: this environment's
        config = {"model": args.model, "cores": cores, "iters": args.iters, "warmup": args.warmup,
                  "ort_parallel": [n or threads for n in args.ort_parallel_threads]}
        if any(p in POOL_PEERS for p in active):
            config["pools"] = pool_plans(args, cores)
        workers: dict[str, Worker] = {}

        def ask(peer: str, request: dict) -> dict:
            extra = {}
            if peer in workers and not workers[peer].alive:  # it ended: a fresh one, said in its row
                extra["restarted"] = f"its process was started again at B={request['batch']}: the last had ended"
            if extra or peer not in workers:
                workers[peer] = Worker(serve, peer, config, env=env)
            answer = workers[peer].ask(request, args.timeout)
            return {**answer, **extra, **({"ended": True} if not workers[peer].alive else {})}

        try:
            measure(active, args.batches, args.rounds, ask, random.Random(args.seed),
                    lambda: available_mib() < MEMORY_RESERVE_MIB, lambda line: print(line, flush=True), runs)
        except KeyboardInterrupt:  # what was measured is still reported (the suite's budget ends a run so)
            interrupted = True
        finally:
            for worker in workers.values():
                worker.close()
        add_diffs(runs)
    for table in runs.values():
        table.pop("_reference", None)
    summary = summarise(runs, args.batches, skipped)
    pools = config.get("pools", {})
    header = (f"{args.model}, T = {threads} cores {cores}; torch {found['torch']}, openvino {found['openvino']}, "
              f"onnxruntime {found['onnxruntime']}; each peer started once per B ({args.warmup} warm-up batches), then "
              f"{args.rounds} interleaved round(s), each of {ROUND_WARMUP} untimed and {args.iters} timed batches: medians "
              "over rounds of each round's median; vs packrat = peer / packrat in the same round, median over rounds "
              "(above 1: packrat is faster)" + (f"; {pools['mode_note']}" if pools.get("mode_note") else "")
              + ("; INTERRUPTED: what was measured before" if interrupted else ""))
    predicted = {batch: plan.get("predicted_ms") for batch in args.batches
                 if (plan := pools.get("packrat", {}).get(str(batch), {}))}
    table = markdown(summary, header, pools.get("lines"), predicted)
    print("\n" + table)
    print("\n".join(["", *verdict_lines(summary)]))
    if args.json:
        meta = {"model": args.model, "threads": threads, "cores": cores, "batches": args.batches,
                "rounds": args.rounds, "iters": args.iters, "warmup": args.warmup, "seed": args.seed,
                "peers": peers, "versions": found, "interrupted": interrupted,
                "ort_parallel_threads": config["ort_parallel"],
                "pools": {k: v for k, v in pools.items() if k != "lines"}, "plans": pools.get("lines", {}),
                "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
        write_json(args.json, {"meta": meta, "runs": runs, "summary": summary, "markdown": table})
        print(f"all figures: {args.json}")
    return 130 if interrupted else 0
