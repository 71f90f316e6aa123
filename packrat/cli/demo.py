"""`packrat demo`: the main job: profile under every runtime, plan, plot, then serve three ways
under a saturating load and say what packrat gives (its choices and sentences: packrat/bench/demo.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from packrat.bench.demo import (AT_SCALE_BATCHES, AT_SCALE_THREADS, DEMO_BATCHES, DEMO_DURATION_S, DEMO_GRAPH_MODE,
                                DEMO_MIN_TIME_S,
                                DEMO_MODEL, DEMO_ROUNDS, DEMO_SERVE_BATCH, DEMO_USERS, DEMO_WARMUP_S, at_scale_lines,
                                careful_runtime, demo_configs, demo_profile_path, published_table, verdict)
from packrat.bench.server import run_server_bench
from packrat.cli.args import local_cores
from packrat.cli.bench import bench_tokenizer
from packrat.cli.output import print_plan_table
from packrat.cli.types import int_list, positive, users_list
from packrat.models.modes import MODES
from packrat.serving.default_profile import measure_profile


def add_demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="profile, plan, then serve three ways and say what packrat gives (the README's "
                                    "main job)",
                       description="The main job, about five minutes on 2 cores: profile the model on this machine "
                                   "under every installed runtime but torch-compile (cached), plan for every profiled batch, write the "
                                   "plots, then serve it in TorchServe three ways side by side: stock TorchServe as a "
                                   "user runs it (its handler, the eager model), a careful user's handler (one "
                                   "session of the fastest runtime the profile found, on every core, decoding in parallel) and packrat's "
                                   "plan; load them with closed-loop locust users in interleaved rounds and say what "
                                   "packrat gives against each. Last, what splitting the cores gives on 16 cores, "
                                   "planned on the Packrat authors' published table when it is at hand.")
    p.add_argument("--model", default=DEMO_MODEL, help=f"zoo model (default: {DEMO_MODEL}, a light model whose "
                                                        "runtimes differ most on a small machine)")
    p.add_argument("--batches", type=int_list, default=DEMO_BATCHES,
                   help="batch sizes profiled (default: 1,2,4,8)")
    p.add_argument("--graph-mode", choices=MODES, default=DEMO_GRAPH_MODE,
                   help=f"how inductor instances run the model (default: {DEMO_GRAPH_MODE}); stock always runs it "
                        "eager, as TorchServe's handler does")
    p.add_argument("--min-time", type=positive(float), default=DEMO_MIN_TIME_S, metavar="S",
                   help=f"seconds of timed runs per point (default: {DEMO_MIN_TIME_S:g})")
    p.add_argument("--out-dir", type=Path, default=Path("out"),
                   help="where plots/ and bench/ go (default: out); the profile is profiles/MODEL.csv in compile "
                        "mode (the one serve, archive and bench use), profiles/MODE-MODEL.csv in another")
    p.add_argument("--serve-batch", type=positive(int), default=DEMO_SERVE_BATCH,
                   help=f"batch size served (default: {DEMO_SERVE_BATCH}, with as many closed-loop users: every "
                        "batch full)")
    p.add_argument("--users", type=users_list, default=DEMO_USERS, metavar="PATTERN",
                   help="closed-loop locust users, relative to the batch size B (default: B: every batch full, "
                        "the next sent as soon as it is answered)")
    p.add_argument("--rounds", type=positive(int), default=DEMO_ROUNDS,
                   help=f"interleaved rounds of load per server, pooled (default: {DEMO_ROUNDS})")
    p.add_argument("--duration", type=positive(float), default=DEMO_DURATION_S,
                   help=f"seconds of load per round (default: {DEMO_DURATION_S:g})")
    p.add_argument("--at-scale", type=Path, default=None, metavar="CSV",
                   help="a published 16-core table (the Packrat authors' layout) to plan on at the end (default: "
                        "../shared/reference-profiles/resnet_large-batches.csv when it exists; skipped otherwise)")
    p.add_argument("--no-serve", action="store_true", help="stop after the plots")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from packrat.codec.payloads import natural_payload
    from packrat.profiling import plots

    cores = local_cores()
    out = Path(args.out_dir)
    profile_path = demo_profile_path(args.model, args.graph_mode)
    print(f"== 1/5 profile {args.model} on {cores} cores under every installed runtime but torch-compile, batches {args.batches} "
          f"(cached in {profile_path}; delete it to measure again)")
    profile_path.parent.mkdir(parents=True, exist_ok=True)
    profile = measure_profile(args.model, profile_path, sorted({*args.batches, args.serve_batch}),
                              min_time=args.min_time, graph_mode=args.graph_mode)
    print(f"\n== 2/5 plan for T={cores} threads, every profiled batch (each instance runs the fastest runtime "
          "the profile found for it)")
    plans = plots.plans_per_batch(profile, cores)
    print_plan_table(plans, [])
    print("\n== 3/5 plots")
    for path in plots.write_all(profile, cores, out / "plots"):
        print(f"wrote {path}")
    if not args.no_serve:
        serve_three_ways(args, profile, profile_path, cores, out, natural_payload(args.model))
    print("\n== 5/5 on a bigger machine")
    print("\n".join(at_scale(args.at_scale)))
    return 0


def serve_three_ways(args, profile, profile_path: Path, cores: int, out: Path, payload: str) -> None:
    batch = args.serve_batch
    careful = careful_runtime(profile, cores, batch)
    tokenizer = bench_tokenizer(args.model, payload, None, payload == "text", out / "bench")
    print(f"\n== 4/5 serve in TorchServe at batch size {batch}, payload {payload}: stock (its handler, eager), "
          f"careful (one {careful} session on {cores} cores), packrat (the plan), side by side, each loaded "
          f"{args.rounds}× for {args.duration:g} s in a rotated order")
    runs = run_server_bench(args.model, [batch], profile_path, out / "bench", args.duration, args.users,
                            payload=payload, tokenizer=tokenizer, rounds=args.rounds,
                            graph_mode=profile.metadata.get("mode"), warmup_s=DEMO_WARMUP_S,
                            configs=demo_configs(careful, args.graph_mode))
    print()
    print("\n".join(verdict([r for r in runs if r.users == runs[0].users], careful)))


def at_scale(given: Path | None) -> list[str]:
    from packrat.profiling import plots
    from packrat.profiling.profiles import load

    source = published_table(given)
    if source is None:
        return ["No published 16-core table here (--at-scale CSV: the Packrat authors' resnet_large-batches.csv); "
                "on 2 cores splitting rarely pays, and on 16 it is where packrat's plans gain most."]
    published = load(source)
    plans = [p for p in plots.plans_per_batch(published, AT_SCALE_THREADS) if p.batch in AT_SCALE_BATCHES]
    return at_scale_lines(published, plans, source)
