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

import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from ios_scheduler.api import optimize, sequential_schedule
from ios_scheduler.graph import capture
from ios_scheduler.runtime import ScheduledModule
from packrat.models.zoo import resolve

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import elapsed_ms, markdown_head, markdown_row, networks_parser, shuffled_rounds


def step_kind(module: ScheduledModule, step: int) -> str:
    kind, split = module.step_kinds[step]
    if kind == "merge":
        return "merged convolutions"
    if split == (module.schedule.threads,):
        return "full-width operators"
    return f"{len(split)} groups on {'+'.join(map(str, split))} threads"


def study(model: str, batch: int, threads: int, rounds: int) -> dict:
    spec = resolve(model)
    module, x = spec.build().eval(), spec.example_input(batch)
    started = time.perf_counter()
    schedule = optimize(module, (x,), threads, progress=False, name=model, check=False)
    seconds = time.perf_counter() - started
    graph = capture(module, (x,))
    searched = ScheduledModule(graph.module, schedule)
    searched.plain = False
    sequential = ScheduledModule(graph.module, sequential_schedule(graph, threads, batch, model))
    steps: list[list[float]] = [[] for _ in searched.step_stages]
    whole: dict[str, list[float]] = {"searched": [], "sequential": []}
    with torch.inference_mode():
        for _ in range(3):
            searched(x), sequential(x)
        # whole runs and step-timed runs in shuffled order
        for _, job in shuffled_rounds(["steps", "searched", "sequential"], rounds, random):
            if job == "steps":
                for i, ms in enumerate(searched.step_times(x)):
                    steps[i].append(ms)
            else:
                run = searched if job == "searched" else sequential
                whole[job].append(elapsed_ms(lambda: run(x)))
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
    parser = networks_parser(__doc__, models="inception_v3,randwire")
    parser.add_argument("--json", action="store_true", help="one JSON line per network and batch instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    random.seed(0)
    for model in args.models:
        for batch in args.batches:
            r = study(model, batch, args.threads, args.rounds)
            if args.json:
                print(json.dumps(r), flush=True)
                continue
            print(f"\n{model}, batch {batch}: search {r['search_s']} s; whole run {r['searched_ms']:.2f} ms "
                  f"(sequential {r['sequential_ms']:.2f} ms); stage costs summed {r['predicted_ios_ms']:.2f} ms "
                  f"({r['predicted_ios_ms'] / r['searched_ms']:.2f}× the whole run)")
            print(markdown_head(["step", "steps", "stage costs, summed", "measured in the whole run (medians)",
                                 "ratio"]))
            for kind, (n, predicted, measured) in sorted(r["kinds"].items()):
                print(markdown_row([kind, n, f"{predicted:.2f} ms", f"{measured:.2f} ms",
                                    f"{predicted / measured:.2f}"]))


if __name__ == "__main__":
    main()
