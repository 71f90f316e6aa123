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
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch

from . import serving
from .planner import Plan, serving_plan
from .pool import InstancePool, ModelConfig
from .profile import load
from .topology import detect

SERVER_CONFIGS = (  # name, handler, plan mode (fixed plans: no reconfiguration)
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
                              plan=plan_mode, handler=handler, reconfigure=False)
        with warmed_server(name, model, mar, run_dir, users, warmup_s, log) as (server, token):
            log(f"-- {name}: {users} users for {duration_s:.0f} s")
            results[name] = run_locust(server.inference_url, model, users, duration_s, run_dir / "load", token=token)
    return results


@contextmanager
def warmed_server(name: str, model: str, mar: Path, run_dir: Path, users: int, warmup_s: float, log):
    """TorchServe started on free loopback ports and warmed up by locust; stopped on exit."""
    from loadtest import run_locust

    log(f"-- {name}: starting TorchServe")
    server = serving.start(serving.Server(run_dir, model, serving.Ports.free(), token_auth=True), mar)
    try:
        token = server.key("inference")
        run_locust(server.inference_url, model, users, warmup_s, run_dir / "warmup", token=token)
        yield server, token
    finally:
        serving.stop(server)


def save_json(path: Path, payload) -> None:
    def default(value):
        if isinstance(value, Plan):
            return value.to_json()
        if hasattr(value, "__dataclass_fields__"):
            return asdict(value)
        return str(value)

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=default))


# ---- step load: reconfiguration on vs fixed plans ------------------------------------------

def step_bench(model: str, batch: int, profile_path: Path, out_dir: Path, *, low: int = 1, cycles: int = 10,
               step_s: float = 12.0, warmup_s: float = 6.0, max_batch_delay_ms: int = 50, log=print) -> dict:
    """A low → high → low … locust load against the packrat handler with reconfiguration on,
    and with the plan fixed for the high and for the low batch size."""
    from loadtest import plot_timeline, run_locust

    users = ",".join([str(low), str(batch)] * cycles + [str(low)])
    configs = (("reconfigure-on", True, batch), ("fixed-plan-B%d" % batch, False, batch),
               ("fixed-plan-B%d" % low, False, low))
    results = {}
    for name, reconfigure, plan_batch in configs:
        run_dir = out_dir / name
        mar = serving.archive(model, profile_path, run_dir / "model_store", name=model, batch_size=batch,
                              max_batch_delay_ms=max_batch_delay_ms, reconfigure=reconfigure, plan_batch=plan_batch)
        with warmed_server(name, model, mar, run_dir, batch, warmup_s, log) as (server, token):
            log(f"-- {name}: step load {users} users, {step_s:.0f} s per step")
            result = run_locust(server.inference_url, model, batch, step_s * (2 * cycles + 1), run_dir / "load",
                                token=token, shape="step",
                                env={"PACKRAT_STEP_USERS": users, "PACKRAT_STEP_SECONDS": str(step_s)})
            status = serving.handler_status(server)
        switches = [r for r in status["reconfigurations"] if r["started_at"] >= (result.start_time or 0)]
        markers = [(r["started_at"] + r["seconds"], f"B={r['to_batch']}") for r in switches]
        png = plot_timeline(result.history, out_dir / f"timeline-{name}.png", markers)
        results[name] = {"load": result, "reconfigurations": switches, "timeline": str(png),
                         **switch_figures(result, switches)}
    return results


def switch_figures(result, switches: list[dict]) -> dict:
    """Switch durations, and p99 in the seconds of each switch against the new plan's
    steady p99 (the rest of its step), from locust's per-second history."""
    ok = [r for r in switches if not r.get("error")]
    ratios = []
    for r, following in zip(ok, ok[1:] + [None]):
        begin, end = r["started_at"], r["started_at"] + r["seconds"] + 1.0
        during = [h.p99_ms for h in result.history if begin <= h.timestamp <= end and h.p99_ms == h.p99_ms]
        settle_end = following["started_at"] if following else float("inf")
        steady = [h.p99_ms for h in result.history if end + 2 <= h.timestamp < settle_end and h.p99_ms == h.p99_ms]
        if during and steady:
            ratios.append(max(during) / statistics.median(steady))
    return {
        "switches": len(ok),
        "failed_switches": len(switches) - len(ok),
        "failed_requests": result.failures,
        "switch_seconds_median": statistics.median([r["seconds"] for r in ok]) if ok else None,
        "switch_seconds_max": max((r["seconds"] for r in ok), default=None),
        "switch_p99_ratio_median": statistics.median(ratios) if ratios else None,
        "switch_p99_ratio_max": max(ratios, default=None),
    }


def format_step_results(results: dict) -> str:
    lines = [f"{'config':<18} {'requests':>8} {'failures':>8} {'p50 ms':>7} {'p99 ms':>7} {'req/s':>6} "
             f"{'switches':>8} {'switch s (med/max)':>18} {'p99 in switch / steady (med/max)':>33}"]
    for name, r in results.items():
        load = r["load"]
        secs = (f"{r['switch_seconds_median']:.2f}/{r['switch_seconds_max']:.2f}"
                if r["switch_seconds_median"] is not None else "-")
        ratio = (f"{r['switch_p99_ratio_median']:.2f}/{r['switch_p99_ratio_max']:.2f}"
                 if r["switch_p99_ratio_median"] is not None else "-")
        lines.append(f"{name:<18} {load.requests:>8} {load.failures:>8} {load.p50_ms:>7.1f} {load.p99_ms:>7.1f} "
                     f"{load.throughput_rps:>6.1f} {r['switches']:>8} {secs:>18} {ratio:>33}")
    return "\n".join(lines)
