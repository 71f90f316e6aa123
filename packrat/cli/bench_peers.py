"""`packrat bench peers`: packrat's plan against one in-process session of each installed runtime,
side by side on the same cores (the measuring: packrat/bench/peers.py, peer_runners.py, peers_report.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from packrat.cli.args import doc_subparser
from packrat.cli.types import int_list, name_list, positive
from packrat.settings import SETTLE_S


def add_peers_parser(sub) -> None:
    from packrat.bench import peer_runners, peers

    p = doc_subparser(sub, "peers", "the plan against what a user would run instead, side by side", peers.__doc__, (
        "packrat bench peers --model resnet50 --batches 1,4",
        "packrat bench peers --model squeezenet --batches 8 --rounds 10 --peers packrat,onnxruntime"))
    count = positive(int)
    p.add_argument("--model", default="resnet50", help="zoo model (default resnet50; e.g. bert_base, tiny)")
    p.add_argument("--batches", type=int_list, default=[1, 4, 8], help="batch sizes B (default 1,4,8)")
    p.add_argument("--cores", type=count, default=None, metavar="N",
                   help="T: the first N physical cores of this process (default: all of them)")
    p.add_argument("--rounds", type=count, default=3, help="interleaved rounds at each B, each timing every peer once (default 3)")
    p.add_argument("--iters", type=count, default=10, help="timed batches per peer and B in a round (default 10)")
    p.add_argument("--warmup", type=positive(int, zero=True), default=2,
                   help="untimed batches per peer at each B after its setup's first one (default 2)")
    p.add_argument("--peers", type=name_list(peer_runners.PEERS, "peer"),
                   default=[n for n in peer_runners.PEERS if n != "packrat-later"],
                   help=f"comma list (default: all: {','.join(peer_runners.PEERS)}; packrat-later only with --later-profile, "
                        "which adds it)")
    p.add_argument("--profile", type=Path, default=None,
                   help="packrat's profile CSV, as `packrat profile` writes it (default profiles/MODEL.csv)")
    p.add_argument("--later-profile", type=Path, default=None, metavar="CSV",
                   help="a second profile of the model (e.g. taken an hour after --profile): the peer packrat-later "
                        "serves its plans, beside packrat's")
    p.add_argument("--served-corrections", type=Path, default=None, metavar="FILE",
                   help="an engine's served-latency file (served_correction.py --served-dir, or the engine's own): "
                        "packrat-later plans on the later profile (default --profile) corrected by it")
    p.add_argument("--latency", choices=("loaded", "isolated"), default=None,
                   help="which profiled figure to plan with (default: the profile's primary one)")
    p.add_argument("--packrat-mode", choices=("compile", "script", "eager"), default=None,
                   help="graph mode of packrat's and fat's instances (default: the profile's mode)")
    p.add_argument("--ort-parallel-threads", type=thread_counts, default="T:1", metavar="INTER:INTRA",
                   help="onnxruntime-parallel's inter-op and intra-op threads, T for the cores (default T:1)")
    p.add_argument("--settle-s", type=positive(float, zero=True), default=SETTLE_S, metavar="S",
                   help="packrat's plan as an engine serves it: where plans tie within the profile's noise at a B, "
                        f"they are timed side by side first and the faster measured, within S seconds in all "
                        f"(default {SETTLE_S:g}; 0: the profile's plan as it is)")
    p.add_argument("--seed", type=int, default=0, help="seed of the rounds' orders (default 0)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one request to a peer's process may take: a setup, or a round (default 3600)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write every figure here")
    p.add_argument("--keep-caches", action="store_true", help="this environment's compile caches, not fresh ones: "
                   "setups load what an earlier run built (the tests' smoke run shares the suite's)")
    p.set_defaults(func=cmd_peers)


def thread_counts(text: str) -> tuple[int | None, int | None]:
    """argparse type for --ort-parallel-threads INTER:INTRA: each a count >= 1, or T (None: the cores)."""
    try:
        counts = tuple(None if part.strip().upper() == "T" else int(part) for part in text.split(":"))
    except ValueError:
        counts = ()
    if len(counts) != 2 or any(n is not None and n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: expected INTER:INTRA, thread counts >= 1 or T, e.g. T:1 or 2:1")
    return counts


def cmd_peers(args: argparse.Namespace) -> int:
    from packrat.bench import peers

    return peers.run(args)
