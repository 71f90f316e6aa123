"""`packrat serve`: TorchServe (or Ray Serve, or a KServe model server) serving the plan, started and
checked READY."""

from __future__ import annotations

import argparse
from pathlib import Path

from packrat.cli.archive import archive_from_args, profiles_for, served_names, settings_from_args
from packrat.cli.args import DEFAULT_RUN_DIR, archive_args, run_dir_arg
from packrat.cli.types import positive
from packrat.cli.output import print_budget_and_profile
from packrat.deploy import torchserve
from packrat.errors import ServeError
from packrat.planning.front_ends import front_ends_count


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="start TorchServe with the packrat handler and wait until it is READY",
                       description="Archive the model, write a TorchServe config (loopback addresses, every "
                                   "port set, token authorisation on unless disabled, quiet logs), run "
                                   "`torchserve --start`, and wait until the management API shows every "
                                   "worker READY. The model is served as /predictions/NAME. Several --model: one "
                                   "server, one worker per model, and one plan of the machine's cores for all of "
                                   "them that follows their loads (see `packrat status`).",
                       epilog="examples:\n  packrat serve --model resnet50 --batch-size 8 --max-batch-delay 50\n"
                              "  packrat serve --model resnet50 --model squeezenet --batch-size 4 "
                              "--profile resnet50=profiles/resnet50.csv --slo squeezenet=100",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    archive_args(p, several_models=True)
    p.add_argument("--inference-port", type=positive(int), default=8080)
    p.add_argument("--management-port", type=positive(int), default=8081)
    p.add_argument("--metrics-port", type=positive(int), default=8082)
    p.add_argument("--grpc-inference-port", type=positive(int), default=7070)
    p.add_argument("--grpc-management-port", type=positive(int), default=7071)
    p.add_argument("--disable-token-auth", action="store_true",
                   help="turn TorchServe's token authorisation off (it is on by default)")
    p.add_argument("--enable-model-api", action="store_true",
                   help="let the management API register (POST /models) and unregister (DELETE /models/NAME) "
                        "models while the server runs; each packrat model joins or leaves the plan of the cores "
                        "(off by default, as in TorchServe)")
    p.add_argument("--oip", action="store_true",
                   help="also serve the KServe v2 / Open Inference Protocol (POST /v2/models/NAME/infer, "
                        "tritonclient's binary tensors included): TS_OPEN_INFERENCE_PROTOCOL=oip")
    run_dir_arg(p, f"config, logs, key file and TorchServe's TEMP (default: {DEFAULT_RUN_DIR})")
    p.add_argument("--timeout", type=positive(float), default=300.0, help="seconds to wait for READY")
    p.add_argument("--engine", choices=("torchserve", "ray", "kserve"), default="torchserve",
                   help="torchserve (default): this machine, TorchServe's frontend; ray: one packrat engine "
                        "per node of the Ray cluster, each planned for its node's CPU budget and profile; kserve: "
                        "this machine, a KServe model server (Open Inference Protocol over REST on "
                        "--inference-port and gRPC on --grpc-inference-port) with the engines in its process")
    p.add_argument("--front-ends", default="auto", type=front_ends_count, metavar="N|auto",
                   help="--engine kserve: front-end processes sharing the ports, each with its own event loop and "
                        "engines on its own block of the cores; auto: as many as the plans' capacity needs at one "
                        "front end's ceiling (packrat bench http --ceiling), at most one per core, one for a model "
                        "the cores bound (default: auto)")
    ray = p.add_argument_group("--engine ray", "serve on a running Ray cluster (`ray start --head` on one "
                                               "node, `ray start --address HEAD:6379` on the others) instead of "
                                               "TorchServe; needs `pip install packrat-serve[ray]`")
    ray.add_argument("--ray-address", default="auto", help="the cluster to deploy on (default: auto, the local one)")
    ray.add_argument("--replicas", type=positive(int), default=None,
                     help="engines (Ray Serve replicas), at most one per node (default: the cluster's alive nodes)")
    ray.add_argument("--http-host", default="127.0.0.1",
                     help="the address Ray Serve's proxy, or the KServe server's REST and gRPC (--engine kserve), "
                          "listen on (default: 127.0.0.1, loopback)")
    ray.add_argument("--http-port", type=positive(int), default=8000, help="default: 8000")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    models = args.models or ["resnet50"]
    if args.engine == "ray":
        if len(models) > 1:
            raise ValueError("--engine ray deploys one model: run it once per model (the replicas on one node "
                             "plan its cores together)")
        return serve_on_ray(args)
    if args.engine == "kserve":
        return serve_on_kserve(args)
    run_dir = args.run_dir.resolve()
    names = served_names(models)
    mars = [archive_from_args(args, run_dir / "model_store", model=model, names=names) for model in models]
    ports = torchserve.Ports(args.inference_port, args.management_port, args.metrics_port,
                             args.grpc_inference_port, args.grpc_management_port)
    print(f"starting TorchServe for {', '.join(names)} (batch size {args.max_batch}); "
          f"waiting for every worker READY ...")
    server = torchserve.start(torchserve.Server(run_dir, names[0], ports, token_auth=not args.disable_token_auth,
                                                oip=args.oip, models=tuple(names), model_api=args.enable_model_api),
                              mars, timeout=args.timeout)
    for name in names:
        print(f"ready: POST {server.inference_url}/predictions/{name}")
        try:
            print_budget_and_profile(torchserve.handler_status(server, name))
        except ServeError as exc:  # serving goes on; only the report is missing
            print(f"(the handler did not report its CPU budget: {exc})")
        if server.oip:
            print(f"Open Inference Protocol: POST {server.inference_url}/v2/models/{name}/infer")
    if len(names) > 1:
        print(f"the models share the cores by one plan that follows their loads: packrat status --run-dir {args.run_dir}")
    print(f"management: {server.management_url}   metrics: http://127.0.0.1:{ports.metrics}/metrics")
    if server.token_auth:
        print(f"token authorisation is on: keys in {server.key_file} "
              f"(send 'Authorization: Bearer <inference key>')")
    print(f"logs: {run_dir / 'logs'}   stop with: packrat stop --run-dir {args.run_dir}")
    return 0


def ray_app_args(args: argparse.Namespace) -> dict:
    """packrat.ray_serve.app's arguments: the settings an archive would carry, with files as absolute
    paths (profiles are sent to the replicas; models, tokenizers and labels must be on every node at
    the same path), and the number of engines."""
    model = ray_model(args)
    names = served_names([model])
    profiles = profiles_for(args, model, names[0], names)
    settings = settings_from_args(args, model, names, [Path(p).resolve() for p in profiles])
    files = {key: str(Path(getattr(settings, key)).resolve()) for key in ("model", "tokenizer", "labels")
             if getattr(settings, key) is not None and Path(getattr(settings, key)).exists()}
    return {**settings.replace(**files).to_section(), **({"replicas": args.replicas} if args.replicas else {})}


def ray_model(args: argparse.Namespace) -> str:
    return (args.models or ["resnet50"])[0]


def serve_on_ray(args: argparse.Namespace) -> int:
    try:
        from packrat.frontends import ray_serve
    except ImportError as exc:
        raise ServeError(f"--engine ray needs Ray Serve: pip install 'packrat-serve[ray]' ({exc})") from exc
    app_args = ray_app_args(args)
    print(f"deploying {ray_model(args)} on the Ray cluster at {args.ray_address}, one engine per node ...")
    url, name = ray_serve.deploy(app_args, address=args.ray_address, host=args.http_host, port=args.http_port,
                                 timeout_s=args.timeout)
    print(f"ready: POST {url}/predictions/{name} (or {url}/v2/models/{name}/infer); GET {url}/v2/models/{name}/ready")
    print(f"each replica's plan and CPU budget: GET {url}/status; stop with: packrat stop --engine ray")
    return 0


def serve_on_kserve(args: argparse.Namespace) -> int:
    """The archives, as for TorchServe, served by a KServe model server started in the run dir."""
    from packrat.deploy import kserve

    if not kserve_installed():
        raise ServeError("--engine kserve needs the KServe SDK: pip install 'packrat-serve[kserve]'")
    run_dir = args.run_dir.resolve()
    names = served_names(args.models or ["resnet50"])
    mars = [archive_from_args(args, run_dir / "model_store", model=model, names=names)
            for model in args.models or ["resnet50"]]
    server = kserve.KServeServer(run_dir, tuple(names), host=args.http_host, http_port=args.inference_port,
                                 grpc_port=args.grpc_inference_port, front_ends=args.front_ends)
    print(f"starting a KServe model server for {', '.join(names)} (batch size {args.max_batch}); "
          f"waiting for every model ready ...")
    kserve.start(server, mars, timeout=args.timeout)
    print_front_ends(*kserve.front_ends(server))
    statuses = kserve.status(server)
    for name in names:
        print(f"ready: POST {server.url}/v2/models/{name}/infer (gRPC: {server.grpc_address}); "
              f"GET {server.url}/v2/models/{name}")
        print_budget_and_profile(statuses.get(name, {}))
    if len(names) > 1:
        print(f"the models share the cores by one plan that follows their loads: packrat status --run-dir {args.run_dir}")
    print(f"metrics: {server.url}/metrics   logs: {server.log}   stop with: packrat stop --engine kserve "
          f"--run-dir {args.run_dir}")
    return 0


def print_front_ends(choice: dict | None, entries: list[dict]) -> None:
    """How many front ends serve, why, and each one's process and cores."""
    if choice is None:
        return
    print(f"front ends: {choice['count']} ({choice['why']})")
    for entry in entries if choice["count"] > 1 else []:
        print(f"  front end {entry['index']}: pid {entry['pid']}, cores {entry['cores']}")


def kserve_installed() -> bool:
    """Whether the KServe SDK is installed here (the server process imports it; this one need not)."""
    import importlib.util

    return importlib.util.find_spec("kserve") is not None
