"""Argument types and argument groups that several `packrat` commands share."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from packrat.cli import compare
from packrat.deploy import archive
from packrat.machine.budget import cpu_budget
from packrat.machine.topology import Topology
from packrat.models import modes
from packrat.profiling import profiler
from packrat.cli.types import named, positive, shape
from packrat.settings import MAX_BODY_BYTES

DEFAULT_BATCHES = "1,2,4,8,16,32,64"


DEFAULT_RUN_DIR = Path(".packrat/serve")


def users_list(text: str) -> list:
    """argparse type for --users: patterns relative to the batch size B, e.g. B,2B or 4,2B."""
    try:
        return compare.parse_users(text)
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


MODEL_HELP = ("zoo name, hf:DIR (a Hugging Face save_pretrained directory), a torch.export program (.pt2), a "
              "TorchScript file or package.module:factory (default: resnet50)")


def model_args(p: argparse.ArgumentParser,
               profile_help: str = "profile CSV (default: profiles/MODEL.csv; when that is missing, one is "
                                   "measured there first on a small grid and reused next time)",
               several_profiles: bool = False, several_models: bool = False) -> None:
    if several_models:
        p.add_argument("--model", dest="models", action="append", default=None, metavar="MODEL",
                       help=MODEL_HELP + "; repeat it to serve several models, each at /predictions/NAME, on "
                                         "one plan of the machine's cores")
    else:
        p.add_argument("--model", default="resnet50", help=MODEL_HELP)
    if several_profiles:
        p.add_argument("--profile", type=named(Path), action="append", default=None, metavar="[NAME=]PATH",
                       help=profile_help + "; give it once per machine type (say, one profile taken on 4 "
                                           "cores and one on 16): each server plans with the one taken on its "
                                           "CPU model with the closest core count. With several models, "
                                           "NAME=PATH says whose it is (NAME: the served name)")
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
    """The request handling arguments; the per-model ones take NAME=VALUE (a bare VALUE: every model)."""
    p.add_argument("--tokenizer", type=named(tokenizer_path), action="append", default=None, metavar="[NAME=]DIR",
                   help="a directory holding a Hugging Face tokenizer.json (or the file): token models then "
                        "also take text/plain requests")
    p.add_argument("--labels", type=named(labels_path), action="append", default=None, metavar="[NAME=]FILE",
                   help='class names for classifier answers: TorchServe\'s index_to_name.json '
                        '({"0": "tench", ...})')
    p.add_argument("--slo", type=named(positive(float)), action="append", default=None, metavar="[NAME=]MS",
                   help="the model's latency objective in ms: the machine's cores are then planned to serve the "
                        "most load within every model's objective, and `packrat status` names a model that "
                        "cannot meet it (default: none; the cores go where the worst slowdown is least)")
    p.add_argument("--max-body-mb", type=positive(float), default=MAX_BODY_BYTES / 2**20, metavar="MB",
                   help=f"largest request body accepted; larger ones get 413 (default: {MAX_BODY_BYTES // 2**20})")
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
                        "most linear and its returns diminish; see packrat/profiling/adaptive.py) and stop when no "
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


def archive_args(p: argparse.ArgumentParser, several_models: bool = False) -> None:
    """What archive and serve share: the model, batching, request and recovery arguments, and --cores."""
    model_args(p, several_profiles=True, several_models=several_models)
    p.add_argument("--cores", type=positive(int), default=None, metavar="N",
                   help="plan for at most N cores, written into the archive (default: every core this "
                        "process may use: its CPU affinity, cut to its cgroup's CPU quota, or $PACKRAT_CORES). "
                        "More than the machine gives is cut to what it gives")
    batching_args(p)
    request_args(p)
    recovery_args(p)
