"""`packrat reconfigure`: ask the running handler to switch to the plan for a batch size now."""

from __future__ import annotations

import argparse
import json

from packrat.cli.args import run_dir_arg
from packrat.cli.status import running_kserve

from packrat.cli.types import positive
from packrat.deploy import torchserve
from packrat.errors import ServeError
from packrat.frontends import torchserve_control


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
    kserve = running_kserve(args.run_dir.resolve())
    if kserve is not None:  # the KServe server follows the same control files
        control_dir, model = kserve.control_dir, kserve.models[0]
    else:
        server = torchserve.Server.load(args.run_dir.resolve())
        if not torchserve.java_running(server):
            raise ServeError(f"TorchServe is not running in {args.run_dir}: start it with `packrat serve`")
        control_dir, model = server.control_dir, server.model
    path = torchserve_control.request_reconfigure(control_dir, model, args.batch)
    if args.json:
        print(json.dumps({"batch": args.batch, "file": str(path)}))
    else:
        print(f"asked {model} to switch to the plan for batch size {args.batch} ({path}); "
              f"see `packrat status --run-dir {args.run_dir}`")
    return 0
