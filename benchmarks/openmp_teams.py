"""Why the IOS runtime keeps full-width stages on the calling thread: plain PyTorch in a
process that also holds a second OpenMP team (a 2-thread IOS worker), each case in fresh
processes.

    .venv/bin/python benchmarks/openmp_teams.py [--model inception_v3] [--batch 1] [--rounds 3]

Cases: "alone" (the plain model only); "one-thread workers" (1-thread workers on each core
have run a convolution: no extra team); "2-thread worker" (a worker on both cores has run a
convolution with 2 intra-op threads: a second team); "worker exited" (the same, then that
worker thread ended). Plain model: median of 15 runs per process; the table shows the
median over --rounds processes per case, the cases interleaved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import child_json, doc_parser, first_cores, markdown_head, median_ms

CASES = ("alone", "one-thread workers", "2-thread worker", "worker exited")


def measure(case: str, model: str, batch: int) -> float:
    import torch

    from ios_scheduler.runtime import WorkerSet
    from packrat.models.zoo import resolve

    cores = first_cores(2)
    torch.set_num_threads(len(cores))
    spec = resolve(model)
    module, x = spec.build().eval(), spec.example_input(batch)
    conv, y = torch.nn.Conv2d(64, 64, 3, padding=1), torch.randn(1, 64, 56, 56)
    workers = WorkerSet(cores)
    with torch.inference_mode():
        if case == "one-thread workers":
            workers.run([lambda: conv(y)] * len(cores), [1] * len(cores))
        elif case in ("2-thread worker", "worker exited"):
            workers.worker(tuple(cores)).submit(lambda: conv(y)).result()  # its own 2-thread team
            if case == "worker exited":
                workers.close()
        ms = median_ms(lambda: module(x), 15, warmup=3)
    workers.close()
    return ms


def main() -> None:
    parser = doc_parser(__doc__)
    parser.add_argument("--model", default="inception_v3", help="zoo model (default inception_v3)")
    parser.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    parser.add_argument("--rounds", type=int, default=3, help="processes per case (default 3)")
    parser.add_argument("--case", choices=CASES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:  # the child: one case, one process
        print(json.dumps({"ms": measure(args.case, args.model, args.batch)}))
        return
    results: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(args.rounds):
        for case in CASES:
            cmd = [sys.executable, __file__, "--case", case, "--model", args.model, "--batch", str(args.batch)]
            results[case].append(child_json(cmd, check=True)["ms"])
    alone = statistics.median(results["alone"])
    print(markdown_head(["case", f"{args.model}, batch {args.batch}, 2 threads (median of {args.rounds} processes)",
                         "vs alone"]))
    for case, values in results.items():
        value = statistics.median(values)
        print(f"| {case} | {value:.1f} ms ({', '.join(f'{v:.1f}' for v in values)}) | {value / alone:.2f}× |")


if __name__ == "__main__":
    main()
