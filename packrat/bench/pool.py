"""The pool alone, without TorchServe or Java (`packrat bench --pool-only`): the model called in this
process, the same with the codec's decode/encode around it, the fat pool and the planned pool
answering raw requests, measured in interleaved rounds so machine noise hits them alike; medians
and ratios are reported."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from packrat.bench.rounds import elapsed_ms, interleaved, medians
from packrat.machine.budget import cpu_budget
from packrat.planning.planner import serving_plan
from packrat.profiling.profiles import load

if TYPE_CHECKING:
    from packrat.serving.pool.instance_pool import InstancePool


def answered(pool: InstancePool, requests: list) -> list:
    """The pool's answers to `requests`; RuntimeError when it refused any."""
    answers = pool.infer(requests)
    bad = [a for a in answers if not a.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(answers)} requests answered {bad[0].status}: {bad[0].reason}")
    return answers


def _codec_path(codec, module, bodies: list[tuple[bytes, str]]) -> None:
    """The work the packrat path adds to the model, done in this process: decode each request,
    run the batch, encode each answer."""
    from packrat.serving.inference import batched

    decoded = [codec.decode(body, kind) for body, kind in bodies]
    outputs = module(*batched([d.samples for d in decoded]))
    [codec.encode(row.unsqueeze(0), d) for row, d in zip(outputs, decoded)]


def pool_bench(model: str, batch: int, profile_path: Path, rounds: int = 20, progress=None) -> dict:
    """Median latency (ms) of each configuration at batch `batch` on this machine's cores:
    the model in this process, plus the codec (decode/encode), the fat pool and the planned
    pool (both answering `batch` raw-tensor requests, codec inside the instances), over
    `rounds` interleaved rounds after one warm-up call of each; `progress()` after each round."""
    import torch

    from packrat.codec.codec import Codec
    from packrat.codec.config import CodecConfig
    from packrat.codec.forms import sample_request
    from packrat.models.modes import served
    from packrat.models.zoo import prepare, resolve
    from packrat.serving.pool.api import ModelConfig, Request
    from packrat.serving.pool.instance_pool import InstancePool

    topology = cpu_budget().topology
    threads = topology.num_cores
    profile = load(profile_path)
    items, mode = profile.items(), served(profile.metadata.get("mode"))
    fat_plan, _ = serving_plan(items, threads, batch, topology, "fat")
    plan, fallback = serving_plan(items, threads, batch, topology, "auto")
    spec = resolve(model)
    inputs = spec.example_inputs(batch)
    bodies = [sample_request(spec.inputs, sample) for sample in zip(*inputs)]
    requests = [Request(body, kind) for body, kind in bodies]
    torch.set_num_threads(threads)
    module, _, _ = prepare(spec, batch, mode)
    codec = Codec(CodecConfig.for_model(spec))
    config = ModelConfig(model, graph_mode=mode)  # as the profile measured it, like the server
    overhead: list[float] = []
    with InstancePool.from_plan(config, fat_plan) as fat, InstancePool.from_plan(config, plan) as planned:
        def fat_pool() -> float:
            ms = elapsed_ms(lambda: answered(fat, requests))
            overhead.append(ms - fat.last_compute_ms)
            return ms

        with torch.inference_mode():
            runs = {
                "in-process": lambda: module(*inputs),
                "in-process-codec": lambda: _codec_path(codec, module, bodies),
                "pool-fat": lambda: answered(fat, requests),
                "pool-plan": lambda: answered(planned, requests),
            }
            for fn in runs.values():  # warm-up
                fn()
            timed = {name: (lambda fn=fn: elapsed_ms(fn)) for name, fn in runs.items()}
            samples = interleaved({**timed, "pool-fat": fat_pool}, rounds, progress=progress)
    median = medians(samples)
    return {
        "model": model, "batch": batch, "threads": threads, "rounds": rounds,
        "plan": plan.describe(), "fallback": fallback, "predicted_plan_ms": plan.expected_latency_ms,
        "predicted_fat_ms": fat_plan.expected_latency_ms,
        "median_ms": median,
        "transport_overhead_ms": statistics.median(overhead),
        "codec_overhead": median["in-process-codec"] / median["in-process"] - 1,
        "plan_speedup_over_fat": median["pool-fat"] / median["pool-plan"],
    }


def format_pool_results(results: list[dict]) -> str:
    head = (f"{'B':>4}  {'in-process':>10}  {'+codec':>8}  {'pool fat':>9}  {'pool plan':>9}  "
            f"{'codec ovh':>9}  {'transport':>9}  {'plan/fat':>8}  plan")
    lines = [head]
    for r in results:
        m = r["median_ms"]
        lines.append(f"{r['batch']:>4}  {m['in-process']:>10.1f}  {m['in-process-codec']:>8.1f}  {m['pool-fat']:>9.1f}  "
                     f"{m['pool-plan']:>9.1f}  {r['codec_overhead']:>+9.1%}  {r['transport_overhead_ms']:>7.2f}ms"
                     f"  {r['plan_speedup_over_fat']:>7.2f}×  {r['plan']}")
    return "\n".join(lines)
