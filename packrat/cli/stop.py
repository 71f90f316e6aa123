"""`packrat stop`: stop the server a run dir records (or the Ray Serve application)."""

from __future__ import annotations

import argparse

from packrat.cli.args import run_dir_arg
from packrat.deploy import torchserve


def add_stop_parser(sub) -> None:
    p = sub.add_parser("stop", help="stop the TorchServe started by `packrat serve` and wait for it to exit")
    run_dir_arg(p)
    p.add_argument("--engine", choices=("torchserve", "ray", "kserve"), default="torchserve",
                   help="ray: remove what `packrat serve --engine ray` deployed from the Ray cluster; kserve: stop "
                        "the KServe server `packrat serve --engine kserve` started in the run dir")
    p.add_argument("--ray-address", default="auto", help="with --engine ray: the cluster (default: auto)")
    p.set_defaults(func=cmd_stop)


def cmd_stop(args: argparse.Namespace) -> int:
    if args.engine == "ray":
        from packrat.frontends import ray_serve

        ray_serve.shutdown(args.ray_address)
        print("Ray Serve applications removed (the Ray cluster keeps running: `ray stop` on each node stops it)")
        return 0
    if args.engine == "kserve":
        from packrat.deploy import kserve

        server = kserve.KServeServer.load(args.run_dir.resolve())
        kserve.stop(server)
        print("stopped" if not kserve.running(server) else "the KServe server is still running")
        return 0 if not kserve.running(server) else 1
    server = torchserve.Server.load(args.run_dir.resolve())
    torchserve.stop(server)
    print("stopped" if not torchserve.java_running(server) else "TorchServe is still running")
    return 0 if not torchserve.java_running(server) else 1
