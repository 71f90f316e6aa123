"""A pool instance against its own profile point, side by side on the same cores (packrat/bench/instance.py).

    .venv/bin/python benchmarks/instance_gap.py [--models squeezenet,resnet50] [--runtimes inductor,openvino,onnxruntime]
                                                [--batches 1,4,8] [--threads T] [--rounds 3] [--iters 30] [--json OUT]

A runtime that is not installed, or cannot run the model, is reported and skipped."""

from __future__ import annotations

import sys
from pathlib import Path

from packrat.bench.harness import doc_parser, local_topology
from packrat.bench.instance import format_gaps, instance_gap
from packrat.bench.results import write_json
from packrat.cli.types import int_list, name_list


def build_parser():
    parser = doc_parser(__doc__)
    parser.add_argument("--models", type=name_list(), default=["squeezenet", "resnet50"], help="zoo models")
    parser.add_argument("--runtimes", type=name_list(), default=["inductor", "openvino", "onnxruntime"])
    parser.add_argument("--batches", type=int_list, default=[1, 4, 8])
    parser.add_argument("--threads", type=int, default=None, help="cores and threads (default: every core here)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=30, help="timed batches per case and round")
    parser.add_argument("--graph-mode", default="compile", help="how inductor instances run the model")
    parser.add_argument("--json", type=Path, default=None, help="keep every figure here")
    return parser


def main(argv=None) -> int:
    from packrat.models.runtimes import installed

    args = build_parser().parse_args(argv)
    cores = tuple(local_topology(args.threads).cores)
    results, skipped = [], []
    for model in args.models:
        for runtime in args.runtimes:
            if runtime != "inductor" and not installed(runtime):
                skipped.append(f"{runtime}: not installed")
                continue
            for batch in args.batches:
                print(f"{model} {runtime} b={batch} on cores {list(cores)} ...", file=sys.stderr, flush=True)
                try:
                    results.append(instance_gap(model, runtime, len(cores), batch, cores, rounds=args.rounds,
                                                iters=args.iters, graph_mode=args.graph_mode))
                except Exception as exc:  # a runtime that cannot run the model: say so, measure the rest
                    skipped.append(f"{model} {runtime} b={batch}: {type(exc).__name__}: {exc}"[:300])
    print(format_gaps(results))
    for line in skipped:
        print(f"skipped {line}")
    if args.json:
        write_json(args.json, {"cores": list(cores), "results": results, "skipped": skipped})
    return 0


if __name__ == "__main__":
    sys.exit(main())
