"""`packrat demo`: the main job: profile, plan, plot, then serve three ways under a saturating load
and say what the table shows (its choices and sentences: packrat/bench/demo.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from packrat.bench.demo import (DEMO_BATCHES, DEMO_DURATION_S, DEMO_GRAPH_MODE, DEMO_MODEL, DEMO_ROUNDS, DEMO_USERS,
                                DEMO_WARMUP_S, demo_profile_path, print_verdict, print_where_fat, showcase_batch)
from packrat.bench.server import run_server_bench
from packrat.cli.args import local_cores
from packrat.cli.bench import bench_tokenizer
from packrat.cli.output import print_plan_table
from packrat.cli.types import int_list, positive, users_list
from packrat.models.modes import MODES
from packrat.profiling.default_profile import measure_profile


def add_demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="profile, plan, plot, then serve and load-test (the README's main job)",
                       description="The main job on a small grid: profile (cached), plan for every profiled "
                                   "batch on this machine's cores and say where the plan is fat and why, write the "
                                   "plots, then serve in TorchServe three ways (stock handler, packrat fat, packrat "
                                   "plan; side by side) at a batch size where the plan splits the cores, load them "
                                   "with closed-loop locust users in interleaved rounds, print the table and say "
                                   "what it shows.")
    p.add_argument("--model", default=DEMO_MODEL, help=f"zoo model (default: {DEMO_MODEL})")
    p.add_argument("--batches", type=int_list, default=DEMO_BATCHES,
                   help="batch sizes profiled (default: 1,2,4,8)")
    p.add_argument("--graph-mode", choices=MODES, default=DEMO_GRAPH_MODE,
                   help=f"how every server runs the model (default: {DEMO_GRAPH_MODE}; compile builds a package "
                        "per thread count and batch size first, minutes on a small machine)")
    p.add_argument("--min-time", type=positive(float), default=2.0, metavar="S",
                   help="seconds of timed runs per point (default: 2)")
    p.add_argument("--out-dir", type=Path, default=Path("out"),
                   help="where plots/ and bench/ go (default: out); the profile is profiles/MODEL.csv in compile "
                        "mode (the one serve, archive and bench use), profiles/MODE-MODEL.csv in another")
    p.add_argument("--serve-batch", type=positive(int), default=None,
                   help="batch size served (default: the largest profiled one whose plan splits the cores; the "
                        "largest if none does)")
    p.add_argument("--users", type=users_list, default=DEMO_USERS, metavar="PATTERN",
                   help="closed-loop locust users, relative to the batch size B (default: B: every batch full, "
                        "the next sent as soon as it is answered)")
    p.add_argument("--rounds", type=positive(int), default=DEMO_ROUNDS,
                   help=f"interleaved rounds of load per server, pooled (default: {DEMO_ROUNDS})")
    p.add_argument("--duration", type=positive(float), default=DEMO_DURATION_S,
                   help=f"seconds of load per round (default: {DEMO_DURATION_S:g})")
    p.add_argument("--no-serve", action="store_true", help="stop after the plots")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from packrat.codec.payloads import natural_payload
    from packrat.profiling import plots

    cores = local_cores()
    out = Path(args.out_dir)
    profile_path = demo_profile_path(args.model, args.graph_mode)
    print(f"== 1/4 profile {args.model} ({args.graph_mode} mode) on {cores} cores, batches {args.batches} "
          f"(cached in {profile_path}; delete it to measure again)")
    profile_path.parent.mkdir(parents=True, exist_ok=True)
    profile = measure_profile(args.model, profile_path, args.batches, min_time=args.min_time,
                              graph_mode=args.graph_mode)
    print(f"\n== 2/4 plan for T={cores} threads, every profiled batch")
    plans = plots.plans_per_batch(profile, cores)
    print_plan_table(plans, [])
    print_where_fat(profile, plans)
    print("\n== 3/4 plots")
    for path in plots.write_all(profile, cores, out / "plots"):
        print(f"wrote {path}")
    if args.no_serve:
        return 0
    batch = args.serve_batch or showcase_batch(plans)
    payload = natural_payload(args.model)
    tokenizer = bench_tokenizer(args.model, payload, None, payload == "text", out / "bench")
    print(f"\n== 4/4 serve in TorchServe at batch size {batch}, payload {payload}, three servers side by side "
          f"(stock handler, packrat fat, packrat plan), each loaded {args.rounds}× for {args.duration:g} s "
          "in a rotated order")
    runs = run_server_bench(args.model, [batch], profile_path, out / "bench", args.duration, args.users,
                            payload=payload, tokenizer=tokenizer, rounds=args.rounds,
                            graph_mode=profile.metadata.get("mode"), warmup_s=DEMO_WARMUP_S)
    served_plan = next((p for p in plans if p.batch == batch), None)
    if served_plan is not None:
        print_verdict([r for r in runs if r.users == runs[0].users], served_plan)
    return 0
