"""`packrat profile`: measure L(t, b) where a plan depends on it (or over the whole grid), on pinned workers."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from packrat.cli.args import DEFAULT_BATCHES, search_args, contention_args, graph_mode_args, ios_cache_arg, local_cores

from packrat.cli.types import int_list, positive, shape
from packrat.profiling.profiles import default_path as default_profile_path
from packrat.profiling import profiler
from packrat.profiling.profiles import load


def add_profile_parser(sub) -> None:
    p = sub.add_parser("profile", help="measure L(t, b) for a model where a plan depends on it",
                       description="Measure the latency of one model instance with t threads at batch b, where the "
                                   "plans for this machine's cores depend on it. A few designed points per runtime "
                                   "come first; a scaling model fitted to them predicts every other point with its "
                                   "error, and the points that could change a plan at some batch of the grid are "
                                   "measured next, until none can or --budget-s has passed (--full-grid measures "
                                   "every point). What the points need is built first, in parallel; each runtime and "
                                   "thread count then walks its batches on workers started once, pinned to t cores "
                                   "each. A point is timed twice: the model alone (latency_ms), then the whole "
                                   "sub-batch as an instance serves it, decode + model + encode (served_ms, unless "
                                   "--model-only): plans are made on the served figure, plus the path around it (hand-off, hop "
                                   "and hand-out) measured at the end per instance kind through a pool of one "
                                   "instance (the profile's path_ms line). With "
                                   f"--contention{' (the default)' if profiler.DEFAULT_CONTENTION else ''} each "
                                   "point is measured while ⌊T/t⌋ copies of it run side by side on the T cores "
                                   "this process may use, as a plan of that point serves them. Points "
                                   "already in --out are kept, so an interrupted run resumes where it stopped. At the "
                                   "end it says where the time went: building, loading, measuring, per runtime.",
                       epilog="example: packrat profile --model resnet50 --batches 1,2,4,8,16 --out profiles/resnet50.csv")
    p.add_argument("--model", default="resnet50",
                   help="zoo name (tiny, tiny_text, resnet50, inception_v3, bert_base, gpt2, squeezenet, randwire, "
                        "nasnet), hf:DIR (a Hugging Face save_pretrained directory), a torch.export program (.pt2), "
                        "a TorchScript file, or package.module:factory (default: resnet50)")
    p.add_argument("--input-shape", type=shape, default=None,
                   help="shape of one input sample, e.g. 3,224,224 (needed for TorchScript files and factories; "
                        "for text models the sequence length, e.g. 64)")
    p.add_argument("--threads", type=int_list, default=None,
                   help="thread counts, e.g. 1-4 or 1,2,4 (default: 1..the cores this process may use)")
    p.add_argument("--batches", type=int_list, default=None,
                   help=f"batch sizes (default: {DEFAULT_BATCHES}, or the replayed profile's)")
    p.add_argument("--warmup", type=int, default=profiler.DEFAULT_WARMUP,
                   help=f"untimed runs before measuring (default: {profiler.DEFAULT_WARMUP})")
    timing = p.add_mutually_exclusive_group()
    timing.add_argument("--min-time", type=positive(float), default=None, metavar="S",
                        help="time runs for at least S seconds per point, at least 3 runs (default: "
                             f"{profiler.DEFAULT_MIN_TIME_S:g}; the served figure as long again)")
    timing.add_argument("--iters", type=positive(int), default=None,
                        help="instead of --min-time: this many timed runs per point")
    graph_mode_args(p)
    p.add_argument("--runtimes", type=runtime_list, default=None, metavar="LIST",
                   help="the runtimes to measure under, e.g. inductor,openvino,onnxruntime: inductor is "
                        "torch in --graph-mode; openvino and onnxruntime install with packrat. "
                        "The planner takes the fastest runtime measured at each point, so one plan may mix them; "
                        "a runtime whose outputs differ from eager torch's is refused, with the reason "
                        "(default: every runtime installed here but torch-compile, which compiles in every process)")
    p.add_argument("--ios", action="store_true",
                   help="measure the ios runtime too, after the others: the model run by an IOS schedule "
                        "(independent operators side by side on disjoint threads), searched once per threads and "
                        "batch and cached in --ios-cache. Only where it can gain: batch <= 4 where the other "
                        "runtimes leave half the threads idle (everywhere with --every-runtime); the planner takes "
                        "it where it serves faster")
    ios_cache_arg(p)
    contention_args(p)
    served = p.add_mutually_exclusive_group()
    served.add_argument("--payload", choices=("jpeg", "text", "raw"), default=None,
                        help="the request bodies each point's served figure (served_ms) answers: every run decodes "
                             "a sub-batch of them into its rows, runs the model and encodes each answer, as a pool "
                             "instance does (default: the model's natural payload: jpeg for an image model, text "
                             "for a token model with a tokenizer, raw tensor bytes otherwise, token models without "
                             "a tokenizer included)")
    served.add_argument("--model-only", action="store_true",
                        help="time the model alone on example tensors (latency_ms) and skip the served figure: "
                             "the profile then plans on the model alone, blind to decoding and encoding")
    p.add_argument("--every-runtime", action="store_true",
                   help="with --ios: measure the ios runtime at every point the others were measured at")
    search_args(p)
    replay_args(p)
    p.add_argument("--out", type=Path, default=None, help="profile CSV (default: profiles/MODEL.csv)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_profile)


def replay_args(p: argparse.ArgumentParser) -> None:
    """What a replay's simulated clock and noise are (profiling/replay.py)."""
    from packrat.profiling.costs import DEFAULT_BUILD_S, DEFAULT_LOAD_S

    p.add_argument("--noise", type=float, default=0.0, metavar="SHARE",
                   help="with --replay: each run's figure is the table's times lognormal noise of this share (a "
                        "real machine gives 0.03-0.05), seeded by the point; runs stop as real ones do "
                        "(default: 0, the table as it is)")
    p.add_argument("--seed", type=int, default=0, help="with --replay and --noise: the noise's seed (default: 0)")
    p.add_argument("--load-s", type=positive(float), default=None, metavar="S",
                   help="with --replay: what starting and loading a worker group costs (default: %g s, the "
                        "2-core account)" % DEFAULT_LOAD_S)
    p.add_argument("--build-s", type=positive(float), default=None, metavar="S",
                   help="with --replay: what one package costs to build on one core, for inductor in compile "
                        "mode (default: %g s, the 2-core account)" % DEFAULT_BUILD_S)


def runtime_list(text: str) -> tuple[str, ...]:
    from packrat.models.runtimes import parse

    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def profile_settings(args: argparse.Namespace) -> profiler.ProfileSettings:
    min_time = None if args.iters else (args.min_time or profiler.DEFAULT_MIN_TIME_S)
    return profiler.ProfileSettings(model=args.model, warmup=args.warmup, iters=args.iters,
                             min_time=min_time, graph_mode=args.graph_mode, input_shape=args.input_shape,
                             ios_cache=str(args.ios_cache), contention=args.contention,
                                    isolated_too=args.isolated_too, served=not args.model_only, payload=args.payload)


def profile_grid(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    """--threads and --batches, defaulting to the replayed profile's grid, else 1..cores × DEFAULT_BATCHES."""
    if args.replay:
        source = load(args.replay)
        return args.threads or source.threads, args.batches or source.batches
    return args.threads or list(range(1, local_cores() + 1)), args.batches or int_list(DEFAULT_BATCHES)


def cmd_profile(args: argparse.Namespace) -> int:
    from packrat.serving.paths import measure_paths  # the pool: not at import (the parser starts without it)

    settings = profile_settings(args)
    threads, batches = profile_grid(args)
    say = lambda line: print(line, file=sys.stderr)  # noqa: E731
    runtimes = args.runtimes or (("inductor",) if args.replay else profiler.default_runtimes(say))
    if args.ios and "ios" not in runtimes:
        runtimes += ("ios",)
    out = args.out or default_profile_path(args.model)
    try:
        done = profiler.search_profile(settings, threads, batches, out, replay=args.replay,
                                       budget_s=None if args.full_grid else args.budget_s or profiler.SCALED,
                                       progress=not args.quiet and not args.json, runtimes=runtimes, say=say,
                                       full_grid=args.full_grid, every_runtime=args.every_runtime,
                                       noise=args.noise, seed=args.seed, costs=replay_costs(args),
                                       path_probe=measure_paths)
    except KeyboardInterrupt:
        print(f"\ninterrupted: the points measured so far are in {out}; run the same command to resume",
              file=sys.stderr)
        return 130
    print_search(done, out, args.json)
    return 0


def replay_costs(args: argparse.Namespace) -> dict:
    """The fixed costs a replay charges where --load-s or --build-s set them."""
    return {name: value for name, value in (("load_s", args.load_s), ("build_s", args.build_s)) if value is not None}


def print_search(done: profiler.SearchResult, out: Path, as_json: bool) -> None:
    if as_json:
        print(json.dumps(done.to_json(out), indent=2))
        return
    result = done.profile
    if result is None:
        print(f"no point measured in {out}: {done.stopped}; run the same command (with a larger --budget-s) to resume")
    else:
        counts = ", ".join(f"{len(result.by_runtime[r])} {r}" for r in result.measured_runtimes)
        basis = f"served figures from {result.payload} bodies" if result.basis == "served" else "model-only figures"
        print(f"{done.points} of the grid's {done.grid} points ({done.points / done.grid:.0%}) in {out} ({counts}; "
              f"{basis}): {done.stopped}")
    print(profiler.within_text(done.within))
    print(done.fit_line())
    for line in done.account.lines():
        print(line)
