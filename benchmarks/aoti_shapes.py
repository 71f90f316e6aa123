"""Why compile mode's packages have static shapes: AOTInductor packages of one model built four
ways, timed side by side (issue 17).

    .venv/bin/python benchmarks/aoti_shapes.py [--model resnet50] [--batch 1] [--threads 2] [--rounds 2]
                                               [--iters 15] [--build-threads N] [--json OUT]

Variants: the batch dimension dynamic (torch.export.Dim) or static, and the kernels' thread count
fixed at build time or taken at run time (inductor's cpp.dynamic_threads); all with frozen
weights. Each package is built once (with --build-threads torch threads, default --threads: the
thread count a package is built with shapes its code even when its kernels read the count at run
time), then each round times every variant in a fresh process
pinned to the first --threads cores (shuffled order; median of --iters runs after 3 warm ones at
--batch); the table gives the median over rounds and the ratio to the static, run-time-threads
variant, the one packrat builds.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import arguments, child_json, doc_parser, first_cores, markdown_table, median_ms, pin, \
    shuffled_rounds, write_json

VARIANTS = ("dynamic-batch,build-threads", "dynamic-batch,run-threads", "static,build-threads", "static,run-threads")
PACKRAT = "static,run-threads"


def build(model: str, variant: str, batch: int, path: Path) -> float:
    import torch

    from packrat.models.zoo import resolve

    spec = resolve(model)
    dynamic = variant.startswith("dynamic")
    examples = spec.example_inputs(2 if dynamic else batch)
    shapes = tuple({0: torch.export.Dim("batch", min=1, max=4096)} for _ in examples) if dynamic else None
    started = time.perf_counter()
    with torch.no_grad():
        program = torch.export.export(spec.build(), examples, dynamic_shapes=shapes)
        torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs={
            "freezing": True, "cpp.dynamic_threads": variant.endswith("run-threads")})
    return time.perf_counter() - started


def time_package(model: str, path: Path, batch: int, iters: int) -> float:
    import torch

    from packrat.models.zoo import resolve

    loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
    inputs = resolve(model).example_inputs(batch)
    with torch.inference_mode():
        # boxed_run empties its list: a fresh one each call (timed with it: a copy of a few pointers)
        return median_ms(lambda: loader.boxed_run(list(inputs)), iters, warmup=3)


def child(args) -> None:
    pin(first_cores(args.build_threads if args.build else args.threads))
    if args.build:
        print(json.dumps({"build_s": build(args.model, args.variant, args.batch, Path(args.path))}))
    else:
        print(json.dumps({"ms": time_package(args.model, Path(args.path), args.batch, args.iters)}))


def run(args, variant: str, path: Path, building: bool) -> dict:
    command = [sys.executable, __file__, "--child", "--variant", variant, "--path", str(path), "--model", args.model,
               "--batch", str(args.batch), "--threads", str(args.threads), "--iters", str(args.iters),
               "--build-threads", str(args.build_threads)]
    return child_json(command + (["--build"] if building else []), check=True)


def parser() -> argparse.ArgumentParser:
    p = doc_parser(__doc__)
    p.add_argument("--model", default="resnet50", help="zoo model (default resnet50)")
    p.add_argument("--batch", type=int, default=1, help="batch size timed (default 1)")
    p.add_argument("--threads", type=int, default=2, help="cores and threads (default 2)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of every variant (default 2)")
    p.add_argument("--iters", type=int, default=15, help="timed runs per variant and round (default 15)")
    p.add_argument("--build-threads", type=int, default=None, help="torch threads the packages are built with "
                                                                    "(default: --threads)")
    p.add_argument("--seed", type=int, default=0, help="seed for the round orders (default 0)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write every figure here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--build", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.build_threads = args.build_threads or args.threads
    if args.child:
        child(args)
        return 0
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="packrat-aoti-shapes-") as scratch:
        paths = {v: Path(scratch) / f"{v.replace(',', '-')}.pt2" for v in VARIANTS}
        built = {v: run(args, v, paths[v], True)["build_s"] for v in VARIANTS}
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _, variant in shuffled_rounds(VARIANTS, args.rounds, rng):
            times[variant].append(run(args, variant, paths[variant], False)["ms"])
    medians = {v: statistics.median(t) for v, t in times.items()}
    table = markdown_table(["variant", "build s", "ms", "vs packrat's (static, run-time threads)"],
                           [[v, f"{built[v]:.0f}", f"{medians[v]:.1f}", f"{medians[v] / medians[PACKRAT]:.2f}×"]
                            for v in VARIANTS])
    print(f"{args.model}, batch {args.batch}, {args.threads} threads (built with {args.build_threads}), "
          f"medians over {args.rounds} rounds\n\n{table}")
    if args.json:
        write_json(args.json, {"args": arguments(args), "build_s": built, "ms": times, "median_ms": medians})
    return 0


if __name__ == "__main__":
    sys.exit(main())
