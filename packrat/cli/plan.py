"""`packrat plan`: the optimal instances for T cores and batch B, from a profile."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from packrat.cli.args import local_cores, topology_for

from packrat.cli.types import positive
from packrat.cli.output import gain_lines, print_plan, print_plan_table
from packrat.errors import NoPlanError
from packrat.machine.budget import cpu_budget
from packrat.planning.planner import Planner
from packrat.profiling.profiles import LATENCIES, gains, load
from packrat.settings import SETTLE_S


def add_plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="the latency-optimal instances for T threads and batch B",
                       description="Choose instances ⟨threads, batch⟩ (they may differ) whose threads sum to at "
                                   "most T and whose batches sum to B, minimising the slowest instance's "
                                   "profiled latency (exact dynamic program). Ties go to fewer instances, then "
                                   "fewer threads. The profile may come from another machine: T may exceed this "
                                   "machine's cores (cores are then numbered 0..T-1). Exit status 2 when no plan "
                                   "is possible.",
                       epilog="example: packrat plan --profile profiles/resnet50.csv --threads 16 --batch 32 --json")
    p.add_argument("--profile", type=Path, required=True, help="profile CSV written by `packrat profile`")
    p.add_argument("--threads", type=positive(int), default=None,
                   help="T, the cores to plan for (default: the cores this process may use)")
    p.add_argument("--batch", type=positive(int), default=None,
                   help="B, the batch to serve (default: every profiled batch size, as a table)")
    p.add_argument("--latency", choices=LATENCIES, default=None,
                   help="which profiled figure to plan with: loaded (measured beside copies of itself, from "
                        "`packrat profile --contention`) or isolated (measured alone) (default: the profile's "
                        "primary figure, loaded where it has one)")
    p.add_argument("--model-only", action="store_true",
                   help="plan on the model-only figures (latency_ms: the model alone) of a profile that holds served "
                        "ones too (served_ms: each sub-batch decoded, run and encoded as an instance serves it, "
                        "which plans are made on by default)")
    p.add_argument("--json", action="store_true",
                   help="print JSON: {threads, batch, expected_latency_ms, fat_latency_ms, instances: "
                        "[{threads, batch, cores, runtime}], latency: loaded|isolated, basis: served|model} (a list "
                        "of them without --batch); "
                        "runtime: inductor, openvino, onnxruntime, torch-compile or ios, the fastest the profile "
                        "measured for that ⟨threads, batch⟩; ios: [{threads, batch, ms, against, against_ms}] for "
                        "each instance shape that runs an IOS schedule, against the fastest other runtime there")
    p.add_argument("--settle", action="store_true",
                   help="where plans are within the profile's noise of each other at a batch (other runtimes, "
                        "shapes, fat instances, both kinds of a runtime), time them side by side through pools on "
                        "this machine's cores, in interleaved rounds, and print the faster as the plan, with the "
                        "verdict, as a server does before it serves (with --json: \"settled\" per plan, null where "
                        "nothing ties); T must fit this machine")
    p.add_argument("--settle-s", type=positive(float), default=SETTLE_S, metavar="S",
                   help=f"with --settle: seconds at most, in all (default {SETTLE_S:g})")
    p.add_argument("--model", default=None,
                   help="with --settle: the model to run (default: the profile's `# model:`)")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    profile = load(args.profile)
    if args.model_only:
        profile = profile.on("model")
    threads = args.threads or local_cores()
    batches = [args.batch] if args.batch else profile.batches
    latency = args.latency or profile.figures[0]
    planner = Planner(profile.items(latency), threads, max(batches), profile.runtimes)
    topology = topology_for(threads)
    plans, skipped = [], []
    for batch in batches:
        try:
            plans.append(planner.plan(threads, batch, topology))
        except NoPlanError as exc:
            if args.batch:
                raise
            skipped.append(f"B={batch}: no plan: {exc}")
    settled = settled_plans(args, profile, threads, [p.batch for p in plans]) if args.settle else {}
    plans = [settled[p.batch].plan if p.batch in settled else p for p in plans]
    if args.json:
        body = [{**p.to_json(), "latency": latency, "basis": profile.basis, "ios": ios_gains(profile, [p]),
                 **({"settled": settled[p.batch].to_json() if p.batch in settled else None} if args.settle else {})}
                for p in plans]
        print(json.dumps(body[0] if args.batch else body, indent=2))
        return 0
    if args.batch:
        print_plan(plans[0], f"{latency}, served" if profile.basis == "served" else latency)
    else:
        print(f"Plans for T={threads} threads, model {profile.metadata.get('model', '?')} ({args.profile}), "
              f"{latency} latencies, {profile.metadata['mode']} mode, "
              f"{'served figures (' + str(profile.payload) + ')' if profile.basis == 'served' else 'model-only figures'}")
        print_plan_table(plans, skipped)
    if profile.bound:
        print(f"the profile's search: {profile.bound}")
    for line in gain_lines(ios_gains(profile, plans)):
        print(line)
    for settlement in settled.values():
        print(settlement.line())
    return 0


def settled_plans(args: argparse.Namespace, profile, threads: int, batches: list[int]) -> dict:
    """B -> the settlement of the near-ties at B (serving/settling.py), on this machine's first
    `threads` cores; the progress goes to stderr."""
    from packrat.models.zoo import resolve
    from packrat.serving.settling import model_pools, settle_batches

    local = cpu_budget().topology
    if threads > local.num_cores or args.latency == "isolated":
        raise SystemExit("packrat plan --settle: it times the plans on this machine's cores, on the profile's primary "
                         f"figures: T ≤ {local.num_cores} and no --latency isolated")
    model = args.model or profile.metadata.get("model")
    if not model:
        raise SystemExit(f"packrat plan --settle: {args.profile} names no model: give --model")
    pools = model_pools(model, profile.metadata.get("mode"), max(batches))
    try:
        found = settle_batches(profile, resolve(model), pools, local.limited(threads), batches, args.settle_s,
                               say=lambda line: print(line, file=sys.stderr, flush=True))
    finally:
        pools.close()
    return {s.batch: s for s in found}


def ios_gains(profile, plans) -> list[dict]:
    """What the plans' IOS instances gained over the fastest other runtime (profiles.gains)."""
    return gains(profile, [i for plan in plans for i in plan.instances])
