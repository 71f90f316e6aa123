"""`packrat archive`: a TorchServe model archive with the packrat handler, its profiles and settings."""

from __future__ import annotations

import argparse
from pathlib import Path

from packrat.cli.args import archive_args, settings_given
from packrat.serving.default_profile import resolve_profile
from packrat.cli.types import for_model
from packrat.deploy import archive
from packrat.settings import Settings


def served_names(models: list[str]) -> list[str]:
    """Each model's served name (/predictions/NAME); two models may not share one."""
    names = [archive.archive_name(model) for model in models]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"two models would both be served as {', '.join(twice)}: serve each model once")
    return names


def profiles_for(args: argparse.Namespace, model: str, name: str, names: list[str]) -> list[Path]:
    """The model's profiles (--profile [NAME=]PATH, one per machine type), the default one measured
    when none is given."""
    given = for_model(args.profile, name, names, "--profile", bare_for_one=True)
    return [resolve_profile(model, path, batch_sizes=[args.max_batch], input_shape=args.input_shape)
            for path in given or [None]]


def settings_from_args(args: argparse.Namespace, model: str, names: list[str], profiles: list[Path]) -> Settings:
    """The settings of `model` (served as one of `names`) from its profiles and the settings' options."""
    return Settings(model, profiles=profiles, **settings_given(args, archive.archive_name(model), names))


def archive_from_args(args: argparse.Namespace, out_dir: Path, handler: str = "packrat", model: str | None = None,
                      names: list[str] | None = None) -> Path:
    """The archive of `model` (args.model unless given; one of the served `names`) the arguments
    describe; the packrat handler's profiles are resolved (the default one measured when missing) first."""
    model = model or args.model
    names = names or served_names([model])
    profiles = profiles_for(args, model, archive.archive_name(model), names) if handler == "packrat" else []
    return archive.build(settings_from_args(args, model, names, profiles), out_dir, handler=handler,
                         max_batch_delay_ms=args.max_batch_delay, ios_cache=args.ios_cache)


def add_archive_parser(sub) -> None:
    p = sub.add_parser("archive", help="build the model archive (.mar) for TorchServe",
                       description="Build NAME.mar with torch-model-archiver: the packrat handler, the profile "
                                   "and a model-config.yaml (batch size, delay, one worker, packrat settings). "
                                   "The worker plans for the batch size and the cores it may use, with the "
                                   "other packrat models served on the same cores.",
                       epilog="example: packrat archive --model resnet50 --batch-size 8 --export-path model_store")
    archive_args(p)
    p.add_argument("--handler", choices=("packrat", "stock", "careful"), default="packrat",
                   help="packrat (default); stock: the in-process baseline handler, TorchServe's default workers; "
                        "careful: one worker running one session (the settings' runtime) on every core, decoding in parallel")
    p.add_argument("--export-path", type=Path, default=Path("model_store"), help="default: model_store")
    p.set_defaults(func=cmd_archive)


def cmd_archive(args: argparse.Namespace) -> int:
    mar = archive_from_args(args, args.export_path, args.handler)
    print(f"wrote {mar}")
    return 0
