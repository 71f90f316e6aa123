"""Plain PyTorch vs an IOS-compiled model, each case in a fresh process (eager mode).

    .venv/bin/python benchmarks/ios_fresh_compare.py --schedule SCHED.json [--model inception_v3] [--threads 2]

Case "plain": only the plain model in the process. Case "beside": the IOS module compiled in
the same process, plain and IOS timed in interleaved rounds. Medians of 15 runs, batch 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def measure(case: str, model: str, threads: int, schedule: str) -> dict:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
    import torch

    from ios_scheduler import compile as ios_compile
    from ios_scheduler.schedule import Schedule
    from packrat.models import resolve

    torch.set_num_threads(threads)
    spec = resolve(model)
    module, x = spec.build(), spec.example_input(1)
    runs = {"plain": module}
    if case == "beside":
        runs["ios"] = ios_compile(module, Schedule.from_json(open(schedule).read()))
    samples: dict[str, list[float]] = {name: [] for name in runs}
    with torch.inference_mode():
        for fn in runs.values():
            for _ in range(3):
                fn(x)
        for _ in range(15):
            for name, fn in runs.items():
                start = time.perf_counter()
                fn(x)
                samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: round(statistics.median(v), 1) for name, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedule", required=True)
    parser.add_argument("--model", default="inception_v3")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--case", choices=("plain", "beside"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:  # the child: one case, one process
        print(json.dumps(measure(args.case, args.model, args.threads, args.schedule)))
        return
    for case in ("plain", "beside"):
        out = subprocess.run([sys.executable, __file__, "--case", case, "--schedule", args.schedule,
                              "--model", args.model, "--threads", str(args.threads)],
                             capture_output=True, text=True, check=True).stdout
        print(f"{case:>7}: {out.strip()}")


if __name__ == "__main__":
    main()
