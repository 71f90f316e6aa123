"""The adaptive profiler replayed on full tables: how much of the grid it measures, and whether every
plan comes out as the full table's.

    .venv/bin/python benchmarks/adaptive_replay.py [--max-batch 1024] [--tolerance 0] [FILE ...]

Default files: the eight published 16-core tables in ../shared/reference-profiles. For each, the
adaptive run looks points up instead of measuring them (`packrat profile --replay`, same code), then
every plan for T = 1..max threads and B = 1..--max-batch from the looked-up points is compared with the
plan from the full table, both evaluated on the full table. "floor" is the share of the grid no exact
method can skip: points whose removal alone makes some plan slower.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from packrat.profiling import profiler
from packrat.planning.planner import Planner
from packrat.profiling.profiles import load

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import ROOT, doc_parser, markdown_table

REFERENCE = ROOT.parent / "shared" / "reference-profiles"


def plan_table(items, threads: int, max_batch: int) -> np.ndarray:
    return Planner(items, threads, max_batch).table


def floor(items, threads: int, max_batch: int) -> int:
    """Points whose absence alone makes some plan slower: each must be measured by any exact method."""
    full = plan_table(items, threads, max_batch)
    return sum(bool(np.any(plan_table(items[:k] + items[k + 1:], threads, max_batch) > full * (1 + 1e-12)))
               for k in range(len(items)))


def replay(path: Path, max_batch: int, tolerance: float) -> dict:
    full = load(path)
    threads = max(full.threads)
    with tempfile.TemporaryDirectory() as tmp:
        done = profiler.run_adaptive(profiler.ProfileSettings(model=path.stem), full.threads, full.batches,
                                     Path(tmp) / "adaptive.csv", replay=path, tolerance=tolerance, progress=False)
    looked_up = [(t, b, full.latency[t, b]) for t, b, _ in done.profile.items()]  # the file keeps 4 decimals
    whole = plan_table(full.items(), threads, max_batch)
    partial = plan_table(looked_up, threads, max_batch)
    finite = np.isfinite(whole)
    finite[:, 0] = False
    return {"table": path.stem, "grid": done.grid, "points": done.points, "fraction": done.points / done.grid,
            "floor": floor(full.items(), threads, max_batch) / done.grid,
            "worst_plan": float(np.max(partial[finite] / whole[finite])),
            "time_saved": 1 - done.measure_s / done.full_grid_s}


def exact_text(row: dict) -> str:
    return "yes" if row["worst_plan"] <= 1 + 1e-9 else f"no, worst {row['worst_plan'] - 1:+.1%}"


def main() -> int:
    parser = doc_parser(__doc__)
    parser.add_argument("files", nargs="*", type=Path, help="profile tables (default: the published ones)")
    parser.add_argument("--max-batch", type=int, default=1024, help="plans for every B up to this (default: 1024)")
    parser.add_argument("--tolerance", type=float, default=0.0, help="the adaptive profiler's tolerance (default: 0)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead")
    args = parser.parse_args()
    files = args.files or sorted(REFERENCE.glob("*_large-batches*.csv"))
    rows = [replay(path, args.max_batch, args.tolerance) for path in files]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(markdown_table(["table", "points measured", "floor (no exact method measures fewer)",
                          "every plan as the full table's", "est. measuring time saved"],
                         [[r["table"], f"{r['points']}/{r['grid']} ({r['fraction']:.0%})", f"{r['floor']:.0%}",
                           exact_text(r), f"{r['time_saved']:.0%}"] for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
