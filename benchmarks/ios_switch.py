"""What switching between full-width operators and a concurrent stage costs on this CPU.

    GOMP_SPINCOUNT=10000 .venv/bin/python benchmarks/ios_switch.py [--models randwire,inception_v3] [--rounds 61]

Two measurements, in interleaved shuffled rounds, medians (2 threads):
1. the executor's hand-off: nothing run through `WorkerSet.run` on the calling thread (one
   group on every core), on one 1-thread worker, and on two at once;
2. per network (batch 1): S, a full-width stretch of 30 operators run as one generated
   function, and P, a stage of two 1-thread groups of one operator each, each timed alone
   (right after itself) and right after the other. "S after P" - "S alone" is the switch back
   to the full-width team; "P after S" - "P alone" the switch into the stage; their sum is
   what `StageTimer.switch_cost` adds to every concurrent candidate.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from ios_scheduler.api import _record_values
from ios_scheduler.codegen import compile_group
from ios_scheduler.graph import capture
from ios_scheduler.runtime import WorkerSet
from packrat.models.zoo import resolve


def timed(fn, before=None) -> float:
    (before or fn)()  # what runs just before the timed call: the call itself, or the other step
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def interleaved(cases: dict, rounds: int) -> dict:
    samples: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for _ in range(rounds):
        random.shuffle(names)
        for name in names:
            samples[name].append(cases[name]())
    return {name: statistics.median(v) for name, v in samples.items()}


def handoff(workers: WorkerSet, rounds: int) -> dict:
    nothing = lambda: None  # noqa: E731
    return interleaved({"calling thread": lambda: timed(lambda: workers.run([nothing], (2,))),
                        "one 1-thread worker": lambda: timed(lambda: workers.run([nothing], (1,))),
                        "two 1-thread workers": lambda: timed(lambda: workers.run([nothing, nothing], (1, 1)))},
                       rounds)


def switch(model: str, workers: WorkerSet, rounds: int) -> dict:
    spec = resolve(model)
    x = spec.example_input(1)
    graph = capture(spec.build().eval(), (x,))
    env = _record_values(graph, (x,))
    nodes = {n.name: n for n in graph.module.graph.nodes}

    def group(ops):
        return compile_group(graph.module, [nodes[name] for op in ops for name in graph.ops[op].nodes])

    middle = len(graph.ops) // 2
    stretch, a, b = group(range(middle - 30, middle)), group([middle]), group([middle + 1])
    full = lambda: stretch.run(env)  # noqa: E731
    stage = lambda: workers.run([lambda: a.run(env), lambda: b.run(env)], (1, 1))  # noqa: E731
    return interleaved({"S alone": lambda: timed(full), "S after P": lambda: timed(full, stage),
                        "P alone": lambda: timed(stage), "P after S": lambda: timed(stage, full)}, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="randwire,inception_v3")
    parser.add_argument("--rounds", type=int, default=61)
    args = parser.parse_args()
    torch.set_num_threads(2)
    random.seed(0)
    workers = WorkerSet(sorted(os.sched_getaffinity(0))[:2])
    with torch.inference_mode():
        print("| hand-off of nothing | round trip |\n|---|---|")
        for name, ms in handoff(workers, args.rounds * 10).items():
            print(f"| {name} | {ms * 1e3:.1f} µs |")
        print("\n| model | S alone | S after P | P alone | P after S | switch back | switch in | both |")
        print("|---|---|---|---|---|---|---|---|")
        for model in args.models.split(","):
            r = switch(model, workers, args.rounds)
            back, into = r["S after P"] - r["S alone"], r["P after S"] - r["P alone"]
            print(f"| {model} | {r['S alone']:.3f} ms | {r['S after P']:.3f} ms | {r['P alone']:.3f} ms | "
                  f"{r['P after S']:.3f} ms | {back * 1e3:.0f} µs | {into * 1e3:.0f} µs | {(back + into) * 1e3:.0f} µs |",
                  flush=True)
    workers.close()


if __name__ == "__main__":
    main()
