"""`packrat bench chaos`: faults injected into packrat-served TorchServe under load, or a soak run
(the serving, the faults and the report: packrat/bench/chaos.py and chaos_faults.py)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from packrat.bench import chaos  # light: the load test, torch and the rest come with chaos.run
from packrat.cli.args import doc_subparser
from packrat.cli.types import name_list, positive, users_list

# packrat.codec.payloads.PAYLOAD_KINDS, in its order (importing it imports torch; tests/test_chaos.py checks them)
PAYLOADS = ("raw", "json", "jpeg", "text")


def one_users_pattern(text: str):
    patterns = users_list(text)
    if len(patterns) != 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one users pattern, like 8 or 2B")
    return patterns[0]


parse_faults = name_list(chaos.FAULT_KINDS, "fault")  # argparse type: "kill,stop" -> ["kill", "stop"]


def add_chaos_parser(sub) -> None:
    p = doc_subparser(sub, "chaos", "faults injected into packrat-served TorchServe under load, or a soak run",
                      chaos.__doc__, (
                          "packrat bench chaos --handler stock --faults worker      # what stock TorchServe loses",
                          "packrat bench chaos --soak --duration 600                 # no faults: leaks over time",
                          "packrat bench chaos --model tiny --duration 20 --every 5 --faults kill   # smoke run"))
    number, count = positive(float), positive(int)
    p.add_argument("--model", default="resnet50", help="zoo model (default resnet50; tiny for a smoke run)")
    p.add_argument("--batch-size", type=count, default=4, help="TorchServe's batch size B, planned for (default 4)")
    p.add_argument("--users", type=one_users_pattern, default="2B",
                   help="locust users: a count, or a multiple of B like 2B (default 2B)")
    p.add_argument("--duration", type=number, default=300.0, help="seconds of load after the warm-up (default 300)")
    p.add_argument("--warmup", type=number, default=10.0, help="seconds of locust warm-up (default 10)")
    p.add_argument("--every", type=number, default=15.0, help="seconds between faults (default 15)")
    p.add_argument("--faults", type=parse_faults, default=list(chaos.FAULT_KINDS),
                   help=f"comma list, cycled (default all: {','.join(chaos.FAULT_KINDS)})")
    p.add_argument("--stop-s", type=number, default=20.0, help="how long a stop fault keeps SIGSTOP (default 20)")
    p.add_argument("--replace-wait", type=number, default=10.0,
                   help="double-kill: the longest wait for the replacement to appear (default 10, at most --every)")
    p.add_argument("--request-timeout", type=number, default=120.0,
                   help="the server's deadline per request (archive request_timeout_s; default 120)")
    p.add_argument("--client-timeout", type=number, default=None,
                   help="how long a locust user waits for an answer (default: --request-timeout + 60 s)")
    p.add_argument("--handler", choices=("packrat", "stock"), default="packrat",
                   help="packrat (default) or TorchServe's stock handler (only the worker fault applies)")
    p.add_argument("--plan", choices=("auto", "fat"), default="auto", help="packrat plan (default auto)")
    p.add_argument("--profile", type=Path, help="profile CSV (default profiles/MODEL.csv, measured when missing)")
    p.add_argument("--payload", choices=PAYLOADS, default="jpeg", help="request body (default jpeg)")
    p.add_argument("--max-batch-delay", type=count, default=100, help="TorchServe maxBatchDelay ms (default 100)")
    p.add_argument("--soak", action="store_true", help="soak mode: steady load, no faults, samples over time")
    p.add_argument("--sample-every", type=number, default=30.0, help="seconds between resource samples (default 30)")
    p.add_argument("--grace", type=number, default=15.0,
                   help="after stop, how long leftovers may take to go before they count (default 15)")
    p.add_argument("--seed", type=int, default=0, help="seed for choosing victims (default 0)")
    p.add_argument("--out", type=Path, default=Path("out/chaos"), help="run directories (default out/chaos)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the report (figures and markdown) here")
    p.set_defaults(func=cmd_chaos)


def cmd_chaos(args: argparse.Namespace) -> int:
    from packrat.bench.results import write_json

    if args.handler == "stock" and not args.soak and set(args.faults) - set(chaos.STOCK_FAULTS):
        raise SystemExit(f"--handler stock has no pool: only --faults {','.join(chaos.STOCK_FAULTS)} applies")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop the server
    report = chaos.run(args)
    report["markdown"] = chaos.format_report(report)
    print(report["markdown"])
    if args.json:
        write_json(args.json, report)
        chaos.log(f"report written to {args.json}")
    return 0
