"""`packrat bench http`: packrat's KServe server against FastAPI + one ONNX Runtime session, through
HTTP with locust (the measuring: packrat/bench/plain_http.py, the plain server: packrat/bench/plain_server.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from packrat.bench import plain_http  # light: the servers and locust come with plain_http.run
from packrat.cli.args import doc_subparser
from packrat.cli.types import positive


def add_http_parser(sub) -> None:
    p = doc_subparser(sub, "http", "packrat's KServe server against a plain FastAPI + ONNX Runtime server",
                      plain_http.__doc__, (
                          "packrat bench http --model squeezenet --batch-size 4 --rounds 10 --duration 8",
                          "packrat bench http --model tiny --rounds 1 --duration 2 --warmup 2   # smoke run",
                          "packrat bench http --ceiling --rounds 4 --duration 5   # the front end's ceiling, trivial"))
    number, count = positive(float), positive(int)
    p.add_argument("--model", default="squeezenet", help="zoo model (default squeezenet)")
    p.add_argument("--batch-size", type=count, default=4,
                   help="B: packrat's plan is for B, and the loads are 1 and B users (default 4)")
    p.add_argument("--profile", type=Path, default=None,
                   help="packrat's profile (default profiles/MODEL.csv, measured there first when missing)")
    p.add_argument("--rounds", type=count, default=10, help="interleaved rounds (default 10)")
    p.add_argument("--duration", type=number, default=8.0,
                   help="seconds of load per server, users count and round (whole seconds; default 8)")
    p.add_argument("--warmup", type=number, default=plain_http.WARMUP_S,
                   help=f"seconds of each users count on each server before its rounds, again on packrat's "
                        f"until it serves its plan for that count (default {plain_http.WARMUP_S:g})")
    p.add_argument("--max-batch-delay", type=positive(int, zero=True), default=50, metavar="MS",
                   help="the engine's gather wait: how long an idle instance waits for the rest of its batch "
                        "(default 50, as `packrat serve`)")
    p.add_argument("--out", type=Path, default=Path("out/http-bench"),
                   help="the archive, the servers' logs, locust's files and http-bench.json (default out/http-bench)")
    p.add_argument("--ceiling", nargs="?", const="trivial", default=None, metavar="MODEL",
                   help="measure the front end's ceiling instead (packrat/bench/ceiling.py): req/s per front-end core "
                        "with MODEL (default trivial, of next to no cost), packrat's alone on a core against the plain "
                        "server's, then one front end against one per core; writes packrat's figure where `packrat "
                        "serve --front-ends auto` reads it")
    p.add_argument("--connections", type=count, default=32,
                   help="--ceiling: kept-alive connections of the closed-loop load (default 32)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of the tables")
    p.set_defaults(func=cmd_http)


def cmd_http(args: argparse.Namespace) -> int:
    if args.ceiling:
        from packrat.bench import ceiling

        report = ceiling.run(argparse.Namespace(**{**vars(args), "model": args.ceiling}), plain_http.log)
        written = args.out / "ceiling.json"
    else:
        report, written = plain_http.run(args), args.out / "http-bench.json"
    print(json.dumps(report, indent=2, default=str) if args.json else report["markdown"])
    plain_http.log(f"every figure: {written}")
    return 0
