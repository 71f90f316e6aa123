"""`packrat bench`: fat vs planned, through real TorchServe with locust, or the pool alone.

Server mode runs, one after another, (a) stock TorchServe with the stock handler and
TorchServe's default workers, (b) the packrat handler with the fat plan ⟨1, T, B⟩ and
(c) the packrat handler with the planned ⟨i, t, b⟩; each is warmed up, then loaded by
locust (exact counts from its JSON output).

Pool-only mode needs neither Java nor locust: the model called in this process, the fat
pool, the fat plan behind the handler's decode/encode, and the planned pool, measured in
interleaved rounds so machine noise hits them alike; medians and ratios are reported.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import torch

from . import serving
from .planner import Plan, serving_plan
from .pool import InstancePool, ModelConfig
from .profile import load
from .topology import detect

SERVER_CONFIGS = (  # name, handler, plan mode
    ("stock", "stock", "auto"),
    ("packrat-fat", "packrat", "fat"),
    ("packrat-plan", "packrat", "auto"),
)


# ---- pool only ------------------------------------------------------------------------------

def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _handler_path(pool: InstancePool, bodies: list[bytearray], spec) -> None:
    """What the packrat handler does per batch, minus TorchServe: decode, run, encode."""
    from .codec import InputSpec, decode, encode

    input_spec = InputSpec(tuple(spec.input_shape), spec.input_dtype)
    outputs = pool.run(torch.stack([decode(body, input_spec, "application/octet-stream") for body in bodies]))
    [encode(row, spec.task) for row in outputs]


def pool_bench(model: str, batch: int, profile_path: Path, rounds: int = 20, progress=None) -> dict:
    """Median latency (ms) of each configuration at batch `batch` on this machine's cores."""
    from .models import prepare, resolve

    topology = detect()
    threads = topology.num_cores
    items = load(profile_path).items()
    fat_plan, _ = serving_plan(items, threads, batch, topology, "fat")
    plan, fallback = serving_plan(items, threads, batch, topology, "auto")
    spec = resolve(model)
    inputs = spec.example_input(batch)
    bodies = [bytearray(sample.numpy().tobytes()) for sample in inputs]
    torch.set_num_threads(threads)
    module, _, _ = prepare(spec, batch)
    config = ModelConfig(model)
    samples: dict[str, list[float]] = {"in-process": [], "pool-fat": [], "handler-fat": [], "pool-plan": []}
    overhead: list[float] = []
    with InstancePool.from_plan(config, fat_plan) as fat, InstancePool.from_plan(config, plan) as planned:
        with torch.inference_mode():
            runs = {
                "in-process": lambda: module(inputs),
                "pool-fat": lambda: fat.run(inputs),
                "handler-fat": lambda: _handler_path(fat, bodies, spec),
                "pool-plan": lambda: planned.run(inputs),
            }
            for fn in runs.values():  # warm-up
                fn()
            for _ in range(rounds):
                for name, fn in runs.items():
                    samples[name].append(_timed(fn))
                    if name == "pool-fat":
                        overhead.append(samples[name][-1] - fat.last_compute_ms)
                if progress:
                    progress()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "model": model, "batch": batch, "threads": threads, "rounds": rounds,
        "plan": plan.describe(), "fallback": fallback, "predicted_plan_ms": plan.expected_latency_ms,
        "predicted_fat_ms": fat_plan.expected_latency_ms,
        "median_ms": medians,
        "transport_overhead_ms": statistics.median(overhead),
        "handler_overhead": medians["handler-fat"] / medians["in-process"] - 1,
        "plan_speedup_over_fat": medians["pool-fat"] / medians["pool-plan"],
    }


def format_pool_results(results: list[dict]) -> str:
    head = (f"{'B':>4}  {'in-process':>10}  {'pool fat':>9}  {'handler fat':>11}  {'pool plan':>9}  "
            f"{'handler ovh':>11}  {'transport':>9}  {'plan/fat':>8}  plan")
    lines = [head]
    for r in results:
        m = r["median_ms"]
        lines.append(f"{r['batch']:>4}  {m['in-process']:>10.1f}  {m['pool-fat']:>9.1f}  {m['handler-fat']:>11.1f}  "
                     f"{m['pool-plan']:>9.1f}  {r['handler_overhead']:>+10.1%}  {r['transport_overhead_ms']:>7.2f}ms"
                     f"  {r['plan_speedup_over_fat']:>7.2f}×  {r['plan']}")
    return "\n".join(lines)


# ---- through TorchServe ---------------------------------------------------------------------

def server_bench(model: str, batch: int, profile_path: Path, out_dir: Path, *, duration_s: float = 30.0,
                 users: int | None = None, warmup_s: float = 8.0, max_batch_delay_ms: int = 100,
                 configs=SERVER_CONFIGS, log=print) -> dict:
    """Load each configuration with locust in turn; returns {name: LoadResult}."""
    from loadtest import run_locust

    users = users or batch  # enough requests in flight to fill TorchServe's batches
    results = {}
    for name, handler, plan_mode in configs:
        run_dir = out_dir / name
        mar = serving.archive(model, profile_path if handler == "packrat" else None, run_dir / "model_store",
                              name=model, batch_size=batch, max_batch_delay_ms=max_batch_delay_ms,
                              plan=plan_mode, handler=handler)
        log(f"-- {name}: starting TorchServe")
        server = serving.start(serving.Server(run_dir, model, serving.Ports.free(), token_auth=True), mar)
        try:
            token = server.key("inference")
            run_locust(server.inference_url, model, users, warmup_s, run_dir / "warmup", token=token)
            log(f"-- {name}: {users} users for {duration_s:.0f} s")
            results[name] = run_locust(server.inference_url, model, users, duration_s, run_dir / "load", token=token)
        finally:
            serving.stop(server)
    return results


def save_json(path: Path, payload) -> None:
    def default(value):
        if isinstance(value, Plan):
            return value.to_json()
        if hasattr(value, "__dataclass_fields__"):
            return asdict(value)
        return str(value)

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=default))
