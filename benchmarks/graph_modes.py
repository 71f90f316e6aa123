"""Graph modes side by side (issue 17): how fast each way of running a model starts and runs.

    .venv/bin/python benchmarks/graph_modes.py [--model resnet50] [--threads 2] [--batches 1,2,4]
                                               [--rounds 3] [--iters 10] [--modes eager,script,compile,torch-compile]
                                               [--json OUT]

Modes, all from the same zoo module with its seeded weights (as packrat bench peers runs them):
  eager          the nn.Module as it is
  script         TorchScript, trace + freeze + optimize_for_inference (packrat's default before 2.13)
  compile        packrat's default, prepared at the largest batch size: static AOTInductor packages
                 for it and its halving ladder, built by the first process that needs them and loaded
                 by every later one; a batch size off the ladder is padded
  torch-compile  torch.compile with freezing on, one static graph per batch size, in every process

Every measurement is a fresh process pinned to the first --threads cores. It reports its start
(process start to the model answering its first batch of every size) and, per batch size, the
median of --iters timed runs after two warm ones. Rounds run the modes in a shuffled order; the
table gives medians over rounds, and round 1's start apart: the compile caches are fresh per run
of this script, so round 1 starts cold and later rounds warm. Outputs are checked against eager's
(largest absolute difference on the largest batch).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from packrat.bench.harness import child_json, doc_parser, first_cores, fresh_compile_caches, pin
from packrat.bench.results import fmt_num, markdown_table, write_json
from packrat.bench.peers import TorchRunner
from packrat.bench.rounds import elapsed_ms, in_rounds
from packrat.cli.types import int_list, name_list

MODES = ("eager", "script", "compile", "torch-compile")


def child(model: str, mode: str, threads: int, batches: list[int], iters: int) -> dict:
    """Runs in the fresh process: start the model in `mode`, time it, return the figures."""
    started = time.perf_counter()
    pin(first_cores(threads))
    import torch

    from packrat.models.zoo import prepare, resolve

    spec = resolve(model)
    runners = {}
    with torch.inference_mode():
        # torch.compile: a graph per batch size; the others one module for every batch size
        # (compile: prepared at the largest, it loads the packages of its halving ladder too)
        shared = None if mode == "torch-compile" else TorchRunner(spec, max(batches), mode).module
        for batch in batches:
            runners[batch] = shared or TorchRunner(spec, batch, mode).module
            runners[batch](*spec.example_inputs(batch))
        start_s = time.perf_counter() - started
        latency_ms, outputs = {}, {}
        for batch in batches:
            example = spec.example_inputs(batch)
            outputs[batch] = runners[batch](*example)
            runners[batch](*example)  # the second warm run
            latency_ms[batch] = statistics.median(elapsed_ms(lambda: runners[batch](*example)) for _ in range(iters))
        reference = prepare(spec, batches[-1], graph_mode=False)[0](*spec.example_inputs(batches[-1]))
        error = float((outputs[batches[-1]] - reference).abs().max())
    return {"start_s": start_s, "latency_ms": latency_ms, "max_abs_diff": error}


def summarise(results: dict[str, list[dict]], batches: list[int]) -> dict[str, dict]:
    summary = {}
    for mode, runs in results.items():
        good = [r for r in runs if "error" not in r]
        if not good:
            summary[mode] = {"error": runs[0]["error"]}
            continue
        summary[mode] = {
            "first_start_s": runs[0].get("start_s"),
            "later_start_s": statistics.median([r["start_s"] for r in good[1:]]) if len(good) > 1 else None,
            "latency_ms": {b: statistics.median([r["latency_ms"][str(b)] for r in good]) for b in batches},
            "max_abs_diff": max(r["max_abs_diff"] for r in good),
        }
    return summary


def markdown(summary: dict[str, dict], batches: list[int]) -> str:
    head = ["mode", "start, round 1 s", "start, later rounds s", *[f"b={b} ms" for b in batches],
            *[f"b={b} vs script" for b in batches], "max |Δ| vs eager"]
    script = summary.get("script", {}).get("latency_ms")
    rows = []
    for mode, row in summary.items():
        if "error" in row:
            rows.append([mode, row["error"]])
            continue
        ratios = [f"{row['latency_ms'][b] / script[b]:.2f}×" if script else "" for b in batches]
        rows.append([mode, fmt_num(row["first_start_s"]), fmt_num(row["later_start_s"]),
                     *(f"{row['latency_ms'][b]:.1f}" for b in batches), *ratios, f"{row['max_abs_diff']:.1e}"])
    return markdown_table(head, rows)


def parser() -> argparse.ArgumentParser:
    p = doc_parser(__doc__)
    p.add_argument("--model", default="resnet50", help="zoo model (default resnet50)")
    p.add_argument("--threads", type=int, default=2, help="cores and torch threads per process (default 2)")
    p.add_argument("--batches", type=int_list, default=[1, 2, 4], help="batch sizes (default 1,2,4)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each running every mode once (default 3)")
    p.add_argument("--iters", type=int, default=10, help="timed runs per batch size (default 10)")
    p.add_argument("--modes", type=name_list(MODES, "mode"), default=list(MODES), help=f"comma list (default {','.join(MODES)})")
    p.add_argument("--seed", type=int, default=0, help="seed for the round orders (default 0)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write every figure here")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.child:
        print(json.dumps(child(args.model, args.child, args.threads, args.batches, args.iters)))
        return 0
    modes = args.modes
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="packrat-graph-modes-") as scratch:
        env = fresh_compile_caches(Path(scratch))
        results: dict[str, list[dict]] = {mode: [] for mode in modes}
        for round_index, mode in in_rounds(modes, args.rounds, rng):
            result = child_json([sys.executable, __file__, "--child", mode, "--model", args.model, "--threads",
                                 str(args.threads), "--batches", ",".join(map(str, args.batches)), "--iters",
                                 str(args.iters)], env=env)
            results[mode].append(result)
            print(f"round {round_index} {mode}: {result}", flush=True)
    summary = summarise(results, args.batches)
    table = markdown(summary, args.batches)
    print(f"\n{args.model}, {args.threads} threads, medians over {args.rounds} rounds\n\n{table}")
    if args.json:
        write_json(args.json, {"args": vars(args), "runs": results, "summary": summary, "markdown": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
