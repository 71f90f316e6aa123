"""Planner speed: the numpy DP table vs a plain four-loop reference of the same recurrence.

    .venv/bin/python benchmarks/planner_bench.py [--threads 64] [--batch 1024] [--repeats 5]

Items are t = 1..T, b = powers of two up to B, with a synthetic sub-linear scaling
latency. Prints the median time of each and their ratio, and checks the tables agree.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from packrat.planning.planner import Planner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import doc_parser, median_ms


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


def main() -> None:
    parser = doc_parser(__doc__)
    parser.add_argument("--threads", type=int, default=64, help="T (default 64)")
    parser.add_argument("--batch", type=int, default=1024, help="B (default 1024)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of the numpy table (default 5)")
    args = parser.parse_args()
    items = synthetic_items(args.threads, args.batch)
    planner = Planner(items, args.threads, args.batch)
    reference = np.array(reference_table(items, args.threads, args.batch))
    assert np.array_equal(planner.table, reference), "numpy table differs from the reference"

    numpy_ms = median_ms(lambda: Planner(items, args.threads, args.batch), args.repeats)
    plan_ms = median_ms(lambda: planner.plan(args.threads, args.batch), args.repeats)
    reference_ms = median_ms(lambda: reference_table(items, args.threads, args.batch), 1)
    print(f"items: {len(items)} (t = 1..{args.threads}, b = powers of two ≤ {args.batch})")
    print(f"numpy table T={args.threads}, B={args.batch}: {numpy_ms:.1f} ms (median of {args.repeats})")
    print(f"one plan (tie-break DP + reconstruction):   {plan_ms:.1f} ms")
    print(f"four-loop reference table:                  {reference_ms / 1e3:.2f} s")
    print(f"speedup of numpy over the reference:        {reference_ms / numpy_ms:.0f}×")


if __name__ == "__main__":
    main()
