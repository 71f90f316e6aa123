"""Planner speed: the numpy DP table vs a plain four-loop reference of the same recurrence.

    .venv/bin/python benchmarks/planner_bench.py [--threads 64] [--batch 1024] [--repeats 5]

Items are t = 1..T, b = powers of two up to B, with a synthetic sub-linear scaling
latency. Prints the median time of each and their ratio, and checks the tables agree.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from packrat.planning.planner import Planner


def synthetic_items(threads: int, batch: int) -> list[tuple[int, int, float]]:
    rng = np.random.default_rng(0)
    sizes = [2 ** k for k in range(batch.bit_length()) if 2 ** k <= batch]
    return [(t, b, float(b * 50.0 / t ** 0.7 * rng.uniform(0.9, 1.1))) for t in range(1, threads + 1) for b in sizes]


def reference_table(items, threads: int, batch: int) -> list[list[float]]:
    """opt[t][b] with four nested loops: t, b, item threads, item batch."""
    latency = {(t, b): l for t, b, l in items}
    item_threads = sorted({t for t, _, _ in items})
    item_batches = sorted({b for _, b, _ in items})
    opt = [[0.0] + [float("inf")] * batch for _ in range(threads + 1)]
    for t in range(1, threads + 1):
        for b in range(1, batch + 1):
            best = opt[t][b]
            for ti in item_threads:
                if ti > t:
                    break
                for bi in item_batches:
                    if bi > b:
                        break
                    l = latency.get((ti, bi))
                    if l is not None:
                        best = min(best, max(l, opt[t - ti][b - bi]))
            opt[t][b] = best
    return opt


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    items = synthetic_items(args.threads, args.batch)
    planner = Planner(items, args.threads, args.batch)
    reference = np.array(reference_table(items, args.threads, args.batch))
    assert np.array_equal(planner.table, reference), "numpy table differs from the reference"

    numpy_s = median_seconds(lambda: Planner(items, args.threads, args.batch), args.repeats)
    plan_s = median_seconds(lambda: planner.plan(args.threads, args.batch), args.repeats)
    reference_s = median_seconds(lambda: reference_table(items, args.threads, args.batch), 1)
    print(f"items: {len(items)} (t = 1..{args.threads}, b = powers of two ≤ {args.batch})")
    print(f"numpy table T={args.threads}, B={args.batch}: {numpy_s * 1e3:.1f} ms (median of {args.repeats})")
    print(f"one plan (tie-break DP + reconstruction):   {plan_s * 1e3:.1f} ms")
    print(f"four-loop reference table:                  {reference_s:.2f} s")
    print(f"speedup of numpy over the reference:        {reference_s / numpy_s:.0f}×")


if __name__ == "__main__":
    main()
