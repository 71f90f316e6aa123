"""Whether figures inferred from a correction (packrat/serving/served.py, inferred_from) come closer
to the truth than the profile's own, checked on pairs of profiles of one model.

    .venv/bin/python benchmarks/inferred_check.py PROFILE_A PROFILE_B [PROFILE_A PROFILE_B ...] [--json OUT]

A plays the profile planned with, B what the instances serve (another day, allocator or load).
Each point of B beyond the correction margin is taken in turn as the one correction; per rule, how
many inferred (model-only) figures came closer to B's than A's were, and the median relative
error before and after."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from packrat.bench.harness import doc_parser
from packrat.bench.results import fmt_num, markdown_table
from packrat.profiling.profiles import load
from packrat.serving.served import CORRECTION_MARGIN, Correction, inferred_from

def figures(path: Path) -> dict:
    return load(path).model_points()  # model-only figures, as served model stages are compared with


def check(a: dict, b: dict) -> dict[str, list[tuple[float, float, float]]]:
    """Per rule, (A's figure, inferred, B's) of every figure inferred over the trials."""
    common = {key: ms for key, ms in a.items() if key in b}
    wrong = [key for key in common if abs(b[key] - a[key]) > CORRECTION_MARGIN * a[key]]
    found: dict[str, list] = {}
    for served in wrong:
        corrections = {served: Correction(*served, a[served], b[served], 30, 0.0)}
        for key, inferred in inferred_from(corrections, common).items():
            found.setdefault(inferred.rule, []).append((a[key], inferred.inferred_ms, b[key]))
    return found


def summary(found: dict) -> list[list]:
    rows = []
    for rule, triples in sorted(found.items()):
        closer = sum(abs(x - truth) < abs(before - truth) for before, x, truth in triples)
        before = statistics.median(abs(before - truth) / truth for before, _, truth in triples)
        after = statistics.median(abs(x - truth) / truth for _, x, truth in triples)
        rows.append([rule, len(triples), f"{closer / len(triples):.0%}", fmt_num(100 * before, 1) + " %",
                     fmt_num(100 * after, 1) + " %"])
    return rows


def main(argv=None) -> int:
    parser = doc_parser(__doc__)
    parser.add_argument("profiles", nargs="+", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if len(args.profiles) % 2:
        parser.error("give profiles in pairs: A B [A B ...]")
    report = {}
    for a_path, b_path in zip(args.profiles[::2], args.profiles[1::2]):
        found = check(figures(a_path), figures(b_path))
        rows = summary(found)
        report[f"{a_path.name} -> {b_path.name}"] = rows
        print(f"\n{a_path.name} planned, {b_path.name} served")
        print(markdown_table(["rule", "figures inferred", "closer than the profile", "median error before",
                              "after"], rows))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
