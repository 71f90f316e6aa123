"""`packrat bench multi-model`: several models on one machine, packrat's node plan against stock
TorchServe, a server per model and a static split (the measuring: packrat/bench/multi_model_run.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from packrat.cli.args import doc_subparser
from packrat.cli.types import name_list, positive


def add_multi_model_parser(sub) -> None:
    from packrat.bench import multi_model_run
    from packrat.bench.multi_model_run import CONFIGS

    p = doc_subparser(sub, "multi-model", "several models on one machine: the node plan against the others",
                      multi_model_run.__doc__)
    p.add_argument("--part", choices=("targets", "mix", "both"), default="both", help="default: both")
    p.add_argument("--configs", type=name_list(CONFIGS, "configuration"), default=list(CONFIGS),
                   help=f"default: {','.join(CONFIGS)}")
    p.add_argument("--pair", type=name_list(), default=["resnet50", "squeezenet"],
                   help="the targets' two models (default: resnet50,squeezenet)")
    p.add_argument("--mix", type=name_list(), default=["resnet50", "bert_base", "squeezenet"],
                   help="the mix's models (default: resnet50,bert_base,squeezenet)")
    p.add_argument("--users", type=positive(int), default=4, help="closed-loop users of a loaded model (default: 4)")
    p.add_argument("--light-users", type=positive(int), default=1, help="users of a model in its light phase (mix)")
    p.add_argument("--batch-size", type=positive(int), default=4, help="each archive's batch size (default: 4)")
    p.add_argument("--max-batch-delay", type=positive(int), default=30, metavar="MS", help="default: 30")
    p.add_argument("--seconds", type=float, default=20.0, help="the targets' measured seconds per phase")
    p.add_argument("--phase-s", type=float, default=60.0, help="the mix's seconds per phase")
    p.add_argument("--settle-s", type=float, default=10.0,
                   help="seconds of each phase left out of its statistics (default: 10)")
    p.add_argument("--alone-s", type=float, default=20.0, help="seconds each model is measured alone")
    p.add_argument("--rounds", type=positive(int), default=3, help="rounds, each running alone and every "
                   "configuration once in a rotated order (default 3)")
    p.add_argument("--out", type=Path, default=Path("out/multi_model"), help="default: out/multi_model")
    p.set_defaults(func=cmd_multi_model)


def cmd_multi_model(args: argparse.Namespace) -> int:
    from packrat.bench import multi_model_run

    if len(args.pair) != 2:
        raise SystemExit("--pair names two models")
    return multi_model_run.run(args)
