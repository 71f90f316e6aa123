"""The pool alone, without TorchServe or Java (`packrat bench --pool-only`): B request bodies answered
in-process (the bare model; decode, run and encode as the stock handler does), by the fat pool and
by the planned pool, in interleaved rounds; the medians, their ratios and each pool's stages.
The bare model closes every round: run just before the handler path it warms it (issue 25).

`packrat bench --memory`: the USS a pool of one-thread instances of a runtime adds, as threads of
the engine and as processes (USS counts shared libraries once, where RSS counts them in each)."""

from __future__ import annotations

import gc
import os
import statistics
import time
from contextlib import ExitStack
from pathlib import Path

import psutil

from packrat.bench.resources import MIB
from packrat.bench.rounds import elapsed_ms, interleaved, medians
from packrat.machine.budget import cpu_budget
from packrat.planning.planner import serving_plan
from packrat.profiling.profiles import load
from packrat.serving.settling import answered

CASES = ("in-process", "in-process-codec", "pool-fat", "pool-plan")
IN_PROCESS_STAGES = ("decode", "model", "encode")  # the laps answer_batch stamps


def pool_bench(model: str, batch: int, profile_path: Path, rounds: int = 20, progress=None, *,
               payload: str | None = None, tokenizer: Path | None = None, cases=CASES) -> dict:
    """Median ms of each of `cases` at `batch` over interleaved rounds, the bare model closing each (it warms
    what follows); B bodies of `payload` (None: the model's natural one)."""
    import torch

    from packrat.codec.payloads import build_payload, natural_payload
    from packrat.codec.codec import Codec
    from packrat.codec.config import CodecConfig
    from packrat.models.modes import served
    from packrat.models.zoo import prepare, resolve
    from packrat.codec.batch import answer_batch
    from packrat.serving.pool.api import ModelConfig, Request
    from packrat.serving.pool.instance_pool import InstancePool

    topology = cpu_budget().topology
    threads = topology.num_cores
    profile = load(profile_path)
    items, mode = profile.items(), served(profile.metadata.get("mode"))
    fat_plan, _ = serving_plan(items, threads, batch, topology, "fat")
    plan, fallback = serving_plan(items, threads, batch, topology, "auto")
    spec = resolve(model)
    body, content_type = build_payload(model, payload)
    bodies = [(body, content_type)] * batch
    requests = [Request.as_received(body, content_type)] * batch
    torch.set_num_threads(threads)
    module, inputs, mode = prepare(spec, batch, mode)
    codec_config = CodecConfig.for_model(spec, tokenizer=str(tokenizer) if tokenizer else None)
    codec = Codec(codec_config)
    config = ModelConfig(model, graph_mode=mode)  # as the profile measured it, like the server
    laps: list[list[float]] = []
    overhead: list[float] = []

    def handler_path() -> float:
        stamps = [time.monotonic()]  # answer_batch adds the end of each of its stages
        answers = answer_batch(module, codec, bodies, laps=stamps)
        if answers[0].status != 200:
            raise RuntimeError(f"in-process answer {answers[0].status}: {answers[0].reason}")
        laps.append(stamps)
        return (stamps[-1] - stamps[0]) * 1e3

    with ExitStack() as stack:
        pools = {name: stack.enter_context(InstancePool.from_plan(config, planned, codec=codec_config, gather_ms=0.0))
                 for name, planned in (("pool-fat", fat_plan), ("pool-plan", plan)) if name in cases}
        stack.enter_context(torch.inference_mode())

        def pool_case(name: str):
            def run() -> float:
                ms = elapsed_ms(lambda: answered(pools[name], requests))
                if name == "pool-fat":
                    overhead.append(ms - pools[name].last_compute_ms)
                return ms
            return run

        runs = {"in-process": lambda: elapsed_ms(lambda: module(*inputs)), "in-process-codec": handler_path}
        chosen = {name: runs.get(name) or pool_case(name) for name in CASES if name in cases}
        for run in chosen.values():  # warm-up: every path once
            run()
        for collected in (laps, overhead, *(pool.stages for pool in pools.values())):
            collected.clear()
        median = medians(interleaved(chosen, rounds, progress=progress, last="in-process"))
        stage_ms = {name: pool.stages.medians() for name, pool in pools.items()}
        per_sub_batch = {name: pool.stages.requests_per_sub_batch() for name, pool in pools.items()}
    if laps:
        stage_ms["in-process-codec"] = {stage: statistics.median((stamps[i + 1] - stamps[i]) * 1e3 for stamps in laps)
                                        for i, stage in enumerate(IN_PROCESS_STAGES)}

    def ratio(top: str, bottom: str) -> float | None:
        return median[top] / median[bottom] if top in median and bottom in median else None

    codec_ratio = ratio("in-process-codec", "in-process")
    return {
        "model": model, "batch": batch, "threads": threads, "rounds": rounds, "mode": mode,
        "payload": payload or natural_payload(model), "content_type": content_type, "cases": list(chosen),
        "plan": plan.describe(), "fallback": fallback, "predicted_plan_ms": plan.expected_latency_ms,
        "predicted_fat_ms": fat_plan.expected_latency_ms,
        "median_ms": median,
        "transport_overhead_ms": statistics.median(overhead) if overhead else None,
        "codec_overhead": codec_ratio - 1 if codec_ratio is not None else None,
        "pool_vs_in_process": ratio("pool-fat", "in-process-codec"),
        "plan_speedup_over_fat": ratio("pool-fat", "pool-plan"),
        "stage_ms": stage_ms, "requests_per_sub_batch": per_sub_batch,
    }


def format_pool_results(results: list[dict]) -> str:
    """The medians per B, with the ratios the cases allow; then each path's stages per B."""
    from packrat.loadtest import align
    from packrat.serving.pool.stages import STAGES

    def num(value, spec: str = ".1f", unit: str = "") -> str:
        return "-" if value is None else f"{value:{spec}}{unit}"

    cases = [name for name in CASES if any(name in r["median_ms"] for r in results)]
    lines = [["B", *cases, "codec ovh", "pool / codec", "transport", "fat / plan", "plan"]]
    for r in results:
        lines.append([str(r["batch"]), *(num(r["median_ms"].get(name)) for name in cases),
                      num(r["codec_overhead"], "+.1%"), num(r["pool_vs_in_process"], ".3f"),
                      num(r["transport_overhead_ms"], ".2f", " ms"), num(r["plan_speedup_over_fat"], ".2f", "×"),
                      r["plan"]])
    columns = [(name, r) for name in CASES for r in results if name in r["stage_ms"]]
    stages = [stage for stage in (*STAGES, "total") if any(stage in r["stage_ms"][name] for name, r in columns)]
    if not columns:
        return align(lines)
    breakdown = [["stage (median ms)", *(f"{name} B={r['batch']}" for name, r in columns)]]
    breakdown += [[stage, *(num(r["stage_ms"][name].get(stage), ".2f") for name, r in columns)] for stage in stages]
    breakdown.append(["requests/sub-batch", *(num(r["requests_per_sub_batch"].get(name), ".2f") for name, r in columns)])
    return f"{align(lines)}\n\n{align(breakdown)}"


# ---- memory per instance (`packrat bench --memory`) ---------------------------------------------

def instance_memory(model: str, runtime: str, instances: int = 2) -> dict:
    """{model, runtime, kind, instances, engine_mib, children_mib, per_instance_mib}: the USS its instances add."""
    import torch  # noqa: F401  (in the baseline, as in an engine)

    from packrat.models.runtimes import base_runtime, ensure_artefact, installed, instance_kind
    from packrat.models.zoo import resolve
    from packrat.serving.pool.instance_pool import InstanceConfig, InstancePool, ModelConfig, Request

    spec = resolve(model)
    if base_runtime(runtime) != "inductor" and installed(runtime):
        ensure_artefact(spec, runtime)
        __import__(base_runtime(runtime))
    cores = sorted(os.sched_getaffinity(0))
    engine = psutil.Process()
    gc.collect()
    before = engine.memory_full_info().uss
    configs = [InstanceConfig(1, 1, (cores[i % len(cores)],), runtime=runtime) for i in range(instances)]
    body = spec.example_inputs(1)[0].numpy().tobytes()
    with InstancePool(ModelConfig(model), configs if len(cores) >= instances else configs[:1]) as pool:
        pool.infer([Request(body, "application/octet-stream")] * len(pool.configs))
        gc.collect()
        engine_mib = (engine.memory_full_info().uss - before) / MIB
        children = [psutil.Process(pid).memory_full_info().uss for pid in set(pool.pids()) - {os.getpid()}]
        count = len(pool.configs)
    children_mib = sum(children) / MIB
    return {"model": model, "runtime": runtime, "kind": instance_kind(runtime), "instances": count,
            "engine_mib": engine_mib, "children_mib": children_mib,
            "per_instance_mib": (max(engine_mib, 0.0) + children_mib) / count}


def format_memory(results: list[dict]) -> str:
    lines = [f"{'model':<14} {'runtime':<20} {'kind':<8} {'instances':>9} {'engine MiB':>11} {'processes MiB':>14} "
             f"{'per instance MiB':>17}"]
    for r in results:
        lines.append(f"{r['model']:<14} {r['runtime']:<20} {r['kind']:<8} {r['instances']:>9} {r['engine_mib']:>11.1f} "
                     f"{r['children_mib']:>14.1f} {r['per_instance_mib']:>17.1f}")
    return "\n".join(lines)
