"""`packrat archive`: a TorchServe model archive with the packrat handler, its profiles and settings."""

from __future__ import annotations

import argparse
from pathlib import Path

from packrat.cli.args import archive_args
from packrat.cli.default_profile import resolve_profile
from packrat.deploy import archive
from packrat.settings import Settings


def settings_from_args(args: argparse.Namespace, profiles: list[Path]) -> Settings:
    """The served model's settings from the model, batching, request, recovery and --cores arguments."""
    return Settings(args.model, profiles=profiles, max_batch=args.batch_size, plan=args.plan,
                    reconfigure=args.reconfigure, cores=args.cores, input_shape=args.input_shape,
                    tokenizer=args.tokenizer, labels=args.labels, max_body_bytes=int(args.max_body_mb * 2**20),
                    truncate_text=args.truncate_text, request_timeout_s=args.request_timeout,
                    max_queue=args.max_queue, batch_timeout_s=args.batch_timeout)


def archive_from_args(args: argparse.Namespace, out_dir: Path, handler: str = "packrat") -> Path:
    """The archive the arguments describe; the packrat handler's profiles are resolved (the default
    one measured when missing) first."""
    profiles = [resolve_profile(args.model, given, batch_sizes=[args.batch_size], input_shape=args.input_shape)
                for given in args.profile or [None]] if handler == "packrat" else []
    return archive.build(settings_from_args(args, profiles), out_dir, handler=handler,
                         max_batch_delay_ms=args.max_batch_delay, ios_cache=args.ios_cache)


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
