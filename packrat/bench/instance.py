"""An instance against its profile point (`benchmarks/instance_gap.py`): is a pool instance as fast
as the profiler said? The point as `packrat profile` times it and a one-instance pool on the same
cores, in interleaved rounds: its model stage and whole batch over the point, and its stages."""

from __future__ import annotations

import statistics

from packrat.bench.results import markdown_table, with_spread
from packrat.serving.settling import answered
from packrat.bench.rounds import elapsed_ms, interleaved

MEASURES = ("point", "model", "batch")


def instance_gap(model: str, runtime: str, threads: int, batch: int, cores: tuple[int, ...], *, rounds: int = 3,
                 iters: int = 30, warmup: int = 10, graph_mode: str = "compile", progress=None) -> dict:
    """The figures of one case (the module's doc); `progress()` after each round."""
    from packrat.codec.payloads import build_payload
    from packrat.codec.config import CodecConfig
    from packrat.models.zoo import resolve
    from packrat.profiling.measuring import ProfileSettings, measure_point
    from packrat.serving.pool.api import InstanceConfig, ModelConfig, Request
    from packrat.serving.pool.instance_pool import InstancePool

    spec = resolve(model)
    point = ProfileSettings(model, warmup=warmup, iters=iters, graph_mode=graph_mode, runtime=runtime)
    body, content_type = build_payload(model, "raw")
    requests = [Request.as_received(body, content_type)] * batch
    instance = InstanceConfig(threads, batch, tuple(cores), runtime=runtime)
    samples: dict[str, list[float]] = {name: [] for name in MEASURES}
    with InstancePool(ModelConfig(model, graph_mode=graph_mode), [instance], codec=CodecConfig.for_model(spec),
                      gather_ms=0.0) as pool:
        for _ in range(warmup):
            answered(pool, requests)

        def point_round() -> float:
            return measure_point(point, threads, batch, list(cores))["p50_ms"]

        def instance_round() -> float:
            pool.stages.clear()
            batch_ms = [elapsed_ms(lambda: answered(pool, requests)) for _ in range(iters)]
            samples["model"].append(pool.stages.medians()["model"])
            return statistics.median(batch_ms)

        timed = interleaved({"point": point_round, "batch": instance_round}, rounds, progress=progress)
        stages = pool.stages.medians()
        mode = pool.mode
    samples.update(timed)
    return summary(samples, model=model, runtime=runtime, threads=threads, batch=batch, mode=mode,
                   stage_ms=stages)


def summary(samples: dict[str, list[float]], **case) -> dict:
    """Medians over rounds, their spread and the ratios to the point. Pure."""
    median = {name: statistics.median(values) for name, values in samples.items()}
    return {**case, "rounds": len(samples["point"]), "median_ms": median,
            "spread_ms": {name: [min(values), max(values)] for name, values in samples.items()},
            "model_vs_point": median["model"] / median["point"], "batch_vs_point": median["batch"] / median["point"]}


def format_gaps(results: list[dict]) -> str:
    """A markdown table of instance_gap results."""
    def ms(r: dict, name: str) -> str:
        return with_spread(r["median_ms"][name], r["spread_ms"][name])

    hop = ("queue", "copy", "send", "wake", "locks", "reply", "hand_out")
    return markdown_table(["model", "runtime", "t", "b", "point ms", "instance model ms", "model / point",
                           "instance batch ms", "batch / point", "decode", "encode", "hop"],
                          [[r["model"], r["runtime"], r["threads"], r["batch"], ms(r, "point"), ms(r, "model"),
                            f"{r['model_vs_point']:.3f}", ms(r, "batch"), f"{r['batch_vs_point']:.3f}",
                            *(f"{r['stage_ms'].get(stage, 0.0):.2f}" for stage in ("decode", "encode")),
                            f"{sum(r['stage_ms'].get(stage, 0.0) for stage in hop):.2f}"] for r in results])
