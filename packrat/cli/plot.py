"""`packrat plot`: a profile's heat-map and planned vs fat latency per batch."""

from __future__ import annotations

import argparse
from pathlib import Path

from packrat.cli.types import positive
from packrat.profiling.profiles import load


def add_plot_parser(sub) -> None:
    p = sub.add_parser("plot", help="PNG heat-map of L(t, b) and planned vs fat latency per batch",
                       epilog="example: packrat plot --profile profiles/resnet50.csv --threads 2 --out plots")
    p.add_argument("--profile", type=Path, required=True, help="profile CSV")
    p.add_argument("--threads", type=positive(int), default=None,
                   help="T for the planned-vs-fat plot (default: the largest profiled thread count)")
    p.add_argument("--out", type=Path, default=Path("plots"), help="output directory (default: plots)")
    p.set_defaults(func=cmd_plot)


def cmd_plot(args: argparse.Namespace) -> int:
    from packrat.profiling import plots

    profile = load(args.profile)
    threads = args.threads or max(profile.threads)
    for path in plots.write_all(profile, threads, args.out):
        print(f"wrote {path}")
    return 0
