"""Graph modes side by side (issue 17): how fast each way of running a model starts and runs.

    .venv/bin/python benchmarks/graph_modes.py [--model resnet50] [--threads 2] [--batches 1,2,4]
                                               [--rounds 3] [--iters 10] [--modes eager,script,compile,aoti]
                                               [--json OUT]

Modes, all from the same zoo module with its seeded weights:
  eager    the nn.Module as it is
  script   packrat's TorchScript path (models.prepare: trace + freeze + optimize_for_inference)
  compile  torch.compile with inductor and freezing on, one static graph per batch size
  aoti     an AOTInductor package (torch.export with a dynamic batch dimension, then
           aoti_compile_and_package with freezing), built once before the rounds; the rounds load it
  aoti-static  one AOTInductor package per batch size (static shapes), built once; the rounds load them

Every measurement is a fresh process pinned to the first --threads cores of this process with
torch.set_num_threads(--threads). It reports its start (process start to the model answering its
first batch of every size: import, build, trace or compile or load, first runs) and, per batch
size, the median of --iters timed runs after two warm ones. Rounds run the modes in a shuffled
order; the table gives medians over rounds, and the start of round 1 separately: with an empty
inductor cache (TORCHINDUCTOR_CACHE_DIR is a fresh directory per run of this script) round 1 is
compile's cold start and later rounds its warm start. Outputs are checked against eager's
(largest absolute difference on the largest batch).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("eager", "script", "compile", "aoti", "aoti-static")


def child(model: str, mode: str, threads: int, batches: list[int], iters: int, package: str | None) -> dict:
    """Runs in the fresh process: start the model in `mode`, time it, return the figures."""
    started = time.perf_counter()
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    from packrat.models import prepare, resolve

    spec = resolve(model)
    runners = {}
    with torch.inference_mode():
        for batch in batches:
            runners[batch] = runner_for(mode, spec, batch, runners, package)
            runners[batch](spec.example_input(batch))
        start_s = time.perf_counter() - started
        latency_ms, outputs = {}, {}
        for batch in batches:
            example = spec.example_input(batch)
            for _ in range(2):
                outputs[batch] = runners[batch](example)
            times = []
            for _ in range(iters):
                begin = time.perf_counter()
                runners[batch](example)
                times.append((time.perf_counter() - begin) * 1e3)
            latency_ms[batch] = statistics.median(times)
        reference = prepare(spec, batches[-1], graph_mode=False)[0](spec.example_input(batches[-1]))
        error = float((outputs[batches[-1]] - reference).abs().max())
    return {"start_s": start_s, "latency_ms": latency_ms, "max_abs_diff": error}


def runner_for(mode: str, spec, batch: int, built: dict, package: str | None):
    import torch

    from packrat.models import prepare

    if mode in ("eager", "script"):
        return prepare(spec, batch, graph_mode=mode == "script")[0]
    if mode == "aoti":
        if not built:
            return torch._inductor.aoti_load_package(str(package_path(package, None)))
        return next(iter(built.values()))  # one package serves every batch size
    if mode == "aoti-static":
        return torch._inductor.aoti_load_package(str(package_path(package, batch)))
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    return torch.compile(spec.build(), dynamic=False)


def package_path(directory: str | Path, batch: int | None) -> Path:
    """Where the packages live: one with a dynamic batch (batch None), or one per batch size."""
    return Path(directory) / ("dynamic.pt2" if batch is None else f"batch{batch}.pt2")


def build_packages(model: str, threads: int, batches: list[int], directory: Path, static: bool) -> float:
    """AOTInductor packages: one per batch size (static) or one with a dynamic batch dimension up
    to the largest; seconds taken."""
    return sum(build_package(model, threads, batch if static else None, max(batches),
                             package_path(directory, batch if static else None))
               for batch in (batches if static else [None]))


def build_package(model: str, threads: int, batch: int | None, max_batch: int, path: Path) -> float:
    """Export (with a dynamic batch dimension when batch is None) and compile one AOTInductor
    package with freezing; seconds taken."""
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
    import torch

    torch.set_num_threads(threads)
    from packrat.models import resolve

    spec = resolve(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with torch.inference_mode():
        if batch is None:
            dims = ({0: torch.export.Dim("batch", min=1, max=max(2, max_batch))},)
            program = torch.export.export(spec.build(), (spec.example_input(2),), dynamic_shapes=dims)
        else:
            program = torch.export.export(spec.build(), (spec.example_input(batch),))
        torch._inductor.aoti_compile_and_package(program, package_path=str(path),
                                                 inductor_configs={"freezing": True})
    return time.perf_counter() - started


def run_child(args, mode: str, package: Path | None, env: dict) -> dict:
    command = [sys.executable, __file__, "--child", mode, "--model", args.model, "--threads", str(args.threads),
               "--batches", ",".join(map(str, args.batches)), "--iters", str(args.iters)]
    if package:
        command += ["--package", str(package)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {done.returncode}: {tail}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarise(results: dict[str, list[dict]], batches: list[int]) -> dict[str, dict]:
    summary = {}
    for mode, runs in results.items():
        good = [r for r in runs if "error" not in r]
        if not good:
            summary[mode] = {"error": runs[0]["error"]}
            continue
        summary[mode] = {
            "first_start_s": runs[0].get("start_s"),
            "later_start_s": statistics.median([r["start_s"] for r in good[1:]]) if len(good) > 1 else None,
            "latency_ms": {b: statistics.median([r["latency_ms"][str(b)] for r in good]) for b in batches},
            "max_abs_diff": max(r["max_abs_diff"] for r in good),
        }
    return summary


def markdown(summary: dict[str, dict], batches: list[int], build_s: dict[str, float]) -> str:
    head = ["mode", "start, round 1 s", "start, later rounds s", *[f"b={b} ms" for b in batches],
            *[f"b={b} vs script" for b in batches], "max |Δ| vs eager"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    script = summary.get("script", {}).get("latency_ms")
    for mode, row in summary.items():
        if "error" in row:
            lines.append(f"| {mode} | {row['error']} |")
            continue
        ratios = [f"{row['latency_ms'][b] / script[b]:.2f}×" if script else "" for b in batches]
        later = f"{row['later_start_s']:.1f}" if row["later_start_s"] is not None else ""
        first = f"{row['first_start_s']:.1f}" if row["first_start_s"] is not None else ""
        lines.append(f"| {mode} | {first} | {later} | "
                     + " | ".join(f"{row['latency_ms'][b]:.1f}" for b in batches) + " | "
                     + " | ".join(ratios) + f" | {row['max_abs_diff']:.1e} |")
    for mode, seconds in build_s.items():
        lines.append(f"\n{mode}: package(s) built once in {seconds:.1f} s (not in its start)")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50", help="zoo model (default resnet50)")
    p.add_argument("--threads", type=int, default=2, help="cores and torch threads per process (default 2)")
    p.add_argument("--batches", default="1,2,4", help="batch sizes (default 1,2,4)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each running every mode once (default 3)")
    p.add_argument("--iters", type=int, default=10, help="timed runs per batch size (default 10)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma list (default {','.join(MODES)})")
    p.add_argument("--seed", type=int, default=0, help="seed for the round orders (default 0)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write every figure here")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--package", help=argparse.SUPPRESS)
    p.add_argument("--build-package", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.batches = sorted(int(b) for b in args.batches.split(","))
    if args.child:
        print(json.dumps(child(args.model, args.child, args.threads, args.batches, args.iters, args.package)))
        return 0
    if args.build_package:
        directory, static = args.build_package.split(":")
        print(json.dumps({"build_s": build_packages(args.model, args.threads, args.batches, Path(directory),
                                                     static == "static")}))
        return 0
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit(f"unknown mode(s) {sorted(unknown)}: choose from {','.join(MODES)}")
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="packrat-graph-modes-") as scratch:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(scratch) / "inductor")}
        packages, build_s = Path(scratch) / "packages", {}
        for mode in ("aoti", "aoti-static"):
            if mode in modes:
                kind = "static" if mode == "aoti-static" else "dynamic"
                done = subprocess.run([sys.executable, __file__, "--build-package", f"{packages}:{kind}",
                                       "--model", args.model, "--threads", str(args.threads),
                                       "--batches", ",".join(map(str, args.batches))],
                                      capture_output=True, text=True, env=env, check=True)
                build_s[mode] = json.loads(done.stdout.strip().splitlines()[-1])["build_s"]
                print(f"{mode} package(s) built in {build_s[mode]:.1f} s", flush=True)
        results: dict[str, list[dict]] = {mode: [] for mode in modes}
        for round_index in range(1, args.rounds + 1):
            order = modes[:]
            rng.shuffle(order)
            for mode in order:
                result = run_child(args, mode, packages, env)
                results[mode].append(result)
                print(f"round {round_index} {mode}: {result}", flush=True)
    summary = summarise(results, args.batches)
    table = markdown(summary, args.batches, build_s)
    print(f"\n{args.model}, {args.threads} threads, medians over {args.rounds} rounds\n\n{table}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "build_s": build_s,
                                         "runs": results, "summary": summary, "markdown": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
