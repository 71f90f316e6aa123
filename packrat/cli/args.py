"""Argument types and argument groups that several `packrat` commands share."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from packrat.deploy import archive
from packrat.machine.budget import cpu_budget
from packrat.machine.topology import Topology
from packrat.models import modes
from packrat.profiling import profiler
from packrat.cli.types import for_model, named, positive, shape
from packrat.settings import MAX_BODY_BYTES, EstimatorSettings, Settings, setting_value

DEFAULT_BATCHES = "1,2,4,8,16,32,64"


DEFAULT_RUN_DIR = Path(".packrat/serve")


def doc_subparser(sub, name: str, help: str, doc: str, examples: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """A subcommand whose help is a measuring module's docstring: its first paragraph as the
    description, the rest (then `examples`, one command line each) after the options."""
    description, _, rest = doc.strip().partition("\n\n")
    epilog = rest + ("\n\nexamples:\n" + "\n".join(f"  {line}" for line in examples) if examples else "")
    return sub.add_parser(name, help=help, description=description, epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


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
    """The cores this process may use: its CPU budget (affinity, CFS quota, CORES_ENV)."""
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
               several_profiles: bool = False, several_models: bool = False, input_shape: bool = True) -> None:
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
    if input_shape:
        p.add_argument("--input-shape", type=shape, default=None, help="one input sample's shape, e.g. 3,224,224")


def run_dir_arg(p: argparse.ArgumentParser, what: str = f"default: {DEFAULT_RUN_DIR}") -> None:
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR, help=what)


def contention_args(p: argparse.ArgumentParser) -> None:
    """--contention / --isolated; the default lives in profiler.DEFAULT_CONTENTION."""

    def default(contention: bool) -> str:
        return " (the default)" if contention == profiler.DEFAULT_CONTENTION else ""

    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--contention", dest="contention", action="store_true",
                      default=profiler.DEFAULT_CONTENTION,
                      help="measure each ⟨t, b⟩ while ⌊T/t⌋ copies of it, each pinned to its own t cores, run "
                           "side by side, as a plan of that point serves them (the copies run at once: about the "
                           "time of one lone measurement); a point no second copy fits beside is measured alone, "
                           "as it is served" + default(True))
    kind.add_argument("--isolated", dest="contention", action="store_false",
                      help="measure each ⟨t, b⟩ alone, with the rest of the machine idle: blind to the memory "
                           "bandwidth and caches that instances share, so it over-predicts what many small "
                           "instances gain" + default(False))
    p.add_argument("--isolated-too", action="store_true",
                   help="with --contention, measure every point alone as well (isolated_ms; twice the time for "
                        "t ≤ T/2): both figures, for `packrat plan --latency isolated` and the oracle benchmark")


def search_args(p: argparse.ArgumentParser) -> None:
    from packrat.profiling.profiler import BUDGET_BASE_S, BUDGET_PER_DOUBLING_S

    p.add_argument("--budget-s", type=positive(float), default=None, metavar="S",
                   help="start no point after S seconds (builds included): the profile then holds what was measured "
                        f"and plans with it (default: {BUDGET_BASE_S:g} + {BUDGET_PER_DOUBLING_S:g} x log2(cores), "
                        "a time the machine's size sets; the search ends before when no unmeasured point can "
                        "change a plan)")
    p.add_argument("--full-grid", action="store_true",
                   help="measure every point of threads × batches under every runtime instead of searching, with no "
                        "budget (hours on a many-core machine)")
    p.add_argument("--replay", type=Path, default=None, metavar="FILE",
                   help="look points up in FILE, a full profile (also the published Packrat layout), instead of "
                        "measuring them, on a simulated clock that charges each point what measuring it would cost "
                        "on the recorded machine (so --budget-s is replayed too); --out is rewritten with the points "
                        "looked up: the search checked on a table")
    p.add_argument("--json", action="store_true",
                   help='print {"points", "grid", "fraction", "budget_s", "stopped", "within", "fit_error", "wall_s", '
                        '"simulated", "unaccounted_s", "runtimes": {name: {"build_s", "load_s", "measure_s", '
                        '"points"}}, "out"}')


def archive_args(p: argparse.ArgumentParser, several_models: bool = False) -> None:
    """What archive and serve share: the model and its profiles, TorchServe's batch delay, and every
    packrat setting (settings_args)."""
    model_args(p, several_profiles=True, several_models=several_models, input_shape=False)
    p.add_argument("--max-batch-delay", type=positive(int), default=50, metavar="MS",
                   help="how long TorchServe waits to fill a batch (default: 50 ms)")
    ios_cache_arg(p, "a profile taken with --ios is served by IOS-compiled instances; their schedules come "
                     "from here")
    settings_args(p)


# ---- the packrat settings as options -------------------------------------------------------------
# One option per field of Settings and of its estimator, named after the field (--max-batch,
# --estimator-alpha), typed, checked and explained by the schema (packrat/settings.py); the names the
# options had before stay as aliases.
ALIASES = {"max_batch": ("--batch-size",), "request_timeout_s": ("--request-timeout",),
           "batch_timeout_s": ("--batch-timeout",), "slo_ms": ("--slo",)}
FILE_TYPES = {"tokenizer": tokenizer_path, "labels": labels_path}  # files read and checked as they are named
CHOICES = {"graph_mode": modes.MODES}
NESTED = {"estimator": EstimatorSettings}  # a mapping in the section: an option per field of its own


def settings_args(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("packrat settings", "written to the archive's packrat: section; a per-model "
                                                     "one takes [NAME=]VALUE (a bare VALUE: every model's)")
    for schema, field, prefix in _options():
        meta, dest = field.metadata, prefix.replace(".", "_") + field.name
        kind = FILE_TYPES.get(dest) or _schema_type(schema, field.name, prefix)
        default = "" if field.default is None or isinstance(field.default, bool) else f" (default: {field.default})"
        options = {"dest": dest, "default": None if prefix else field.default,  # nested: left out unless given
                   "help": (meta["help"] + default).replace("%", "%%"),
                   "choices": meta.get("choices") or CHOICES.get(dest)}
        if field.type.startswith("bool"):
            options.update(action=argparse.BooleanOptionalAction, choices=None)
        elif meta.get("per_model"):
            options.update(action="append", type=named(kind), metavar=f"[NAME=]{meta.get('metavar', 'VALUE')}")
        else:
            options.update(type=kind, metavar=meta.get("metavar"))
        group.add_argument(f"--{dest.replace('_', '-')}", *ALIASES.get(dest, ()), **options)
    group.add_argument("--max-body-mb", dest="max_body_bytes", default=argparse.SUPPRESS, metavar="MB",
                       type=lambda text: int(positive(float)(text) * 2**20),
                       help=f"the same in MB (default: {MAX_BODY_BYTES // 2**20})")


def _options():
    """(schema, field, prefix) of every setting that is an option: Settings' own and its estimator's."""
    for field in fields(Settings):
        if field.name in NESTED:
            yield from ((NESTED[field.name], inner, f"{field.name}.") for inner in fields(NESTED[field.name]))
        elif field.metadata.get("option", True):
            yield Settings, field, ""


def _schema_type(schema: type, name: str, prefix: str):
    """argparse type: the text as the schema's field takes it (settings.setting_value), its error the flag's."""

    def parse(text: str):
        try:
            return setting_value(schema, name, text, prefix)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


def settings_given(args: argparse.Namespace, name: str, names: list[str]) -> dict:
    """Settings keywords from the options of settings_args, for the model served as `name` (of `names`)."""
    given = {key: None for key in NESTED}
    for _, field, prefix in _options():
        value = getattr(args, prefix.replace(".", "_") + field.name)
        if field.metadata.get("per_model"):
            value = one_value(value, name, names, ALIASES.get(field.name, (f"--{field.name.replace('_', '-')}",))[0])
        if not prefix:
            given[field.name] = value
        elif value is not None:
            given[prefix[:-1]] = {**(given[prefix[:-1]] or {}), field.name: value}
    return given


def one_value(entries, name: str, names: list[str], flag: str):
    """The value of a per-model option (`named` entries) for the model served as `name`."""
    values = for_model(entries, name, names, flag)
    if len(values) > 1:
        raise ValueError(f"{flag} given {len(values)} times for {name}: give it once")
    return values[0] if values else None
