"""IOS on the four networks of the published evaluation: search cost and sequential vs greedy
vs IOS latency, each case measured side by side by `ios-schedule --compare`.

    .venv/bin/python benchmarks/ios_networks.py [--models inception_v3,squeezenet,randwire,nasnet]
                                                [--batches 1,8] [--threads 2] [--out out/ios-networks]

Runs one `ios-schedule` at a time (nothing else should run), keeps each report and schedule
in --out and prints the table that BENCHMARKS.md records.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

MODELS = "inception_v3,squeezenet,randwire,nasnet"


def run_case(model: str, batch: int, threads: int, out: Path) -> dict:
    report = out / f"{model}-b{batch}.json"
    if report.exists():  # resumable: a finished case is kept
        return json.loads(report.read_text())
    cmd = [sys.executable, "-m", "ios_scheduler.cli", "--model", model, "--batch", str(batch), "--threads",
           str(threads), "--out", str(out / f"{model}-b{batch}.schedule.json"), "--compare", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{model} batch {batch} failed:\n{done.stderr[-2000:]}")
    report.write_text(done.stdout)
    return json.loads(done.stdout)


def row(r: dict) -> str:
    seq, greedy, ios = r["compare_sequential_ms"], r["compare_greedy_ms"], r["compare_ios_ms"]
    if r["ios_ms"] > r["sequential_ms"]:
        kept = "sequential: the searched schedule was slower end to end"
    else:
        kept = f"{r['parallel_stages']} concurrent stages" if r["parallel_stages"] else "no concurrent stage"
    return (f"| {r['model']} | {r['batch']} | {r['operators']} / {r['parts']} | {r['states']} | {r['measurements']} | "
            f"{r['seconds']:.0f} s | {seq:.1f} ms | {greedy:.1f} ms ({seq / greedy:.2f}×) | "
            f"{ios:.1f} ms ({seq / ios:.2f}×) | {r['predicted_sequential_ms'] / r['predicted_ios_ms']:.2f}× | "
            f"{r['sequential_ms'] / r['ios_ms']:.2f}× | {kept} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("out/ios-networks"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print("| model | batch | operators / parts | states | stage measurements | search | sequential | greedy | IOS (kept) "
          "| searched vs sequential, by stage costs | searched vs sequential, end to end | kept |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for batch in map(int, args.batches.split(",")):
            print(row(run_case(model, batch, args.threads, args.out)), flush=True)


if __name__ == "__main__":
    main()
