"""IOS on the four networks of the published evaluation: search cost, whether the stage costs
add up, and sequential vs greedy vs IOS latency, each case measured side by side by
`ios-schedule --compare`.

    .venv/bin/python benchmarks/ios_networks.py [--models inception_v3,squeezenet,randwire,nasnet]
                                                [--batches 1,8] [--threads 2] [--out out/ios-networks]

One `ios-schedule` at a time; each report, schedule and stage-cost table kept in --out (a finished
case is not run again); prints BENCHMARKS.md's table. "kept": what `optimize()` keeps after its
end-to-end check; "predicted": its summed stage costs, "measured": its run in the check, "timed
again": the same stages right before the check (the search takes minutes; the VM drifts).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import doc_parser, markdown_head
from packrat.cli.types import int_list, name_list

MODELS = "inception_v3,squeezenet,randwire,nasnet"


def run_case(model: str, batch: int, threads: int, out: Path, bounds: Path | None) -> dict:
    stem = out / f"{model}-b{batch}-t{threads}{'-bounded' if bounds else ''}"
    report = stem.with_suffix(".json")
    if report.exists():  # resumable: a finished case is kept
        return json.loads(report.read_text())
    cmd = [sys.executable, "-m", "packrat.cli.ios_schedule", "--model", model, "--batch", str(batch), "--threads",
           str(threads), "--out", f"{stem}.schedule.json", "--costs", f"{stem}.costs.json", "--compare", "--json"]
    if bounds:
        cmd += ["--bounds", str(bounds)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{model} batch {batch} failed:\n{done.stderr[-2000:]}")
    report.write_text(done.stdout)
    return json.loads(done.stdout)


def row(r: dict) -> str:
    seq, greedy, ios = r["compare_sequential_ms"], r["compare_greedy_ms"], r["compare_ios_ms"]
    searched = r["kept"] == "searched"
    predicted = r["predicted_ios_ms"] if searched else r["predicted_sequential_ms"]
    retimed = r["retimed_ios_ms"] if searched else r["retimed_sequential_ms"]
    measured = r["ios_ms"] if searched else r["sequential_ms"]
    if not searched:
        kept = f"sequential (searched: {r['sequential_ms'] / r['ios_ms']:.2f}× end to end)"
    else:
        kept = f"searched, {r['parallel_stages']} concurrent stages" if r["parallel_stages"] else "searched, all sequential"
    return (f"| {r['model']} | {r['batch']} | {r['threads']} | {r['operators']} | {r['seconds']:.0f} s | "
            f"{r['measurements']} ({r['stopped_early']} stopped, {r['skipped']} skipped) | {seq:.1f} ms | "
            f"{greedy:.1f} ms ({seq / greedy:.2f}×) | {ios:.1f} ms ({seq / ios:.2f}×) | "
            f"{r['predicted_sequential_ms'] / r['predicted_ios_ms']:.2f}× | {kept} | "
            f"{predicted:.1f} / {measured:.1f} ms ({predicted / measured:.2f}) | "
            f"{retimed:.1f} ms ({retimed / measured:.2f}) | {r['switch_ms'] or 0:.2f} ms |")


def main() -> None:
    parser = doc_parser(__doc__)
    parser.add_argument("--models", type=name_list(), default=MODELS.split(","), help=f"zoo models (default {MODELS})")
    parser.add_argument("--batches", type=int_list, default=[1, 8], help="batch sizes (default 1,8)")
    parser.add_argument("--threads", type=int_list, default=[2],
                        help="comma-separated thread counts (default 2; e.g. 8,16 on a larger machine)")
    parser.add_argument("--bounds-from", type=int, default=None, metavar="BATCH",
                        help="bound each search with the stage costs of this batch size's (earlier) search")
    parser.add_argument("--out", type=Path, default=Path("out/ios-networks"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(markdown_head(["model", "batch", "threads", "operators", "search", "stage measurements", "sequential",
                         "greedy", "IOS (kept)", "searched vs sequential, by stage costs", "kept",
                         "kept: predicted / measured", "kept: stages timed again before the check (vs measured)",
                         "switch cost"]))
    for threads in args.threads:
        for model in args.models:
            for batch in args.batches:
                bounds = None
                if args.bounds_from is not None and args.bounds_from != batch:
                    bounds = args.out / f"{model}-b{args.bounds_from}-t{threads}.costs.json"
                    run_case(model, args.bounds_from, threads, args.out, None)
                print(row(run_case(model, batch, threads, args.out, bounds)), flush=True)


if __name__ == "__main__":
    main()
