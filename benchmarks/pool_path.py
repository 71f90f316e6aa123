"""Where a sub-batch's time goes on its way through the pool, stage by stage, for one or more code
trees side by side (this one, and e.g. a checkout of an earlier commit), and against the profile.

    .venv/bin/python benchmarks/pool_path.py [--model squeezenet] [--batches 1,4,8] [--payloads raw,jpeg]
                                             [--runtime onnxruntime | --profile CSV [--model-only-too]] [--cores N]
                                             [--batches-per-run 150] [--rounds 3] [--tree DIR ...] [--json OUT]

Each run is a fresh pinned process answering --batches-per-run whole batches of B through an
InstancePool: the batch's median wall time and the pool's stage medians. The instances are one per
core of --runtime, or with --profile the plan for (cores, B) and its prediction (--model-only-too:
beside it the plan the model-only figures give). --tree DIR runs DIR's packrat too (a `git
worktree` of an earlier commit), the trees interleaved in shuffled rounds."""
from __future__ import annotations

import json
import os
import random
import statistics
import sys
from pathlib import Path

# Nothing of packrat or benchmarks.common is imported here: a child runs its tree's packrat (PYTHONPATH).
ROOT = Path(__file__).resolve().parents[1]
RESULT = "POOL-PATH-RESULT "
STAGES = ("queue", "copy", "send", "wake", "locks", "decode", "model", "encode", "reply", "hand_out", "total")
PAYLOADS = ("raw", "jpeg", "text")


# ---- the child: one tree, one payload, one B ------------------------------------------------------

def child(config: dict) -> dict:
    """Run in a fresh process: the pool of `config["instances"]` answering batches of `config["batch"]`."""
    import time

    try:
        from packrat.codec.payloads import build_payload
    except ImportError:  # a tree from before issue 41 kept them in the bench stage
        from packrat.bench.payloads import build_payload
    from packrat.serving.pool.api import InstanceConfig, ModelConfig, Request
    from packrat.serving.pool.instance_pool import InstancePool

    os.sched_setaffinity(0, config["cores"])
    body, kind = build_payload(config["model"], config["payload"])
    requests = [Request(body, kind) for _ in range(config["batch"])]
    instances = [InstanceConfig(i["threads"], i["batch"], tuple(i["cores"]), 0, i.get("expected_ms"),
                                i.get("runtime", "inductor")) for i in config["instances"]]
    with InstancePool(ModelConfig(config["model"]), instances) as pool:
        for _ in range(config["warmup"]):
            answered(pool, requests)
        pool.stages.clear()
        walls = []
        for _ in range(config["runs"]):
            started = time.perf_counter()
            answered(pool, requests)
            walls.append((time.perf_counter() - started) * 1e3)
        return {"wall_ms": statistics.median(walls), "stages_ms": pool.stages.medians(), "runs": len(walls),
                "describe": pool.describe()}


def answered(pool, requests) -> None:
    answers = pool.infer(requests)
    failed = [a for a in answers if a.status != 200]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(answers)} requests failed: {failed[0].reason}")


# ---- the parent -------------------------------------------------------------------------------------

def plans_for(args, batch: int, cores: list[int]) -> dict[str, tuple[list[dict], float | None, str]]:
    """The instances at B by name ("fixed", the profile's "plan", "model-only plan"), each predicted and described."""
    if args.profile is None:
        return {"fixed": ([{"threads": len(cores), "batch": batch, "cores": cores, "runtime": args.runtime}], None,
                          f"1×⟨{len(cores)}, {batch}, {args.runtime}⟩")}
    from packrat.machine.topology import detect
    from packrat.planning.planner import Planner
    from packrat.profiling.profiles import load

    profile = load(args.profile)
    bases = {"plan": profile} | ({"model-only plan": profile.on("model")} if args.model_only_too else {})
    plans = {}
    for name, basis in bases.items():
        plan = Planner(basis.items(), len(cores), batch, basis.runtimes).plan(len(cores), batch, detect(set(cores)))
        # what the served figures predict for it (a model-only plan's own figure leaves decoding out)
        served = profile.on("served").points() if profile.has_served else None
        served_ms = (max(served[i.threads, i.batch, i.runtime] for i in plan.instances) if served
                     else plan.expected_latency_ms)
        plans[name] = ([{"threads": i.threads, "batch": i.batch, "cores": list(i.cores), "expected_ms": i.latency_ms,
                         "runtime": i.runtime} for i in plan.instances], served_ms, plan.describe())
    return plans


def run_one(tree: str, config: dict, timeout: float) -> dict:
    from packrat.bench.harness import child_json

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p)}
    command = [sys.executable, __file__, "--child", json.dumps(config)]
    return child_json(command, marker=RESULT, env=env, cwd=tree, timeout=timeout)


def summarise(results: list[dict]) -> dict:
    """A cell's rounds: the medians of their wall and stage medians, and the rounds' spread."""
    good = [r for r in results if "error" not in r]
    if not good:
        return {"error": results[-1]["error"]}
    walls = [r["wall_ms"] for r in good]
    stages = {stage: statistics.median(r["stages_ms"].get(stage, 0.0) for r in good) for stage in STAGES}
    return {"wall_ms": statistics.median(walls), "wall_range_ms": [min(walls), max(walls)], "stages_ms": stages,
            "rounds": len(good), "describe": good[0]["describe"]}


def table(summary: dict) -> str:
    from packrat.bench.results import fmt_num, markdown_table, with_spread

    rows = []
    for key, cell in summary.items():
        tree, plan_name, payload, batch = key.split("|")
        if "error" in cell:
            rows.append([tree, plan_name, payload, batch, cell["error"]] + [""] * (len(STAGES) + 2))
            continue
        predicted = cell.get("predicted_ms")
        rows.append([tree, f"{plan_name}: {cell['describe']}", payload, batch,
                     with_spread(cell["wall_ms"], cell["wall_range_ms"]),
                     fmt_num(predicted, 2),
                     fmt_num(cell["wall_ms"] / predicted, 2) if predicted else "-"]
                    + [fmt_num(cell["stages_ms"][s], 3) for s in STAGES])
    return markdown_table(["tree", "instances", "payload", "B", "wall ms (rounds)", "predicted", "served / predicted",
                           *STAGES], rows)


def parser():
    from packrat.bench.harness import doc_parser
    from packrat.cli.types import int_list, name_list

    p = doc_parser(__doc__)
    p.add_argument("--model", default="squeezenet")
    p.add_argument("--batches", type=int_list, default=[1, 4, 8])
    p.add_argument("--payloads", type=name_list(PAYLOADS, "payload"), default=["raw", "jpeg"])
    p.add_argument("--runtime", default="onnxruntime", help="the one fat instance's runtime (without --profile)")
    p.add_argument("--profile", type=Path, default=None, help="serve the plan this profile gives at each B")
    p.add_argument("--model-only-too", action="store_true",
                   help="with --profile: also serve the plan of its model-only figures (predicted: what its "
                        "served figures say of that plan)")
    p.add_argument("--cores", type=int, default=None, help="the first N cores this process may use (default: all)")
    p.add_argument("--batches-per-run", type=int, default=150)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tree", action="append", default=[], metavar="DIR",
                   help="another checkout to measure beside this one (repeatable)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", type=Path, default=None)
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:  # a run, in a fresh process of its own
        print(RESULT + json.dumps(child(json.loads(argv[1]))), flush=True)
        return 0
    from packrat.bench.harness import first_cores
    from packrat.bench.results import fmt_num

    args = parser().parse_args(argv)
    cores = first_cores(args.cores or len(os.sched_getaffinity(0)))
    trees = [str(ROOT)] + [str(Path(t).resolve()) for t in args.tree]
    cells, predicted = {}, {}
    for batch in args.batches:
        for plan_name, (instances, expected, describe) in plans_for(args, batch, cores).items():
            print(f"B = {batch}, {plan_name}: {describe}" + (f", predicted {expected:.2f} ms" if expected else ""),
                  flush=True)
            for tree in trees:
                for payload in args.payloads:
                    key = (tree, plan_name, payload, batch)
                    predicted[key] = expected
                    cells[key] = {"model": args.model, "payload": payload, "batch": batch, "instances": instances,
                                  "cores": cores, "warmup": args.warmup, "runs": args.batches_per_run}
    results: dict = {key: [] for key in cells}
    for round_index in range(args.rounds):
        order = list(cells)
        random.Random(round_index).shuffle(order)
        for key in order:
            result = run_one(key[0], cells[key], args.timeout)
            results[key].append(result)
            name = "this tree" if key[0] == trees[0] else key[0]
            print(f"round {round_index + 1}/{args.rounds} {name} {key[1]} {key[2]} B={key[3]}: "
                  f"{result.get('error') or fmt_num(result['wall_ms'], 2) + ' ms'}", flush=True)
    summary = {}
    for key, runs in results.items():
        tree, plan_name, payload, batch = key
        cell = summarise(runs)
        if predicted[key]:
            cell["predicted_ms"] = predicted[key]
        name = Path(tree).name if tree != trees[0] else "this"
        summary["|".join((name, plan_name, payload, str(batch)))] = cell
    print(f"\n{args.model}, cores {cores}, medians over {args.rounds} round(s) of each run's median of "
          f"{args.batches_per_run} batches (stages: medians)\n")
    print(table(summary))
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "cores": cores, "cells": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
