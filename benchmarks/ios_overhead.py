"""The IOS executor's own cost: the plain fx graph vs the same operators run by the executor.

    GOMP_SPINCOUNT=10000 .venv/bin/python benchmarks/ios_overhead.py [--models inception_v3,randwire] [--batches 1,8]

Three runs of each network, interleaved in shuffled rounds in one process, medians (2 threads):
- plain graph: the traced module, what PyTorch runs;
- executor, sequential: the sequential schedule as the executor runs it (consecutive full-width
  stages fused into one generated function; target: within 3 % of plain);
- executor, a stage per operator: the same schedule with fusion off, so every operator is its own
  stage with its own generated function and hand-off; (it - plain) / operators is the fixed cost
  each stage adds (target: at most 10 µs per operator).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

from ios_scheduler.api import sequential_schedule
from ios_scheduler.graph import capture
from ios_scheduler.runtime import ScheduledModule
from packrat.models.zoo import resolve

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import elapsed_ms, interleaved_medians, markdown_head, networks_parser


def measure(model: str, batch: int, threads: int, rounds: int) -> dict:
    spec = resolve(model)
    module, x = spec.build().eval(), spec.example_input(batch)
    graph = capture(module, (x,))
    schedule = sequential_schedule(graph, threads, batch, model)
    fused = ScheduledModule(graph.module, schedule)
    fused.plain = False  # through the executor even though the schedule is plain
    per_op = ScheduledModule(graph.module, schedule, fuse=False)
    runs = {"plain": graph.module, "sequential": fused, "per-operator": per_op}
    with torch.inference_mode():
        for fn in runs.values():
            for _ in range(3):
                fn(x)
        medians = interleaved_medians({name: lambda fn=fn: elapsed_ms(lambda: fn(x)) for name, fn in runs.items()},
                                      rounds, random)
    fused.close()
    per_op.close()
    return {"ops": len(graph.ops), **medians}


def main() -> None:
    args = networks_parser(__doc__, models="inception_v3,randwire").parse_args()
    torch.set_num_threads(args.threads)
    random.seed(0)
    print(markdown_head(["model", "batch", "operators", "plain", "executor, sequential", "vs plain",
                         "executor, a stage per operator", "fixed cost per operator"]))
    for model in args.models:
        for batch in args.batches:
            r = measure(model, batch, args.threads, args.rounds)
            per_op_us = (r["per-operator"] - r["plain"]) / r["ops"] * 1e3
            print(f"| {model} | {batch} | {r['ops']} | {r['plain']:.1f} ms | {r['sequential']:.1f} ms | "
                  f"{r['sequential'] / r['plain']:.3f}× | {r['per-operator']:.1f} ms | {per_op_us:.1f} µs |",
                  flush=True)


if __name__ == "__main__":
    main()
