"""Do an IOS schedule's stage costs add up to its whole run? Which stages mispredict?

    GOMP_SPINCOUNT=10000 .venv/bin/python benchmarks/ios_stage_costs.py [--models inception_v3,randwire]
                                                                        [--batches 1,8] [--rounds 15]

For each network and batch: search a schedule (without the end-to-end check, so the searched
schedule is studied whether or not it would be kept), then run it whole `--rounds` times,
timing every step (a stage, or a stretch of full-width stages run as one), interleaved with
runs of the sequential schedule. Prints, per kind of step, the search's summed stage costs
against the medians measured in the whole run, and the totals.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import defaultdict

import torch

from ios_scheduler.api import optimize, sequential_schedule
from ios_scheduler.graph import capture
from ios_scheduler.runtime import ScheduledModule
from packrat.models.zoo import resolve


def step_kind(module: ScheduledModule, step: int) -> str:
    kind, groups, split = module._stages[step]
    if kind == "merge":
        return "merged convolutions"
    if split == (module.schedule.threads,):
        return "full-width operators"
    return f"{len(groups)} groups on {'+'.join(map(str, split))} threads"


def study(model: str, batch: int, threads: int, rounds: int) -> dict:
    spec = resolve(model)
    module, x = spec.build().eval(), spec.example_input(batch)
    started = time.perf_counter()
    schedule = optimize(module, (x,), threads, progress=False, name=model, check=False)
    seconds = time.perf_counter() - started
    graph = capture(module, (x,))
    searched = ScheduledModule(graph.module, schedule)
    searched._plain = False
    sequential = ScheduledModule(graph.module, sequential_schedule(graph, threads, batch, model))
    steps: list[list[float]] = [[] for _ in searched._stages]
    whole: dict[str, list[float]] = {"searched": [], "sequential": []}
    with torch.inference_mode():
        for _ in range(3):
            searched(x), sequential(x)
        for _ in range(rounds):  # whole runs and step-timed runs in shuffled order
            jobs = ["steps", "searched", "sequential"]
            random.shuffle(jobs)
            for job in jobs:
                if job == "steps":
                    for i, ms in enumerate(searched.step_times(x)):
                        steps[i].append(ms)
                else:
                    run = searched if job == "searched" else sequential
                    start = time.perf_counter()
                    run(x)
                    whole[job].append((time.perf_counter() - start) * 1e3)
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for i, indices in enumerate(searched.step_stages):
        row = by_kind[step_kind(searched, i)]
        row[0] += 1
        row[1] += sum(schedule.stages[j].cost for j in indices)
        row[2] += statistics.median(steps[i])
    searched.close()
    sequential.close()
    return {"model": model, "batch": batch, "search_s": round(seconds, 1), **schedule.search,
            "kinds": {k: [n, round(p, 3), round(m, 3)] for k, (n, p, m) in by_kind.items()},
            "searched_ms": statistics.median(whole["searched"]), "sequential_ms": statistics.median(whole["sequential"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="inception_v3,randwire")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    random.seed(0)
    for model in args.models.split(","):
        for batch in map(int, args.batches.split(",")):
            r = study(model, batch, args.threads, args.rounds)
            if args.json:
                print(json.dumps(r), flush=True)
                continue
            print(f"\n{model}, batch {batch}: search {r['search_s']} s; whole run {r['searched_ms']:.2f} ms "
                  f"(sequential {r['sequential_ms']:.2f} ms); stage costs summed {r['predicted_ios_ms']:.2f} ms "
                  f"({r['predicted_ios_ms'] / r['searched_ms']:.2f}× the whole run)")
            print("| step | steps | stage costs, summed | measured in the whole run (medians) | ratio |")
            print("|---|---|---|---|---|")
            for kind, (n, predicted, measured) in sorted(r["kinds"].items()):
                print(f"| {kind} | {n} | {predicted:.2f} ms | {measured:.2f} ms | {predicted / measured:.2f} |")


if __name__ == "__main__":
    main()
