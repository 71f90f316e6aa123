"""The IOS runtime's own cost: the plain fx graph vs the same operators run one stage at a
time by the staged executor (the sequential schedule with its fast path turned off).

    GOMP_SPINCOUNT=10000 .venv/bin/python benchmarks/ios_overhead.py [--model inception_v3] [--batches 1,8]

Interleaved rounds in shuffled order in one process, medians (2 threads).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from ios_scheduler.api import sequential_schedule
from ios_scheduler.graph import capture
from ios_scheduler.runtime import ScheduledModule
from packrat.models import resolve


def measure(model: str, batch: int, threads: int, rounds: int) -> dict[str, float]:
    spec = resolve(model)
    module, x = spec.build().eval(), spec.example_input(batch)
    graph = capture(module, (x,))
    staged = ScheduledModule(graph.module, sequential_schedule(graph, threads, batch, model))
    staged._plain = False  # run it through the stage loop, as a schedule with concurrent stages is run
    runs = {"plain graph": graph.module, "staged executor": staged}
    samples: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    with torch.inference_mode():
        for fn in runs.values():
            for _ in range(3):
                fn(x)
        for _ in range(rounds):
            random.shuffle(order)
            for name in order:
                start = time.perf_counter()
                runs[name](x)
                samples[name].append((time.perf_counter() - start) * 1e3)
    staged.close()
    return {name: statistics.median(v) for name, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="inception_v3")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    random.seed(0)
    print("| model | batch | plain graph | staged executor | overhead |")
    print("|---|---|---|---|---|")
    for batch in map(int, args.batches.split(",")):
        r = measure(args.model, batch, args.threads, args.rounds)
        plain, staged = r["plain graph"], r["staged executor"]
        print(f"| {args.model} | {batch} | {plain:.1f} ms | {staged:.1f} ms | {staged / plain:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
