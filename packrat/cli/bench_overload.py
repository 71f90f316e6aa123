"""`packrat bench overload`: one served model offered more than it can serve, open loop; what it
answers, how fast it refuses, whether it recovers and its health answers in time, over --runs runs
on one started server; or --soak: steady load with bursts and instance kills, its resources
sampled (the measuring: packrat/bench/overload.py, overload_report.py and soak.py)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from packrat.bench import overload, soak  # light: the servers and the load test come with run() and run_soak()
from packrat.bench.harness import log
from packrat.bench.overload_report import format_report
from packrat.bench.servers import ENGINES
from packrat.cli.args import doc_subparser, model_args, tokenizer_path
from packrat.cli.types import positive
from packrat.settings import ADMISSIONS, INSTANCE_KINDS, MAX_QUEUE


def add_overload_parser(sub) -> None:
    p = doc_subparser(sub, "overload", "open-loop overload at a multiple of capacity: 200 or 503, in time",
                      overload.__doc__, (
                          "packrat bench overload --model resnet50 --json out/overload.json",
                          "packrat bench overload --model resnet50 --slow --admission queue   # the old fixed bound",
                          "packrat bench overload --model squeezenet --payload v2-binary --runs 5 --json out/o.json",
                          "packrat bench overload --model squeezenet --payload v2-json --soak 30 --instance-kind process",
                          "packrat bench overload --model tiny --capacity-s 3 --duration 5   # smoke run",
                          "packrat bench overload --model tiny --soak 1 --soak-every 20 --sample-every 5 --duration 5"))
    number, count = positive(float), positive(int)
    model_args(p)
    p.add_argument("--engine", choices=ENGINES, default="kserve",
                   help="kserve: packrat's KServe server (the default); torchserve: real TorchServe with the "
                        "packrat handler")
    p.add_argument("--batch-size", type=count, default=4, help="the batch size B, planned for (default 4)")
    p.add_argument("--payload", choices=overload.PAYLOADS, default=None,
                   help="request body (default: the model's natural one: jpeg for image models, text for token "
                        "models, raw otherwise); v2-json and v2-binary: KServe v2 inference requests, to "
                        "/v2/models/NAME/infer on the KServe server, /predictions/NAME on TorchServe")
    p.add_argument("--tokenizer", type=tokenizer_path, default=None, metavar="DIR",
                   help="the tokenizer.json the server uses (a text payload needs one)")
    p.add_argument("--request-timeout-s", type=number, default=2.0,
                   help="the server's deadline per request: later is 504 (default 2)")
    p.add_argument("--max-queue", type=count, default=None,
                   help=f"requests waiting beyond this are answered 503 at once (default: the settings', {MAX_QUEUE})")
    p.add_argument("--admission", choices=ADMISSIONS, default="predicted",
                   help="predicted (default): refuse 503 at once a request the pool predicts it cannot answer "
                        "within its deadline; queue: the fixed --max-queue bound alone")
    p.add_argument("--instance-kind", choices=INSTANCE_KINDS, default="auto",
                   help="auto (default): the plan's instances, ONNX Runtime ones threads of the server where the "
                        "profile measured that faster; process: every instance a process (a thread instance "
                        "decodes JSON, images and text under the server's interpreter lock)")
    p.add_argument("--slow", action="store_true",
                   help="a CPU-bound process on each core of the server's instances for the whole run: the "
                        "machine slower than its profile")
    p.add_argument("--factor", type=number, default=3.0,
                   help="the open-loop rate, as a multiple of the measured capacity (default 3)")
    p.add_argument("--duration", type=number, default=20.0, help="seconds of overload (default 20)")
    p.add_argument("--capacity-s", type=number, default=10.0,
                   help="seconds of each closed-loop run: capacity with B users, with 2B, and after (default 10)")
    p.add_argument("--runs", type=count, default=1,
                   help="capacity, overload and after this many times on the one started server, a table row and "
                        "verdicts each (default 1)")
    p.add_argument("--soak", type=number, default=None, metavar="MINUTES",
                   help=f"instead of the runs: {soak.SOAK_LOAD:g} × capacity for MINUTES, a burst to --factor × "
                        f"capacity for --duration s and an instance process killed every --soak-every s, the "
                        f"server's PSS, open files and /dev/shm sampled")
    p.add_argument("--soak-every", type=number, default=soak.SOAK_EVERY_S, metavar="S",
                   help=f"the soak's interval between bursts, and between kills (default {soak.SOAK_EVERY_S:g})")
    p.add_argument("--sample-every", type=number, default=soak.SAMPLE_EVERY_S, metavar="S",
                   help=f"the soak's interval between resource samples (default {soak.SAMPLE_EVERY_S:g})")
    p.add_argument("--warmup", type=number, default=overload.WARMUP_S,
                   help=f"seconds of closed-loop warm-up, not counted (default {overload.WARMUP_S:g})")
    p.add_argument("--max-batch-delay", type=count, default=50, metavar="MS",
                   help="how long TorchServe waits to fill a batch; the KServe server's gather wait (default 50)")
    p.add_argument("--out", type=Path, default=Path("out/overload"),
                   help="run directories: archive, logs, locust's files (default out/overload)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write every figure here")
    p.set_defaults(func=cmd_overload)


def cmd_overload(args: argparse.Namespace) -> int:
    from packrat.bench.results import write_json

    if args.soak is not None and args.runs != 1:
        raise SystemExit("--soak runs instead of --runs: give one or the other")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: the server, the CPU hogs
    if args.soak is not None:
        report = soak.run_soak(args)
        report["markdown"] = soak.format_soak_report(report)
    else:
        report = overload.run(args)
        report["markdown"] = format_report(report)
    print(report["markdown"])
    if args.json:
        write_json(args.json, report)
        log(f"report written to {args.json}")
    return 0
