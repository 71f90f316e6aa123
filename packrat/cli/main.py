"""The `packrat` command: profile a model, plan instances, plot, archive, serve, load-test, run the demo.

Each command's section holds its parser, `add_NAME_parser(sub)`, beside its code, `cmd_NAME(args)`;
the argument groups several commands share (model_args, batching_args, request_args,
recovery_args, run_dir_arg) come first. build_parser makes the top parser and calls each
add_*_parser. Heavy modules (torch, matplotlib, locust) are imported only by the commands that
use them, so `packrat --help` starts fast."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path

from packrat.cli import bench
from packrat.models import modes
from packrat.profiling import profiler
from packrat.errors import ProfilingError
from packrat.deploy import torchserve
from packrat.deploy import archive
from packrat.frontends import torchserve_control
from packrat.errors import ServeError
from packrat.errors import NoPlanError
from packrat.planning.planner import Plan, Planner
from packrat.profiling.profiles import LATENCIES, load
from packrat.errors import ProfileError
from packrat.machine.budget import cpu_budget
from packrat.machine.budget import describe as describe_budget
from packrat.machine.topology import Topology

DEFAULT_BATCHES = "1,2,4,8,16,32,64"
DEFAULT_RUN_DIR = Path(".packrat/serve")

def int_list(text: str) -> list[int]:
    """argparse type for '1-4,8,16': sorted distinct positive integers (argparse names the flag)."""
    values: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            values.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list like 1-4 or 1,2,8") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must name integers >= 1")
    return sorted(values)


def positive(kind: type, zero: bool = False):
    """argparse type: a number > 0 (>= 0 with zero=True) of the given kind."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (value >= 0 if zero else value > 0):
            raise argparse.ArgumentTypeError(f"must be {'>=' if zero else '>'} 0, got {text}")
        return value

    return parse


def shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape like 3,224,224") from None


def users_list(text: str) -> list:
    """argparse type for --users: patterns relative to the batch size B, e.g. B,2B or 4,2B."""
    try:
        return bench.parse_users(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def tokenizer_path(text: str) -> Path:
    """argparse type for --tokenizer: a directory holding tokenizer.json, or the file; gives the file."""
    path = Path(text)
    if path.is_dir():
        path = path / "tokenizer.json"
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"no tokenizer.json in {text}")
    elif not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} does not exist (give a directory holding tokenizer.json, "
                                         f"or the file)")
    return path


def labels_path(text: str) -> Path:
    """argparse type for --labels: TorchServe's index_to_name.json ({"0": "name", ...})."""
    path = Path(text)
    try:
        labels = json.loads(path.read_text())
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {exc.strerror}") from None
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not JSON") from None
    if not isinstance(labels, dict) or not labels:
        raise argparse.ArgumentTypeError(f'{text} must hold an object like {{"0": "tench", "1": "goldfish"}}')
    return path


def local_cores() -> int:
    """The cores this process may use: its CPU budget (affinity, CFS quota, $PACKRAT_CORES)."""
    return cpu_budget().cores


def topology_for(threads: int) -> Topology:
    """The budget's cores when the plan fits on them, else a made-up T-core machine."""
    local = cpu_budget().topology
    return local if threads <= local.num_cores else Topology.virtual(threads)


# ---- output -------------------------------------------------------------------------------

def _cores_text(cores: tuple[int, ...]) -> str:
    if cores and list(cores) == list(range(cores[0], cores[-1] + 1)) and len(cores) > 1:
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


def _fat_text(plan: Plan) -> str:
    if plan.fat_latency_ms is None:
        return f"fat ⟨1 × {plan.threads} threads, batch {plan.batch}⟩ not profiled"
    return (f"fat ⟨1 × {plan.threads} threads, batch {plan.batch}⟩ {plan.fat_latency_ms:.1f} ms, "
            f"speedup {plan.speedup:.2f}×")


def print_plan(plan: Plan, latency: str) -> None:
    print(f"Plan for T={plan.threads} threads, B={plan.batch}, {latency} latencies: {plan.describe()}")
    print(f"  {'instance':>8}  {'threads':>7}  {'batch':>5}  {'latency_ms':>10}  cores")
    for n, inst in enumerate(plan.instances, start=1):
        print(f"  {n:>8}  {inst.threads:>7}  {inst.batch:>5}  {inst.latency_ms:>10.1f}  {_cores_text(inst.cores)}")
    print(f"expected latency {plan.expected_latency_ms:.1f} ms; {_fat_text(plan)}")


def print_plan_table(plans: list[Plan], skipped: list[str]) -> None:
    print(f"{'B':>5}  {'expected_ms':>11}  {'fat_ms':>9}  {'speedup':>7}  plan")
    for p in plans:
        fat = f"{p.fat_latency_ms:.1f}" if p.fat_latency_ms else "-"
        speed = f"{p.speedup:.2f}×" if p.speedup else "-"
        print(f"{p.batch:>5}  {p.expected_latency_ms:>11.1f}  {fat:>9}  {speed:>7}  {p.describe()}")
    for line in skipped:
        print(line)


# ---- argument groups shared by several commands ----------------------------------------------

def graph_mode_args(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--graph-mode", choices=modes.MODES, default=modes.DEFAULT_MODE,
                       help="how the model runs: compile (torch.compile, inductor with frozen weights; the default), "
                            "script (TorchScript trace + freeze, the old default) or eager. The profile records it "
                            "and the server runs its instances the same way")
    group.add_argument("--eager", dest="graph_mode", action="store_const", const="eager",
                       help="the same as --graph-mode eager")


def ios_cache_arg(p: argparse.ArgumentParser, why: str = "where IOS schedules are kept") -> None:
    p.add_argument("--ios-cache", type=Path, default=archive.DEFAULT_IOS_CACHE,
                   help=f"{why} (default: {archive.DEFAULT_IOS_CACHE})")


def model_args(p: argparse.ArgumentParser,
               profile_help: str = "profile CSV (default: profiles/MODEL.csv; when that is missing, one is "
                                   "measured there first on a small grid and reused next time)",
               several_profiles: bool = False) -> None:
    p.add_argument("--model", default="resnet50",
                   help="zoo name, hf:DIR (a Hugging Face save_pretrained directory), a torch.export program "
                        "(.pt2), a TorchScript file or package.module:factory (default: resnet50)")
    if several_profiles:
        p.add_argument("--profile", type=Path, action="append", default=None,
                       help=profile_help + "; give it once per machine type (say, one profile taken on 4 "
                                           "cores and one on 16): each server plans with the one taken on its "
                                           "CPU model with the closest core count")
    else:
        p.add_argument("--profile", type=Path, default=None, help=profile_help)
    p.add_argument("--input-shape", type=shape, default=None, help="one input sample's shape, e.g. 3,224,224")


def batching_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-size", type=positive(int), default=8,
                   help="TorchServe's batch size B; the plan is made for it (default: 8)")
    p.add_argument("--max-batch-delay", type=positive(int), default=50, metavar="MS",
                   help="how long TorchServe waits to fill a batch (default: 50 ms)")
    p.add_argument("--plan", choices=("auto", "fat"), default="auto",
                   help="auto: the planner's instances; fat: one instance with every core (default: auto)")
    p.add_argument("--no-reconfigure", dest="reconfigure", action="store_false",
                   help="keep the plan for --batch-size instead of following the observed batch sizes")
    ios_cache_arg(p, "a profile taken with --ios is served by IOS-compiled instances; their schedules come "
                     "from here")


def request_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", type=tokenizer_path, default=None, metavar="DIR",
                   help="a directory holding a Hugging Face tokenizer.json (or the file): token models then "
                        "also take text/plain requests")
    p.add_argument("--labels", type=labels_path, default=None, metavar="FILE",
                   help='class names for classifier answers: TorchServe\'s index_to_name.json '
                        '({"0": "tench", ...})')
    p.add_argument("--max-body-mb", type=positive(float), default=16.0, metavar="MB",
                   help="largest request body accepted; larger ones get 413 (default: 16)")
    p.add_argument("--truncate-text", action="store_true",
                   help="cut text longer than the model takes to its length (default: answer it 413)")


def recovery_args(p: argparse.ArgumentParser) -> None:
    """How the pool recovers requests; left out, a setting is not written and the pool's default applies."""
    p.add_argument("--request-timeout", type=positive(float), default=None, metavar="S",
                   help="how long a request may wait and run before it is answered 504; in line with "
                        "TorchServe's default_response_timeout (default: the pool's, 120 s)")
    p.add_argument("--max-queue", type=positive(int), default=None, metavar="N",
                   help="requests waiting beyond this are answered 503 at once (default: the pool's, 1000)")
    p.add_argument("--batch-timeout", type=positive(float), default=None, metavar="S",
                   help="a batch running longer than this marks its instance hung: it is killed, its requests "
                        "re-run elsewhere, and it is respawned (default: 10 × the profile's latency for the batch, "
                        "at least 5 s)")


def run_dir_arg(p: argparse.ArgumentParser, what: str = f"default: {DEFAULT_RUN_DIR}") -> None:
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR, help=what)


# ---- profile ----------------------------------------------------------------------------------

def add_profile_parser(sub) -> None:
    p = sub.add_parser("profile", help="measure L(t, b) for a model, one fresh pinned process per point",
                       description="Measure the latency of one model instance for every thread count t and batch "
                                   "size b of a grid. Each point runs in a fresh process pinned to t physical cores "
                                   "of one socket (torch.set_num_threads(t), one inter-op thread). With "
                                   f"--contention{' (the default)' if profiler.DEFAULT_CONTENTION else ''} each "
                                   "point is also measured while ⌊T/t⌋ copies of it run side by side on the T "
                                   "cores this process may use, as a plan of that point runs them. Points "
                                   "already in --out are skipped, so an interrupted run resumes where it stopped.",
                       epilog="example: packrat profile --model resnet50 --threads 1-2 --batches 1,2,4,8,16 "
                              "--min-time 2 --out profiles/resnet50.csv")
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
    p.add_argument("--warmup", type=int, default=10, help="untimed runs before measuring (default: 10)")
    timing = p.add_mutually_exclusive_group()
    timing.add_argument("--iters", type=positive(int), default=100,
                        help="timed runs per point (default: 100)")
    timing.add_argument("--min-time", type=positive(float), default=None, metavar="S",
                        help="instead of --iters: time runs for at least S seconds per point (≥ 3 runs)")
    graph_mode_args(p)
    p.add_argument("--ios", action="store_true",
                   help="profile IOS-compiled instances: each point runs the model by the IOS schedule for its "
                        "threads and batch (searched once, then cached in --ios-cache)")
    ios_cache_arg(p)
    contention_args(p)
    adaptive_args(p)
    p.add_argument("--out", type=Path, default=None, help="profile CSV (default: profiles/MODEL.csv)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_profile)


def profile_settings(args: argparse.Namespace) -> profiler.Settings:
    return profiler.Settings(model=args.model, warmup=args.warmup, iters=None if args.min_time else args.iters,
                             min_time=args.min_time, graph_mode=args.graph_mode, input_shape=args.input_shape,
                             ios_cache=str(args.ios_cache) if args.ios else None, contention=args.contention)


def profile_grid(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    """--threads and --batches, defaulting to the replayed profile's grid, else 1..cores × DEFAULT_BATCHES."""
    if args.replay:
        source = load(args.replay)
        return args.threads or source.threads, args.batches or source.batches
    return args.threads or list(range(1, local_cores() + 1)), args.batches or int_list(DEFAULT_BATCHES)


def cmd_profile(args: argparse.Namespace) -> int:
    settings = profile_settings(args)
    threads, batches = profile_grid(args)
    out = args.out or default_profile_path(args.model)
    try:
        if args.adaptive or args.replay:
            done = profiler.run_adaptive(settings, threads, batches, out, replay=args.replay, slack=args.slack,
                                         tolerance=args.tolerance, progress=not args.quiet and not args.json)
            print_adaptive(done, out, args.json)
            return 0
        result = profiler.run(settings, threads, batches, out, progress=not args.quiet)
    except KeyboardInterrupt:
        print(f"\ninterrupted: the points measured so far are in {out}; run the same command to resume",
              file=sys.stderr)
        return 130
    print(f"{len(result.latency)} points in {out}")
    return 0


def print_adaptive(done: profiler.AdaptiveResult, out: Path, as_json: bool) -> None:
    if as_json:
        print(json.dumps(done.to_json(out), indent=2))
        return
    print(f"{done.points} of the grid's {done.grid} points ({done.points / done.grid:.0%}) in {out}: no other "
          f"point can change a plan")
    print(f"estimated measuring time {_about(done.measure_s)} instead of {_about(done.full_grid_s)} for the "
          f"full grid ({done.saved:.0%} saved)")


def contention_args(p: argparse.ArgumentParser) -> None:
    """--contention / --isolated; the default lives in profiler.DEFAULT_CONTENTION."""

    def default(contention: bool) -> str:
        return " (the default)" if contention == profiler.DEFAULT_CONTENTION else ""

    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--contention", dest="contention", action="store_true",
                      default=profiler.DEFAULT_CONTENTION,
                      help="measure each ⟨t, b⟩ alone and again while ⌊T/t⌋ copies of it, each pinned to its own "
                           "t cores, run side by side, as a plan of that point runs them; the profile's latency_ms "
                           "is then the loaded mean, isolated_ms the lone one. Costs about twice the time of "
                           "--isolated for every t ≤ T/2" + default(True))
    kind.add_argument("--isolated", dest="contention", action="store_false",
                      help="measure each ⟨t, b⟩ alone, with the rest of the machine idle: cheaper, but blind to "
                           "the memory bandwidth and caches that instances share, so it over-predicts what many "
                           "small instances gain" + default(False))


def adaptive_args(p: argparse.ArgumentParser) -> None:
    from packrat.profiling.adaptive import DEFAULT_SLACK

    p.add_argument("--adaptive", action="store_true",
                   help="measure only the points that can change a plan for some T ≤ the largest --threads and "
                        "B ≤ the largest batch size: starting from 1 thread at every batch size, bound the "
                        "unmeasured points from the measured ones (latency grows with the batch, scaling is at "
                        "most linear and its returns diminish; see packrat/adaptive.py) and stop when no "
                        "bound can beat a plan")
    p.add_argument("--replay", type=Path, default=None, metavar="FILE",
                   help="with --adaptive (implied): look points up in FILE, a full profile (also the published "
                        "Packrat layout), instead of measuring them; --out is rewritten with the points looked up, "
                        "to check the method against the full table")
    p.add_argument("--slack", type=positive(float, zero=True), default=None, metavar="S",
                   help=f"with --adaptive: noise allowed in the bounds' assumptions, as a fraction "
                        f"(default: {DEFAULT_SLACK})")
    p.add_argument("--tolerance", type=positive(float, zero=True), default=0.0, metavar="F",
                   help="with --adaptive: stop when no point can improve a plan by more than this fraction "
                        "(default: 0, every plan as the full grid's)")
    p.add_argument("--json", action="store_true",
                   help='with --adaptive: print {"points", "grid", "fraction", "measure_s", "full_grid_s", '
                        '"saved_s", "saved", "out"} (times are estimates)')


# ---- plan -------------------------------------------------------------------------------------

def add_plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="the latency-optimal instances for T threads and batch B",
                       description="Choose instances ⟨threads, batch⟩ (they may differ) whose threads sum to at "
                                   "most T and whose batches sum to B, minimising the slowest instance's "
                                   "profiled latency (exact dynamic program). Ties go to fewer instances, then "
                                   "fewer threads. The profile may come from another machine: T may exceed this "
                                   "machine's cores (cores are then numbered 0..T-1). Exit status 2 when no plan "
                                   "is possible.",
                       epilog="example: packrat plan --profile profiles/resnet50.csv --threads 16 --batch 32 --json")
    p.add_argument("--profile", type=Path, required=True, help="profile CSV written by `packrat profile`")
    p.add_argument("--threads", type=positive(int), default=None,
                   help="T, the cores to plan for (default: the cores this process may use)")
    p.add_argument("--batch", type=positive(int), default=None,
                   help="B, the batch to serve (default: every profiled batch size, as a table)")
    p.add_argument("--latency", choices=LATENCIES, default=None,
                   help="which profiled figure to plan with: loaded (measured beside copies of itself, from "
                        "`packrat profile --contention`) or isolated (measured alone) (default: the profile's "
                        "primary figure, loaded where it has one)")
    p.add_argument("--json", action="store_true",
                   help="print JSON: {threads, batch, expected_latency_ms, fat_latency_ms, instances: "
                        "[{threads, batch, cores}], latency: loaded|isolated} (a list of them without --batch)")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    profile = load(args.profile)
    threads = args.threads or local_cores()
    batches = [args.batch] if args.batch else profile.batches
    latency = args.latency or profile.figures[0]
    planner = Planner(profile.items(latency), threads, max(batches))
    topology = topology_for(threads)
    plans, skipped = [], []
    for batch in batches:
        try:
            plans.append(planner.plan(threads, batch, topology))
        except NoPlanError as exc:
            if args.batch:
                raise
            skipped.append(f"B={batch}: no plan: {exc}")
    if args.json:
        body = [{**p.to_json(), "latency": latency} for p in plans]
        print(json.dumps(body[0] if args.batch else body, indent=2))
    elif args.batch:
        print_plan(plans[0], latency)
    else:
        print(f"Plans for T={threads} threads, model {profile.metadata.get('model', '?')} ({args.profile}), "
              f"{latency} latencies, {profile.metadata['mode']} mode")
        print_plan_table(plans, skipped)
    return 0


# ---- plot -------------------------------------------------------------------------------------

def add_plot_parser(sub) -> None:
    p = sub.add_parser("plot", help="PNG heat-map of L(t, b) and planned vs fat latency per batch",
                       epilog="example: packrat plot --profile profiles/resnet50.csv --threads 2 --out plots")
    p.add_argument("--profile", type=Path, required=True, help="profile CSV")
    p.add_argument("--threads", type=positive(int), default=None,
                   help="T for the planned-vs-fat plot (default: the largest profiled thread count)")
    p.add_argument("--out", type=Path, default=Path("plots"), help="output directory (default: plots)")
    p.set_defaults(func=cmd_plot)


def cmd_plot(args: argparse.Namespace) -> int:
    from packrat.profiling import plots

    profile = load(args.profile)
    threads = args.threads or max(profile.threads)
    for path in plots.write_all(profile, threads, args.out):
        print(f"wrote {path}")
    return 0


# ---- the default profile: profiles/MODEL.csv, measured when missing --------------------------

DEMO_BATCHES = (1, 2, 4, 8)
DEMO_MIN_TIME_S = 2.0
DEMO_WARMUP = 3
POINT_OVERHEAD_S = profiler.POINT_OVERHEAD_S


def default_profile_path(model: str) -> Path:
    return Path("profiles") / f"{Path(model).stem.replace(':', '_')}.csv"


def _about(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def measure_profile(model: str, path: Path, batches, *, min_time: float = DEMO_MIN_TIME_S,
                    input_shape: tuple[int, ...] | None = None, progress: bool = True):
    """Profile the demo's grid into `path`: threads 1..the local cores, `batches`, `min_time` s of
    timed runs per point after 3 warm-up runs, loaded or isolated as profiler.DEFAULT_CONTENTION
    says, with the profiler's progress bar.

    Points already in an existing file are kept (only missing ones are measured, in the kind the
    file holds: an older cache stays isolated). A new file is measured as PATH.partial.csv and
    renamed when complete, so an interrupted run never leaves half a profile where it would be
    used; the same command resumes it."""
    settings = profiler.Settings(model=model, warmup=DEMO_WARMUP, iters=None, min_time=min_time,
                                 input_shape=input_shape)
    threads = list(range(1, local_cores() + 1))
    batches = sorted(set(batches))
    if path.exists():
        return profiler.run(_same_kind(settings, path), threads, batches, path, progress=progress)
    partial = path.with_name(path.stem + ".partial.csv")
    profiler.run(_same_kind(settings, partial), threads, batches, partial, progress=progress)
    partial.replace(path)
    return load(path)


def _same_kind(settings: profiler.Settings, path: Path) -> profiler.Settings:
    """`settings` measuring what the profile at `path` holds (loaded or isolated), if it holds any."""
    if not path.exists() or path.stat().st_size == 0:
        return settings
    return dataclasses.replace(settings, contention=load(path).loaded)


def resolve_profile(model: str, given: Path | None, *, batch_sizes=(),
                    input_shape: tuple[int, ...] | None = None) -> Path:
    """The profile serve, archive and bench use: `given` (which must exist), else profiles/MODEL.csv,
    measured first (measure_profile on batches 1, 2, 4, 8 and `batch_sizes`) when it is missing."""
    if given is not None:
        if not given.exists():
            raise ValueError(f"no profile at {given} (--profile): run `packrat profile --model {model} "
                             f"--out {given}` first, or leave --profile out to use {default_profile_path(model)}")
        return given
    path = default_profile_path(model)
    if path.exists():
        return path
    batches = sorted(set(DEMO_BATCHES) | set(batch_sizes))
    cores = local_cores()
    points = cores * len(batches)
    # Measurements, not points: with contention (measure_profile's default) a loaded point takes two.
    runs = len(batches) * sum(profiler.measurements(profiler.Settings(model), t, Topology.virtual(cores))
                              for t in range(1, cores + 1))
    print(f"no profile at {path}: measuring one now ({points} points, about "
          f"{_about(runs * (DEMO_MIN_TIME_S + POINT_OVERHEAD_S))}); next time it is reused", file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    measure_profile(model, path, batches, input_shape=input_shape)
    return path


# ---- archive, serve ---------------------------------------------------------------------------

def archive_extras(args: argparse.Namespace) -> dict:
    """archive.archive's request settings from --tokenizer, --labels, --max-body-mb, --truncate-text, and its
    recovery settings from --request-timeout, --max-queue, --batch-timeout (None: the pool's default)."""
    return {"tokenizer": args.tokenizer, "labels": args.labels, "max_body_bytes": int(args.max_body_mb * 2**20),
            "truncate_text": args.truncate_text, "request_timeout_s": args.request_timeout,
            "max_queue": args.max_queue, "batch_timeout_s": args.batch_timeout}


def archive_from_args(args: argparse.Namespace, out_dir: Path, handler: str = "packrat") -> Path:
    """archive.archive from the model, batching, request, recovery and --cores arguments; the packrat
    handler's profiles are resolved (the default one measured when missing) first."""
    profiles = ([resolve_profile(args.model, given, batch_sizes=[args.batch_size], input_shape=args.input_shape)
                 for given in args.profile or [None]] if handler == "packrat" else None)
    return archive.build(args.model, profiles, out_dir, batch_size=args.batch_size,
                           max_batch_delay_ms=args.max_batch_delay, plan=args.plan, handler=handler,
                           input_shape=args.input_shape, reconfigure=args.reconfigure, ios_cache=args.ios_cache,
                           cores=args.cores, **archive_extras(args))


def archive_args(p: argparse.ArgumentParser) -> None:
    """What archive and serve share: the model, batching, request and recovery arguments, and --cores."""
    model_args(p, several_profiles=True)
    p.add_argument("--cores", type=positive(int), default=None, metavar="N",
                   help="plan for at most N cores, written into the archive (default: every core this "
                        "process may use: its CPU affinity, cut to its cgroup's CPU quota, or $PACKRAT_CORES). "
                        "More than the machine gives is cut to what it gives")
    batching_args(p)
    request_args(p)
    recovery_args(p)


def add_archive_parser(sub) -> None:
    p = sub.add_parser("archive", help="build the model archive (.mar) for TorchServe",
                       description="Build NAME.mar with torch-model-archiver: the packrat handler, the profile "
                                   "and a model-config.yaml (batch size, delay, one worker, packrat settings). "
                                   "The worker plans for the batch size and the cores it may use.",
                       epilog="example: packrat archive --model resnet50 --batch-size 8 --export-path model_store")
    archive_args(p)
    p.add_argument("--handler", choices=("packrat", "stock"), default="packrat",
                   help="packrat (default) or stock: the in-process baseline handler, TorchServe's default workers")
    p.add_argument("--export-path", type=Path, default=Path("model_store"), help="default: model_store")
    p.set_defaults(func=cmd_archive)


def cmd_archive(args: argparse.Namespace) -> int:
    mar = archive_from_args(args, args.export_path, args.handler)
    print(f"wrote {mar}")
    return 0


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="start TorchServe with the packrat handler and wait until it is READY",
                       description="Archive the model, write a TorchServe config (loopback addresses, every "
                                   "port set, token authorisation on unless disabled, quiet logs), run "
                                   "`torchserve --start`, and wait until the management API shows every "
                                   "worker READY. The model is served as /predictions/NAME.",
                       epilog="example: packrat serve --model resnet50 --batch-size 8 --max-batch-delay 50")
    archive_args(p)
    p.add_argument("--inference-port", type=positive(int), default=8080)
    p.add_argument("--management-port", type=positive(int), default=8081)
    p.add_argument("--metrics-port", type=positive(int), default=8082)
    p.add_argument("--grpc-inference-port", type=positive(int), default=7070)
    p.add_argument("--grpc-management-port", type=positive(int), default=7071)
    p.add_argument("--disable-token-auth", action="store_true",
                   help="turn TorchServe's token authorisation off (it is on by default)")
    p.add_argument("--oip", action="store_true",
                   help="also serve the KServe v2 / Open Inference Protocol (POST /v2/models/NAME/infer, "
                        "tritonclient's binary tensors included): TS_OPEN_INFERENCE_PROTOCOL=oip")
    run_dir_arg(p, f"config, logs, key file and TorchServe's TEMP (default: {DEFAULT_RUN_DIR})")
    p.add_argument("--timeout", type=positive(float), default=300.0, help="seconds to wait for READY")
    ray = p.add_argument_group("--engine ray", "serve on a running Ray cluster (`ray start --head` on one "
                                               "node, `ray start --address HEAD:6379` on the others) instead of "
                                               "TorchServe; needs `pip install packrat[ray]`")
    ray.add_argument("--engine", choices=("torchserve", "ray"), default="torchserve",
                     help="torchserve (default): this machine, TorchServe's frontend; ray: one packrat engine "
                          "per node of the Ray cluster, each planned for its node's CPU budget and profile")
    ray.add_argument("--ray-address", default="auto", help="the cluster to deploy on (default: auto, the local one)")
    ray.add_argument("--replicas", type=positive(int), default=None,
                     help="engines (Ray Serve replicas), at most one per node (default: the cluster's alive nodes)")
    ray.add_argument("--http-host", default="127.0.0.1",
                     help="the address Ray Serve's proxy listens on (default: 127.0.0.1, loopback)")
    ray.add_argument("--http-port", type=positive(int), default=8000, help="default: 8000")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    if args.engine == "ray":
        return serve_on_ray(args)
    run_dir = args.run_dir.resolve()
    mar = archive_from_args(args, run_dir / "model_store")
    name = mar.stem
    ports = torchserve.Ports(args.inference_port, args.management_port, args.metrics_port,
                          args.grpc_inference_port, args.grpc_management_port)
    print(f"starting TorchServe for {name} (batch size {args.batch_size}); waiting for every worker READY ...")
    server = torchserve.start(torchserve.Server(run_dir, name, ports, token_auth=not args.disable_token_auth,
                                          oip=args.oip), mar, timeout=args.timeout)
    print(f"ready: POST {server.inference_url}/predictions/{name}")
    try:
        print_budget_and_profile(torchserve.handler_status(server))
    except ServeError as exc:  # serving goes on; only the report is missing
        print(f"(the handler did not report its CPU budget: {exc})")
    if server.oip:
        print(f"Open Inference Protocol: POST {server.inference_url}/v2/models/{name}/infer")
    print(f"management: {server.management_url}   metrics: http://127.0.0.1:{ports.metrics}/metrics")
    if server.token_auth:
        print(f"token authorisation is on: keys in {server.key_file} "
              f"(send 'Authorization: Bearer <inference key>')")
    print(f"logs: {run_dir / 'logs'}   stop with: packrat stop --run-dir {args.run_dir}")
    return 0


def ray_app_args(args: argparse.Namespace) -> dict:
    """packrat.ray_serve.app's arguments: the settings an archive's packrat section would hold, with
    files as absolute paths (profiles are sent to the replicas; models, tokenizers and labels must
    be on every node at the same path)."""
    profiles = [resolve_profile(args.model, given, batch_sizes=[args.batch_size], input_shape=args.input_shape)
                for given in args.profile or [None]]
    model = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model
    settings = {key: value for key, value in archive_extras(args).items() if value is not None}
    for key in ("tokenizer", "labels"):
        if key in settings:
            settings[key] = str(Path(settings[key]).resolve())
    return {"model": model, "profiles": [str(Path(p).resolve()) for p in profiles], "max_batch": args.batch_size,
            "plan": args.plan, "reconfigure": args.reconfigure, "cores": args.cores,
            "input_shape": list(args.input_shape) if args.input_shape else None,
            **({"replicas": args.replicas} if args.replicas else {}), **settings}


def serve_on_ray(args: argparse.Namespace) -> int:
    try:
        from packrat.frontends import ray_serve
    except ImportError as exc:
        raise ServeError(f"--engine ray needs Ray Serve: pip install 'packrat[ray]' ({exc})") from exc
    app_args = ray_app_args(args)
    print(f"deploying {args.model} on the Ray cluster at {args.ray_address}, one engine per node ...")
    url, name = ray_serve.deploy(app_args, address=args.ray_address, host=args.http_host, port=args.http_port,
                                 timeout_s=args.timeout)
    print(f"ready: POST {url}/predictions/{name} (or {url}/v2/models/{name}/infer); GET {url}/v2/models/{name}/ready")
    print(f"each replica's plan and CPU budget: GET {url}/status; stop with: packrat stop --engine ray")
    return 0


def print_budget_and_profile(status: dict) -> None:
    """The cores the handler plans for and why, and the profile it chose (see packrat/engine.py)."""
    budget = status.get("cpu_budget")
    if budget:
        print(f"CPU budget: {describe_budget(budget)}")
    if status.get("profile"):
        print(f"profile: {status['profile']}")


# ---- stop, status, reconfigure: the server a run dir records -----------------------------------

def add_stop_parser(sub) -> None:
    p = sub.add_parser("stop", help="stop the TorchServe started by `packrat serve` and wait for it to exit")
    run_dir_arg(p)
    p.add_argument("--engine", choices=("torchserve", "ray"), default="torchserve",
                   help="ray: remove what `packrat serve --engine ray` deployed from the Ray cluster")
    p.add_argument("--ray-address", default="auto", help="with --engine ray: the cluster (default: auto)")
    p.set_defaults(func=cmd_stop)


def cmd_stop(args: argparse.Namespace) -> int:
    if args.engine == "ray":
        from packrat.frontends import ray_serve

        ray_serve.shutdown(args.ray_address)
        print("Ray Serve applications removed (the Ray cluster keeps running: `ray stop` on each node stops it)")
        return 0
    server = torchserve.Server.load(args.run_dir.resolve())
    torchserve.stop(server)
    print("stopped" if not torchserve.java_running(server) else "TorchServe is still running")
    return 0 if not torchserve.java_running(server) else 1


def add_status_parser(sub) -> None:
    p = sub.add_parser("status", help="the served plan and the last reconfigurations",
                       description="Ask the running packrat handler (through TorchServe's management API) for "
                                   "its current plan, how its instances run the model (compile, script, eager or ios) "
                                   "and its recent reconfigurations.")
    run_dir_arg(p)
    p.add_argument("--last", type=positive(int), default=10, help="reconfigurations to list (default: 10)")
    p.add_argument("--json", action="store_true",
                   help='print {"plan": <as packrat plan --json>, "mode": "compile"|"script"|"eager"|"ios", "health": {"instances", '
                        '"ready", "respawning", "respawn_failures", "unavailable", "queued", "answered", "refused"}, '
                        '"reconfigurations": [{"from_batch", "to_batch", '
                        '"reason", "seconds", "failed_requests", ...}], "cpu_budget": {"cores", "source", '
                        '"detail"}, "profile": "NAME: why it was chosen"}')
    p.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    server = torchserve.Server.load(args.run_dir.resolve())
    status = torchserve.handler_status(server)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    plan = status["plan"]
    shapes = ", ".join(f"⟨{i['threads']} threads, batch {i['batch']}, cores {_cores_text(tuple(i['cores']))}⟩"
                       for i in plan["instances"])
    print(f"model {server.model} ({status.get('mode', '?')}): serving B={plan['batch']} on T={plan['threads']} "
          f"threads: {shapes}")
    print_budget_and_profile(status)
    health = status.get("health")
    if health:
        state = f"UNAVAILABLE: {health['unavailable']}" if health.get("unavailable") else "serving"  # null dropped
        print(f"instances: {health['ready']}/{health['instances']} ready, {health['respawning']} respawning, "
              f"{health['respawn_failures']} failed respawn attempt(s); {health['queued']} queued, "
              f"{health['answered']} answered, {health['refused']} refused (503); {state}")
        print(f"recovery: {health.get('watchdog_kills', 0)} hung instance(s) killed by the watchdog, "
              f"{health.get('requeued', 0)} request(s) re-run after losing their instance, "
              f"{health.get('expired', 0)} past their deadline (504)")
    records = status["reconfigurations"]
    print(f"{len(records)} reconfiguration(s){' (newest last)' if records else ''}")
    for r in records[-args.last:]:
        outcome = f"FAILED: {r['error']}" if r.get("error") else r.get("plan", "")
        print(f"  B {r['from_batch']:>3} → {r['to_batch']:<3} {r['seconds']:6.2f} s  failed requests "
              f"{r['failed_requests']}  {r['reason']}  {outcome}")
    return 0


def add_reconfigure_parser(sub) -> None:
    p = sub.add_parser("reconfigure", help="switch the running server's plan to the one for batch size N now",
                       description="Ask the running packrat handler to switch to the plan for batch size N now "
                                   "(through a request file in RUN_DIR/control/ that it polls); the controller may "
                                   "move again as the load changes. See the outcome with `packrat status`.",
                       epilog="example: packrat reconfigure --run-dir .packrat/serve --batch 16")
    run_dir_arg(p)
    p.add_argument("--batch", type=positive(int), required=True, metavar="N",
                   help="the batch size whose plan to serve")
    p.add_argument("--json", action="store_true", help='print {"batch": N, "file": the request file}')
    p.set_defaults(func=cmd_reconfigure)


def cmd_reconfigure(args: argparse.Namespace) -> int:
    server = torchserve.Server.load(args.run_dir.resolve())
    if not torchserve.java_running(server):
        raise ServeError(f"TorchServe is not running in {args.run_dir}: start it with `packrat serve`")
    path = torchserve_control.request_reconfigure(server.control_dir, server.model, args.batch)
    if args.json:
        print(json.dumps({"batch": args.batch, "file": str(path)}))
    else:
        print(f"asked {server.model} to switch to the plan for batch size {args.batch} ({path}); "
              f"see `packrat status --run-dir {args.run_dir}`")
    return 0


# ---- bench ------------------------------------------------------------------------------------

def add_bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="load-test stock TorchServe, the fat plan and the packrat plan with locust",
                       description="For each batch size, one after another: (a) stock TorchServe (in-process "
                                   "handler, default workers), (b) the packrat handler with the fat plan, (c) the "
                                   "packrat handler with the planned instances; each server started once, warmed up, "
                                   "then loaded by locust headless once per --users pattern (optionally killing "
                                   "pool instances, --kill-every). Prints p50/p95/p99, throughput, failures and "
                                   "kills, and writes a "
                                   "PNG of the latency distributions and the JSON results. --pool-only measures "
                                   "the pool without TorchServe or Java.",
                       epilog="example: packrat bench --model resnet50 --batch-size 2,4,8 --duration 30")
    model_args(p)
    p.add_argument("--batch-size", type=int_list, default=[8], help="batch sizes, e.g. 2,4,8 (default: 8)")
    p.add_argument("--duration", type=positive(float), default=30.0, help="seconds of load per run (default: 30)")
    p.add_argument("--users", type=users_list, default=[bench.BATCH_USERS], metavar="PATTERNS",
                   help="locust users per run, relative to the batch size B: e.g. B,2B or 4,2B (integers, B, kB); "
                        "each is run against every configuration (default: B)")
    p.add_argument("--payload", choices=("jpeg", "text", "raw", "json"), default=None,
                   help="request body: jpeg (a 500x375 photo), text (an English paragraph), raw (tensor bytes), "
                        "json (nested lists) (default: the model's natural one: jpeg for image models, text for "
                        "token models, raw otherwise)")
    tok = p.add_mutually_exclusive_group()
    tok.add_argument("--tokenizer", type=tokenizer_path, default=None, metavar="DIR",
                     help="directory holding the tokenizer.json the servers use (needed for the text payload)")
    tok.add_argument("--demo-tokenizer", action="store_true",
                     help="build a small offline tokenizer into OUT/tokenizer/ and use it (BERT: WordPiece, "
                          "GPT-2: byte-level BPE)")
    p.add_argument("--kill-every", type=positive(float), default=None, metavar="S",
                   help="during each measured run of the packrat configurations, kill -9 one pool instance every "
                        "S seconds (round robin); the kills are counted in the table and JSON")
    p.add_argument("--pool-only", action="store_true",
                   help="no TorchServe: in-process model vs fat pool vs handler path vs planned pool")
    p.add_argument("--rounds", type=positive(int), default=20, help="with --pool-only: timed rounds (default: 20)")
    p.add_argument("--shape", choices=("steady", "step"), default="steady",
                   help="step: a 1 ↔ B users step load against the packrat handler with reconfiguration on, "
                        "and with the plan fixed for B and for 1; draws timelines with the plan changes")
    p.add_argument("--cycles", type=positive(int), default=10, help="with --shape step: low/high cycles (default: 10)")
    p.add_argument("--step-seconds", type=positive(float), default=12.0,
                   help="with --shape step: seconds per step (default: 12)")
    p.add_argument("--out", type=Path, default=Path("out/bench"), help="results directory (default: out/bench)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_bench)


def bench_tokenizer(model: str, payload: str, given: Path | None, demo: bool, out: Path) -> Path | None:
    """The tokenizer.json the servers get: --tokenizer, or with --demo-tokenizer one built into OUT/tokenizer/.
    A text payload without either is an error."""
    from loadtest.payload import natural_payload
    from loadtest.tokenizer import build_demo_tokenizer, demo_tokenizer_kind

    if demo:
        if natural_payload(model) != "text":
            raise ValueError(f"--demo-tokenizer is for token models (bert_base, gpt2); {model} takes no token ids")
        return build_demo_tokenizer(out / "tokenizer", demo_tokenizer_kind(model))
    if given is None and payload == "text":
        raise ValueError("the text payload needs a tokenizer: pass --tokenizer DIR (a directory holding "
                         "tokenizer.json), or --demo-tokenizer to build a small one")
    return given


def cmd_bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from loadtest.payload import check_payload, natural_payload

    out = args.out
    if args.pool_only:  # the pool gets tensors: no payload, no tokenizer
        profile = resolve_profile(args.model, args.profile, batch_sizes=args.batch_size,
                                  input_shape=args.input_shape)
        results = []
        for batch in args.batch_size:
            with tqdm(total=args.rounds, desc=f"pool bench B={batch}", disable=args.json) as bar:
                results.append(bench.pool_bench(args.model, batch, profile, args.rounds, progress=bar.update))
        bench.save_json(out / "pool-bench.json", results)
        print(json.dumps(results, indent=2) if args.json else bench.format_pool_results(results))
        return 0
    payload = args.payload or natural_payload(args.model, args.input_shape)
    check_payload(args.model, payload, args.input_shape)
    tokenizer = bench_tokenizer(args.model, payload, args.tokenizer, args.demo_tokenizer, out)
    profile = resolve_profile(args.model, args.profile, batch_sizes=args.batch_size, input_shape=args.input_shape)
    if args.shape == "step":
        results = bench.step_bench(args.model, args.batch_size[-1], profile, out, cycles=args.cycles,
                                   step_s=args.step_seconds, payload=payload, tokenizer=tokenizer,
                                   log=(lambda *_: None) if args.json else print)
        bench.save_json(out / "step-bench.json", results)
        if args.json:
            print(json.dumps(json.loads((out / "step-bench.json").read_text()), indent=2))
        else:
            print(f"\nstep load 1 ↔ {args.batch_size[-1]} users, {args.cycles} cycles of "
                  f"{args.step_seconds:.0f} s steps, payload {payload} (locust on the same cores)")
            print(bench.format_step_results(results))
            print("timelines: " + ", ".join(r["timeline"] for r in results.values()))
        return 0
    return run_server_bench(args.model, args.batch_size, profile, out, args.duration, args.users, args.json,
                            payload=payload, tokenizer=tokenizer, kill_every=args.kill_every)


def run_server_bench(model: str, batches: list[int], profile: Path, out: Path, duration: float,
                     users=None, as_json: bool = False, *, payload: str | None = None,
                     tokenizer: Path | None = None, kill_every: float | None = None) -> int:
    """Server bench for every batch size: the table per batch (or JSON), the latency plots and
    OUT/server-bench.json = {model, payload, users, kill_every_s, duration_s, runs: [ServerRun, ...]}."""
    from loadtest import plot_latency_distributions
    from loadtest.payload import natural_payload

    payload = payload or natural_payload(model)
    users = list(users or [bench.BATCH_USERS])
    runs = []
    for batch in batches:
        batch_runs = bench.server_bench(model, batch, profile, out / f"B{batch}", duration_s=duration, users=users,
                                        payload=payload, tokenizer=tokenizer, kill_every_s=kill_every,
                                        log=(lambda *_: None) if as_json else print)
        runs += batch_runs
        png = plot_latency_distributions(bench.latency_rows(batch_runs), out / f"latency-B{batch}.png")
        if not as_json:
            counts = ", ".join(f"{p}={n}" if p != str(n) else p for n, p in bench.users_for_batch(users, batch))
            print(f"\n{model}, batch size {batch}, payload {payload}, users {counts}, {duration:.0f} s each "
                  f"(locust runs on the same {local_cores()} cores as the server)")
            if kill_every is not None:
                print(f"kill -9 one pool instance every {kill_every:g} s during each run "
                      f"(stock has no pool: kills -)")
            print(bench.format_server_results(batch_runs, kills=kill_every is not None))
            print(f"latency distributions: {png}")
    report = {"model": model, "payload": payload, "users": [str(p) for p in users], "kill_every_s": kill_every,
              "duration_s": duration, "runs": runs}
    bench.save_json(out / "server-bench.json", report)
    if as_json:
        print(json.dumps(json.loads((out / "server-bench.json").read_text()), indent=2))
    return 0


# ---- demo -------------------------------------------------------------------------------------

def add_demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="profile, plan, plot, then serve and load-test (the README's main job)",
                       description="The main job on a small grid: profile (cached), plan for every profiled "
                                   "batch on this machine's cores, print the plans, write the plots, then serve "
                                   "in TorchServe (stock, fat, plan) under a short locust load and print the table.")
    p.add_argument("--model", default="resnet50", help="zoo model (default: resnet50)")
    p.add_argument("--batches", type=int_list, default=[1, 2, 4, 8],
                   help="batch sizes (default: 1,2,4,8)")
    p.add_argument("--min-time", type=positive(float), default=2.0, metavar="S",
                   help="seconds of timed runs per point (default: 2)")
    p.add_argument("--out-dir", type=Path, default=Path("out"),
                   help="where plots/ and bench/ go (default: out); the profile is profiles/MODEL.csv, as for "
                        "serve, archive and bench")
    p.add_argument("--serve-batch", type=positive(int), default=4, help="batch size served (default: 4)")
    p.add_argument("--duration", type=positive(float), default=15.0, help="seconds of load per run (default: 15)")
    p.add_argument("--no-serve", action="store_true", help="stop after the plots")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from loadtest.payload import natural_payload

    from packrat.profiling import plots

    cores = local_cores()
    out = Path(args.out_dir)
    profile_path = default_profile_path(args.model)
    legacy = out / "profiles" / f"{args.model}.csv"  # where the demo kept it before
    if legacy.exists() and not profile_path.exists():
        profile_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(legacy, profile_path)
        print(f"copied the profile cache {legacy} to {profile_path}, where serve, archive and bench find it too")
    print(f"== 1/4 profile {args.model} on {cores} cores, batches {args.batches} "
          f"(cached in {profile_path}; delete it to measure again)")
    profile_path.parent.mkdir(parents=True, exist_ok=True)
    profile = measure_profile(args.model, profile_path, args.batches, min_time=args.min_time)
    print(f"\n== 2/4 plan for T={cores} threads, every profiled batch")
    plans = plots.plans_per_batch(profile, cores)
    print_plan_table(plans, [])
    print("\n== 3/4 plots")
    for path in plots.write_all(profile, cores, out / "plots"):
        print(f"wrote {path}")
    if args.no_serve:
        return 0
    payload = natural_payload(args.model)
    tokenizer = bench_tokenizer(args.model, payload, None, payload == "text", out / "bench")
    print(f"\n== 4/4 serve in TorchServe and load with locust at batch size {args.serve_batch}, payload {payload}: "
          "stock handler, packrat fat plan, packrat plan")
    return run_server_bench(args.model, [args.serve_batch], profile_path, out / "bench", args.duration, None,
                            payload=payload, tokenizer=tokenizer)


# ---- ready, export: running in a container ------------------------------------------------------

def add_ready_parser(sub) -> None:
    p = sub.add_parser("ready", help="exit 0 when some worker of the model is READY (a readiness probe)",
                       description="Ask TorchServe's management API (GET /models/NAME) whether some worker of the "
                                   "model is READY; exit 0 if so, 1 if not. Not /ping: it says Healthy while workers "
                                   "crash. With token authorisation the management key is read from RUN_DIR/"
                                   "key_file.json (TorchServe writes it into the directory it starts in) and renewed "
                                   "through the token API when TorchServe refuses it as expired. Without --model, the "
                                   "model and port come from the server `packrat serve` recorded in the run dir.",
                       epilog="example (in a pod): packrat ready --model resnet50 --run-dir /home/packrat/run")
    run_dir_arg(p, f"where key_file.json is (default: {DEFAULT_RUN_DIR})")
    p.add_argument("--model", help="the model name TorchServe serves (default: the run dir's server)")
    p.add_argument("--management-port", type=positive(int), default=torchserve.Ports().management,
                   help="the management API's port on 127.0.0.1 (default: 8081; with --model only)")
    p.set_defaults(func=cmd_ready)


def cmd_ready(args: argparse.Namespace) -> int:
    if args.model:
        ports = dataclasses.replace(torchserve.Ports(), management=args.management_port)
        server = torchserve.Server(args.run_dir, args.model, ports)
    else:
        server = torchserve.Server.load(args.run_dir)
    ready = torchserve.model_ready(server)
    print(f"{server.model}: {'ready' if ready else 'not ready'} (workers: {torchserve.worker_status(server)})")
    return 0 if ready else 1


def add_export_parser(sub) -> None:
    p = sub.add_parser("export", help="write deployment files for an archive (Kubernetes manifests)",
                       description="Write the files that deploy a packrat archive elsewhere. TARGET k8s: "
                                   "Kubernetes manifests.")
    targets = p.add_subparsers(dest="target", required=True, metavar="TARGET")
    k = targets.add_parser(
        "k8s", help="Kubernetes manifests: TorchServe Deployment, KubeRay RayService, KServe InferenceService",
        description="Write into --out: torchserve.yaml (ConfigMap, PVC, Deployment and Service of TorchServe with "
                    "the packrat handler), rayservice.yaml (a KubeRay RayService running packrat.ray_serve:app, "
                    "one replica per worker pod), kserve.yaml (our own KServe ServingRuntime and an "
                    "InferenceService reading the archive from the PVC) and copy-models.yaml (the PVC and a pod "
                    "to `kubectl cp` the archive onto it). Every pod is Guaranteed QoS with whole CPUs "
                    "(requests == limits), so the kubelet's static CPU manager gives it cores of its own, and "
                    "PACKRAT_CORES tells packrat how many. Readiness is `packrat ready` (a worker READY), not "
                    "/ping. Each file starts with a comment on how to apply it and reach the model.",
        epilog="example: packrat export k8s --archive model_store/resnet50.mar --cores 8 --memory 16Gi "
               "--image registry.example.com/packrat:1 --out k8s")
    k.add_argument("--archive", type=Path, required=True, help="the .mar built by `packrat archive` (packrat handler)")
    k.add_argument("--cores", type=positive(int), required=True, metavar="N",
                   help="whole CPUs per serving pod: requests, limits, Ray's num-cpus and PACKRAT_CORES")
    k.add_argument("--memory", default="8Gi", help="memory per serving pod, a Kubernetes quantity (default: 8Gi)")
    k.add_argument("--name", help="the model's and the objects' name (default: the archive's, made DNS-safe)")
    k.add_argument("--image", default="packrat:latest",
                   help="an image built from deploy/Dockerfile (default: packrat:latest)")
    k.add_argument("--replicas", type=positive(int), default=1,
                   help="serving pods (Ray: worker pods); more than 1 needs --no-token-auth (default: 1)")
    k.add_argument("--head-cores", type=positive(int), default=2, help="whole CPUs of the Ray head pod (default: 2)")
    k.add_argument("--head-memory", default="4Gi", help="memory of the Ray head pod (default: 4Gi)")
    k.add_argument("--storage", default="10Gi", help="size of the PVC that holds the archive (default: 10Gi)")
    k.add_argument("--no-token-auth", dest="token_auth", action="store_false",
                   help="turn TorchServe's token authorisation off (on by default: one pod's random keys)")
    k.add_argument("--token-expiration-min", type=positive(int), default=None, metavar="MIN",
                   help="minutes TorchServe's keys stay valid (TorchServe's default: 60)")
    k.add_argument("--ray-version", default=None,
                   help="the image's Ray version, for KubeRay (default: the one installed here)")
    k.add_argument("--out", type=Path, default=Path("k8s"), help="output directory (default: k8s)")
    k.add_argument("--json", action="store_true", help='print {"name", "files": [paths written]}')
    k.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from packrat.deploy import k8s

    archive = k8s.read_archive(args.archive)
    archive = dataclasses.replace(archive, name=args.name or k8s.dns_name(archive.name))
    settings = k8s.Settings(archive, args.cores, memory=args.memory, image=args.image, replicas=args.replicas,
                            head_cores=args.head_cores, head_memory=args.head_memory, storage=args.storage,
                            token_auth=args.token_auth, token_expiration_min=args.token_expiration_min,
                            ray_version=args.ray_version or k8s.installed_ray_version())
    files = k8s.write(settings, args.out)
    if args.json:
        print(json.dumps({"name": settings.name, "files": [str(f) for f in files]}))
    else:
        print(f"wrote {', '.join(str(f) for f in files)} for {settings.name}; each file says how to apply it")
    return 0


# ---- the top parser -----------------------------------------------------------------------------

COMMANDS = (add_profile_parser, add_plan_parser, add_plot_parser, add_archive_parser, add_serve_parser,
            add_stop_parser, add_status_parser, add_reconfigure_parser, add_bench_parser, add_demo_parser,
            add_ready_parser, add_export_parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="packrat",
        description="Latency-optimal CPU inference serving: profile a model's latency L(t, b) for t threads "
                    "and batch b, then plan the instances ⟨i, t, b⟩ that serve a batch fastest on T cores.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parser in COMMANDS:
        add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ProfileError, NoPlanError, ProfilingError, ServeError, ValueError) as exc:
        print(f"packrat {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\npackrat {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
