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
import os
import statistics
import subprocess
import sys
import time

CASES = ("alone", "one-thread workers", "2-thread worker", "worker exited")


def measure(case: str, model: str, batch: int) -> float:
    import torch

    from ios_scheduler.runtime import WorkerSet
    from packrat.models.zoo import resolve

    cores = sorted(os.sched_getaffinity(0))[:2]
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
        for _ in range(3):
            module(x)
        samples = []
        for _ in range(15):
            start = time.perf_counter()
            module(x)
            samples.append((time.perf_counter() - start) * 1e3)
    workers.close()
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="inception_v3")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--case", choices=CASES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:  # the child: one case, one process
        print(json.dumps(measure(args.case, args.model, args.batch)))
        return
    results: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(args.rounds):
        for case in CASES:
            cmd = [sys.executable, __file__, "--case", case, "--model", args.model, "--batch", str(args.batch)]
            results[case].append(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout))
    alone = statistics.median(results["alone"])
    print(f"| case | {args.model}, batch {args.batch}, 2 threads (median of {args.rounds} processes) | vs alone |")
    print("|---|---|---|")
    for case, values in results.items():
        value = statistics.median(values)
        print(f"| {case} | {value:.1f} ms ({', '.join(f'{v:.1f}' for v in values)}) | {value / alone:.2f}× |")


if __name__ == "__main__":
    main()
