"""`packrat export k8s`: Kubernetes manifests for an archive."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from packrat.cli.types import positive
from packrat.settings import CORES_ENV


def add_export_parser(sub) -> None:
    p = sub.add_parser("export", help="write deployment files for an archive (Kubernetes manifests)",
                       description="Write the files that deploy a packrat archive elsewhere. TARGET k8s: "
                                   "Kubernetes manifests.")
    targets = p.add_subparsers(dest="target", required=True, metavar="TARGET")
    k = targets.add_parser(
        "k8s", help="Kubernetes manifests: TorchServe Deployment, KubeRay RayService, KServe InferenceServices",
        description="Write into --out: torchserve.yaml (ConfigMap, PVC, Deployment and Service of TorchServe with "
                    "the packrat handler), rayservice.yaml (a KubeRay RayService running packrat.ray_serve:app, "
                    "one replica per worker pod), kserve.yaml (our own KServe ServingRuntime and an "
                    "InferenceService reading the archive from the PVC), kserve-sdk.yaml (a ServingRuntime running "
                    "packrat's KServe model server, image --kserve-image, and an InferenceService of it) and "
                    "copy-models.yaml (the PVC and a pod "
                    "to `kubectl cp` the archive onto it). Every pod is Guaranteed QoS with whole CPUs "
                    "(requests == limits), so the kubelet's static CPU manager gives it cores of its own, and "
                    f"{CORES_ENV} tells packrat how many. Readiness is `packrat ready` (a worker READY), not "
                    "/ping (the KServe model server: its model's OIP ready route). Each file starts with a comment on how to apply it and reach the model.",
        epilog="example: packrat export k8s --archive model_store/resnet50.mar --cores 8 --memory 16Gi "
               "--image registry.example.com/packrat:1 --out k8s")
    k.add_argument("--archive", type=Path, required=True, help="the .mar built by `packrat archive` (packrat handler)")
    k.add_argument("--cores", type=positive(int), required=True, metavar="N",
                   help=f"whole CPUs per serving pod: requests, limits, Ray's num-cpus and {CORES_ENV}")
    k.add_argument("--memory", default="8Gi", help="memory per serving pod, a Kubernetes quantity (default: 8Gi)")
    k.add_argument("--name", help="the model's and the objects' name (default: the archive's, made DNS-safe)")
    k.add_argument("--image", default="packrat:latest",
                   help="an image built from deploy/Dockerfile (default: packrat:latest)")
    k.add_argument("--kserve-image", default="packrat-kserve:latest",
                   help="an image built from deploy/kserve.Dockerfile, for kserve-sdk.yaml (default: packrat-kserve:latest)")
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
    spec = k8s.K8sSpec(archive, args.cores, memory=args.memory, image=args.image, kserve_image=args.kserve_image,
                       replicas=args.replicas,
                       head_cores=args.head_cores, head_memory=args.head_memory, storage=args.storage,
                       token_auth=args.token_auth, token_expiration_min=args.token_expiration_min,
                       ray_version=args.ray_version or k8s.installed_ray_version())
    files = k8s.write(spec, args.out)
    if args.json:
        print(json.dumps({"name": spec.name, "files": [str(f) for f in files]}))
    else:
        print(f"wrote {', '.join(str(f) for f in files)} for {spec.name}; each file says how to apply it")
    return 0
