"""`packrat bench oracle`: the planner's choices against every configuration worth timing, side by
side through the pool (the measuring and the verdicts: packrat/bench/oracle.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from packrat.cli.args import doc_subparser
from packrat.cli.types import int_list, positive
from packrat.models.runtimes import IOS_CACHE


def add_oracle_parser(sub) -> None:
    from packrat.bench import harness, oracle, oracle_configs
    from packrat.cli.profile import runtime_list

    p = doc_subparser(sub, "oracle", "the plan against every configuration worth timing, side by side", oracle.__doc__, (
        "packrat bench oracle --model resnet50 --batches 1,2,4,8,16 --dry-run   # configurations, estimate",
        "packrat bench oracle --model resnet50 --batches 4,8 --rounds 10",
        "packrat bench oracle --model bert_base --batches 1,2,4,8 --json out/bert-a.json",
        "packrat bench oracle --model bert_base --batches 16 --json out/bert-b.json",
        "packrat bench oracle --merge out/bert-a.json out/bert-b.json"))
    count, some = positive(int), positive(int, zero=True)
    p.add_argument("--model", default="resnet50", help="zoo name, as for `packrat profile` (default: resnet50)")
    p.add_argument("--batches", type=int_list, default=[1, 2, 4, 8, 16],
                   help="batch sizes B (default 1,2,4,8,16)")
    p.add_argument("--threads", type=count, default=None,
                   help="T, the cores to use: the first T of this process's cores (default: all of them)")
    p.add_argument("--rounds", type=count, default=10, help="interleaved rounds (default: 10)")
    p.add_argument("--warmup", type=some, default=1, help="untimed calls per configuration before the rounds (default: 1)")
    p.add_argument("--max-configs", type=count, default=oracle_configs.MAX_CONFIGS,
                   help=f"at most this many configurations per B beyond those always timed (default: "
                        f"{oracle_configs.MAX_CONFIGS}; see above)")
    p.add_argument("--family", choices=oracle_configs.FAMILIES, default="all",
                   help=f"all (every feasible one, up to the bound above; the default) or identical "
                        f"({oracle_configs.IDENTICAL_TEXT})")
    p.add_argument("--runtimes", type=runtime_list, default=None, metavar="LIST",
                   help="time each candidate under each of these runtimes (every instance running it), and each "
                        "one's fat instance (default: the runtimes the profile measured, installed here)")
    p.add_argument("--profile", type=Path, default=None,
                   help="profile CSV, as `packrat profile` writes it (default: profiles/MODEL.csv)")
    p.add_argument("--ios-cache", type=Path, default=IOS_CACHE,
                   help=f"where the profile's IOS schedules are kept (default: {IOS_CACHE}); IOS configurations are "
                        "timed only where the profile has the ios runtime's point")
    p.add_argument("--json", type=Path, default=None, help="every figure, written after each B (default: "
                                                           "out/oracle-MODEL.json)")
    p.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                   help="measure nothing: one report of these runs' JSON (with --profile: that profile's choices)")
    p.add_argument("--seed", type=int, default=0, help="seed of the rounds' shuffles (default: 0)")
    p.add_argument("--memory-mib", type=positive(float), default=None, metavar="MIB",
                   help="memory one B's pools may hold, resident (default: until what is free falls under "
                        f"{harness.MEMORY_RESERVE_MIB} MiB); the rest start in later groups")
    p.add_argument("--dry-run", action="store_true",
                   help="print the configurations, the planner's choices and the estimate; measure nothing")
    p.add_argument("--verbose", action="store_true", help="also list every configuration to be timed")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_oracle)


def cmd_oracle(args: argparse.Namespace) -> int:
    from packrat.bench import oracle

    if args.merge:
        return oracle.report_merged(args.merge, args.profile, args.json)
    try:
        return oracle.run(args)
    except KeyboardInterrupt:
        print("\ninterrupted: the batch sizes finished so far are in the JSON file", file=sys.stderr)
        return 130
