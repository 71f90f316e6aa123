"""`packrat ready`: a container's readiness check (a READY worker; renews an expired management key)."""

from __future__ import annotations

import argparse
import dataclasses

from packrat.cli.args import DEFAULT_RUN_DIR, run_dir_arg

from packrat.cli.types import positive
from packrat.deploy import torchserve


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
