"""`packrat demo`: the main job: profile, plan, plot, then serve three ways under load and compare."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from packrat.cli.args import local_cores

from packrat.cli.types import int_list, positive
from packrat.cli.bench import bench_tokenizer, run_server_bench
from packrat.cli.default_profile import measure_profile
from packrat.profiling.profiles import default_path as default_profile_path
from packrat.cli.output import print_plan_table


def add_demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="profile, plan, plot, then serve and load-test (the README's main job)",
                       description="The main job on a small grid: profile (cached), plan for every profiled "
                                   "batch on this machine's cores, print the plans, write the plots, then serve "
                                   "in TorchServe (stock, fat, plan) under a short locust load and print the table.")
    p.add_argument("--model", default="resnet50", help="zoo model (default: resnet50)")
    p.add_argument("--batches", type=int_list, default=[1, 2, 4, 8],
                   help="batch sizes (default: 1,2,4,8)")
    p.add_argument("--min-time", type=positive(float), default=2.0, metavar="S",
                   help="seconds of timed runs per point (default: 2)")
    p.add_argument("--out-dir", type=Path, default=Path("out"),
                   help="where plots/ and bench/ go (default: out); the profile is profiles/MODEL.csv, as for "
                        "serve, archive and bench")
    p.add_argument("--serve-batch", type=positive(int), default=4, help="batch size served (default: 4)")
    p.add_argument("--duration", type=positive(float), default=15.0, help="seconds of load per run (default: 15)")
    p.add_argument("--no-serve", action="store_true", help="stop after the plots")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from packrat.codec.payloads import natural_payload
    from packrat.profiling import plots

    cores = local_cores()
    out = Path(args.out_dir)
    profile_path = default_profile_path(args.model)
    legacy = out / "profiles" / f"{args.model}.csv"  # where the demo kept it before
    if legacy.exists() and not profile_path.exists():
        profile_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(legacy, profile_path)
        print(f"copied the profile cache {legacy} to {profile_path}, where serve, archive and bench find it too")
    print(f"== 1/4 profile {args.model} on {cores} cores, batches {args.batches} "
          f"(cached in {profile_path}; delete it to measure again)")
    profile_path.parent.mkdir(parents=True, exist_ok=True)
    profile = measure_profile(args.model, profile_path, args.batches, min_time=args.min_time)
    print(f"\n== 2/4 plan for T={cores} threads, every profiled batch")
    plans = plots.plans_per_batch(profile, cores)
    print_plan_table(plans, [])
    print("\n== 3/4 plots")
    for path in plots.write_all(profile, cores, out / "plots"):
        print(f"wrote {path}")
    if args.no_serve:
        return 0
    payload = natural_payload(args.model)
    tokenizer = bench_tokenizer(args.model, payload, None, payload == "text", out / "bench")
    print(f"\n== 4/4 serve in TorchServe and load with locust at batch size {args.serve_batch}, payload {payload}: "
          "stock handler, packrat fat plan, packrat plan")
    return run_server_bench(args.model, [args.serve_batch], profile_path, out / "bench", args.duration, None,
                            payload=payload, tokenizer=tokenizer)
