"""`packrat demo`: the main job: profile, plan, plot, then serve three ways under a saturating load
and say what the table shows."""

from __future__ import annotations

import argparse
from pathlib import Path

from packrat.cli import compare
from packrat.cli.args import local_cores, users_list
from packrat.cli.bench import bench_tokenizer, run_server_bench
from packrat.cli.default_profile import measure_profile
from packrat.cli.output import print_plan_table
from packrat.cli.types import int_list, positive
from packrat.models.modes import DEFAULT_MODE, MODES
from packrat.planning.planner import Plan
from packrat.profiling.profiles import Profile, default_path as default_profile_path

DEMO_MODEL = "bert_base"  # where splitting the cores pays even on two of them (README, "The two commands")
# Eager: on 2 cores, compiling BERT's packages for one thread count (batches 4, 2, 1) took 68 s,
# and compile mode needs them for every thread count and batch size: longer than the whole eager
# profile. All three servers run the same mode, so the comparison is of how the cores are used.
DEMO_GRAPH_MODE = "eager"
DEMO_BATCHES = [1, 2, 4, 8]
# B users in a closed loop: every batch full, the next one sent as soon as it is answered, so each
# server is busy all the time and a request's latency is one batch's. (2B would let stock's two
# workers run two batches at once, a split of its own, and double every latency.)
DEMO_USERS = [compare.BATCH_USERS]
DEMO_ROUNDS = 3
DEMO_DURATION_S = 12.0
DEMO_WARMUP_S = 4.0  # a few batches: eager instances have nothing to compile


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


def demo_profile_path(model: str, graph_mode: str) -> Path:
    """profiles/MODEL.csv in the default mode (the profile serve, archive and bench use), else
    profiles/MODE-MODEL.csv: a profile holds one mode, and an eager one must not replace it."""
    return default_profile_path(model, "" if graph_mode == DEFAULT_MODE else f"{graph_mode}-")


def splits(plan: Plan) -> bool:
    return len(plan.instances) > 1


def showcase_batch(plans: list[Plan]) -> int:
    """The largest batch whose plan splits the cores (the largest of all if none does)."""
    split = [p.batch for p in plans if splits(p)]
    return max(split or [p.batch for p in plans])


def why_not_split(profile: Profile, plan: Plan) -> str:
    """Why the plan for one batch keeps one instance, from the profile: halves are slower."""
    if plan.batch == 1:
        return "B=1: one request cannot be split"
    halves = profile.latency.get((plan.threads // 2, plan.batch // 2))
    if plan.threads < 2 or plan.batch % 2 or halves is None:
        return f"B={plan.batch}: no split of the profiled points is faster"
    return (f"B={plan.batch}: halves, 2×⟨{plan.threads // 2} threads, batch {plan.batch // 2}⟩, would take "
            f"{halves:.0f} ms against {plan.expected_latency_ms:.0f} ms for {plan.describe()}")


def print_where_fat(profile: Profile, plans: list[Plan]) -> None:
    kept = [p for p in plans if not splits(p)]
    if not kept:
        print("The plan splits the cores at every profiled batch.")
        return
    print(f"Where the plan keeps one instance (B={', '.join(str(p.batch) for p in kept)}), the profile predicts "
          "no gain from splitting the cores:")
    for plan in kept:
        print(f"  {why_not_split(profile, plan)}")


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "-"


def print_verdict(runs: list[compare.ServerRun], plan: Plan) -> None:
    """A plain sentence of what the table shows: the plan against fat and stock under the same load."""
    by_config = {r.config: r.load for r in runs}
    stock, fat, planned = by_config["stock"], by_config["packrat-fat"], by_config["packrat-plan"]
    if not splits(plan):
        print(f"\nAt B={plan.batch} the plan keeps one instance on this machine, so packrat plan = packrat fat "
              "here and the table shows packrat's own cost against stock; the plan table above shows where it "
              "splits the cores (--serve-batch).")
        return
    won = planned.p50_ms < fat.p50_ms and planned.throughput_rps > fat.throughput_rps
    print(f"\nWhat it shows: at B={plan.batch} the plan splits the {plan.threads} cores into {plan.describe()}, "
          f"predicted {plan.expected_latency_ms:.0f} ms a batch against {plan.fat_latency_ms:.0f} ms for fat "
          f"⟨{plan.threads} threads, batch {plan.batch}⟩. Under the same load ({runs[0].users} closed-loop users, "
          f"{runs[0].rounds} rounds) its p50 was {ratio(planned.p50_ms, fat.p50_ms)} fat's and its p99 "
          f"{ratio(planned.p99_ms, fat.p99_ms)}, and it answered {ratio(planned.throughput_rps, fat.throughput_rps)} "
          f"fat's requests per second ({ratio(planned.throughput_rps, stock.throughput_rps)} stock's): "
          + ("lower latency and more throughput from the same cores, the win packrat is for." if won else
             "not a clear win this time; on a busy machine a gap under 10 % drowns in the noise: try more --rounds."))


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
