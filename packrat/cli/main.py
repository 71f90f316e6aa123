"""The `packrat` command: wires the commands together; each lives in its own module.

packrat/cli/NAME.py holds the command's parser, `add_NAME_parser(sub)`, beside its code,
`cmd_NAME(args)`; args.py has the argument types and groups several commands share, types.py the
light ones, output.py what they print alike. What `packrat bench` and the demo measure is the
bench stage's (packrat/bench/); the profile a command serves with when none is given,
packrat/serving/default_profile.py's. Heavy modules (torch, matplotlib, locust) are imported
only inside the commands that use them, so `packrat --help` starts fast."""

from __future__ import annotations

import argparse
import sys

from packrat.cli.archive import add_archive_parser
from packrat.cli.bench import add_bench_parser
from packrat.cli.demo import add_demo_parser
from packrat.cli.export import add_export_parser
from packrat.cli.plan import add_plan_parser
from packrat.cli.plot import add_plot_parser
from packrat.cli.profile import add_profile_parser
from packrat.cli.ready import add_ready_parser
from packrat.cli.reconfigure import add_reconfigure_parser
from packrat.cli.serve import add_serve_parser
from packrat.cli.status import add_status_parser
from packrat.cli.stop import add_stop_parser
from packrat.errors import NoPlanError, ProfileError, ProfilingError, ServeError

COMMANDS = (add_profile_parser, add_plan_parser, add_plot_parser, add_archive_parser, add_serve_parser,
            add_stop_parser, add_status_parser, add_reconfigure_parser, add_bench_parser, add_demo_parser,
            add_ready_parser, add_export_parser)  # in `packrat --help` order


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="packrat",
        description="Latency-optimal CPU inference serving: profile a model's latency L(t, b) for t threads "
                    "and batch b, then plan the instances ⟨i, t, b⟩ that serve a batch fastest on T cores.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parser in COMMANDS:
        add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ProfileError, NoPlanError, ProfilingError, ServeError, ValueError) as exc:
        print(f"packrat {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\npackrat {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
