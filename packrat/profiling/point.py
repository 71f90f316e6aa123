"""Measure one profile point, L(t, b), in this (fresh) process.

Run as ``python -m packrat.profiling.point --model M --threads T --batch B --cores 0,1 ...``;
prints one JSON line with the statistics. The profiler starts one such process per
point so no point inherits another's thread pools, allocator state or caches.
Pinning happens before torch is imported, so OpenMP's threads start on the right cores.

With ``--loaded`` the process is one of several copies measured side by side (the
profiler's contention measurement) and runs the model when told, as an instance of a plan
does: after loading and warming up it prints ``ready`` and a JSON object (mode, cores), then
for every ``run`` line on stdin runs the model once and prints its time in ms; it exits when
stdin closes. The profiler sends ``run`` to all copies at once and waits for all of them,
so each round takes as long as the slowest copy, like a batch split across a plan.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from packrat.models.modes import DEFAULT_MODE, MODES
from packrat.models.runtimes import DEFAULT_RUNTIME, RUNTIMES


def _pin(cores: list[int], threads: int) -> None:
    os.sched_setaffinity(0, cores)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["MKL_NUM_THREADS"] = str(threads)


def warm_up(module, examples: tuple, runs: int) -> None:
    import torch

    with torch.inference_mode():
        for _ in range(runs):
            module(*examples)


def time_model(module, examples: tuple, warmup: int, iters: int | None, min_time: float | None) -> list[float]:
    """Latencies in ms of `iters` calls, or of as many calls as fit in `min_time` s (≥ 3)."""
    import torch

    warm_up(module, examples, warmup)
    with torch.inference_mode():
        samples: list[float] = []
        start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            module(*examples)
            samples.append((time.perf_counter() - t0) * 1e3)
            if iters is not None and len(samples) >= iters:
                break
            if min_time is not None and len(samples) >= 3 and time.perf_counter() - start >= min_time:
                break
    return samples


def serve_runs(module, examples: tuple, actual: dict) -> None:
    """The --loaded protocol: say ready (with `actual`), then one timed run per `run` line until stdin closes."""
    import torch

    print("ready " + json.dumps(actual), flush=True)
    with torch.inference_mode():
        for line in sys.stdin:
            if line.strip() != "run":
                return
            t0 = time.perf_counter()
            module(*examples)
            print(f"{(time.perf_counter() - t0) * 1e3:.4f}", flush=True)


def summarize(samples: list[float]) -> dict[str, float | int]:
    ordered = sorted(samples)
    p99_index = min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))
    return {
        "latency_ms": statistics.fmean(ordered),
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[p99_index],
        "std_ms": statistics.pstdev(ordered),
        "iterations": len(ordered),
        "mad_ms": robust_spread(ordered),
    }


def robust_spread(samples: list[float]) -> float:
    """The spread of `samples` that a few outliers do not make: 1.4826 x their median absolute
    deviation (the standard deviation, for normal noise). A VM's hiccups inflate the std: ResNet-50
    ⟨2, 4⟩ under ONNX Runtime, p50 130.9 ms, p99 175, std 13.8, kept inductor (146.9 ms) in a
    profile where, as served, both OpenVINO and ONNX Runtime were 0.87 of it (BENCHMARKS.md, issue 32)."""
    middle = statistics.median(samples)
    return 1.4826 * statistics.median(abs(x - middle) for x in samples)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--input-shape", default=None)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--cores", required=True, help="comma-separated CPU ids")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--min-time", type=float, default=None)
    parser.add_argument("--graph-mode", default=DEFAULT_MODE, choices=MODES)
    parser.add_argument("--runtime", default=DEFAULT_RUNTIME, choices=RUNTIMES,
                        help="the engine that runs the model (inductor: torch, in --graph-mode)")
    parser.add_argument("--ios-cache", default=None, help="run the model by its IOS schedule (cached here)")
    parser.add_argument("--loaded", action="store_true",
                        help="one of several copies measured together: say ready, then run once per "
                             "'run' line on stdin, printing the time, until stdin closes")
    return parser


def _prepare(args: argparse.Namespace):
    """(module, example inputs, mode) for the point, built after torch's thread settings."""
    import torch

    from packrat.models.zoo import prepare, resolve

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    shape = tuple(int(x) for x in args.input_shape.split(",")) if args.input_shape else None
    spec = resolve(args.model, shape)
    if args.ios_cache:
        from packrat.ios_scheduler.cache import prepare_ios

        return prepare_ios(spec, args.batch, args.threads, args.ios_cache)
    if args.runtime != DEFAULT_RUNTIME:
        from packrat.models.runtimes import prepare_runtime

        module, examples = prepare_runtime(spec, args.runtime, args.batch, args.threads)
        return module, examples, args.runtime
    return prepare(spec, args.batch, graph_mode=args.graph_mode)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _pin([int(c) for c in args.cores.split(",")], args.threads)
    import torch

    module, examples, mode = _prepare(args)
    # What the process really runs with, so callers can check the pinning took.
    actual = {"mode": mode, "cores": sorted(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads()}
    if args.loaded:
        warm_up(module, examples, args.warmup)
        serve_runs(module, examples, actual)
        return 0
    samples = time_model(module, examples, args.warmup, args.iters, args.min_time)
    print(json.dumps({**summarize(samples), **actual}), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    # Measured and said: exit now. The interpreter's orderly shutdown with torch loaded takes about
    # half a second a point, which the profiler would wait for (nothing here needs it: the result
    # is printed and flushed).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
