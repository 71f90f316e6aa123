"""Kubernetes manifests for packrat (`packrat export k8s`): plain dicts built from a K8sSpec.

Four ways to run the same archive on a cluster, one YAML file each:
- torchserve.yaml: a Deployment + Service of TorchServe with the packrat handler;
- rayservice.yaml: a KubeRay RayService running the Ray Serve front end (packrat.ray_serve:app);
- kserve.yaml: a KServe ServingRuntime of our own running TorchServe + an InferenceService using it;
- kserve-sdk.yaml: a KServe ServingRuntime running packrat's KServe model server
  (packrat.frontends.kserve_server, image deploy/kserve.Dockerfile) + an InferenceService using it.
copy-models.yaml holds the PersistentVolumeClaim the archive lives on and a helper pod to copy it there;
etc/ the ConfigMap's files (config.properties, log4j2.xml, profiles) for a plain `docker run`.

Every pod is Guaranteed QoS: each container's requests equal its limits and the CPUs are an
integer, so a kubelet with the static CPU manager gives the container whole cores of its own
(packrat pins its instances to cores and plans for exactly that many). Nothing here adds an init
container, which would need the same care. Only read_archive and write touch files.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import yaml

from packrat.deploy import torchserve
from packrat.settings import CORES_ENV, Settings

IMAGE = "packrat:latest"
KSERVE_IMAGE = "packrat-kserve:latest"  # deploy/kserve.Dockerfile: the KServe model server, no Java
KSERVE_PORTS = (8080, 8081)  # the KServe model server's REST and gRPC ports, as KServe's own runtimes use them
CONFIG_DIR = "/etc/packrat"  # the ConfigMap: config.properties, log4j2.xml, the profiles
MODEL_DIR = "/mnt/models"  # the model store; KServe mounts a storageUri here too
RUN_DIR = "/home/packrat/run"  # TorchServe's working directory: key_file.json, TEMP, logs
STORE_PATH = "model-store"  # the folder on the PVC that holds NAME.mar
USER_ID = 1000  # deploy/Dockerfile's non-root user
PORTS = torchserve.Ports()  # 8080 inference, 8081 management, 8082 metrics, 7070/7071 gRPC
SERVE_PORT = 8000  # Ray Serve's HTTP proxy
KSERVE_GROUP = "serving.kserve.io"  # KServe's API group: ServingRuntime, InferenceService
RAY_VERSION = "2.60.0"  # KubeRay's rayVersion when Ray is not installed here


# ---- the archive -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Archive:
    """What the manifests need from a .mar built by `packrat archive`."""

    name: str  # TorchServe's model name (MANIFEST.json)
    file: str  # NAME.mar
    model: str  # the packrat section's model: what the Ray front end rebuilds
    max_batch: int
    profiles: dict[str, str] = field(default_factory=dict)  # file name -> CSV text
    cores: int | None = None  # the CPU budget the archive was built for, if any


def read_archive(path: Path) -> Archive:
    """Read the name, model, batch size and profiles from a packrat archive."""
    try:
        with zipfile.ZipFile(path) as mar:
            manifest = json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]
            section = yaml.safe_load(mar.read(manifest.get("configFile", "model-config.yaml")))["packrat"]
            settings = Settings.from_section(section)
            profiles = {n: mar.read(n).decode() for n in settings.profiles}
            archive = Archive(manifest["modelName"], Path(path).name, settings.model, settings.max_batch, profiles,
                              settings.cores)
    except (OSError, zipfile.BadZipFile, KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"{path} is no archive of the packrat handler ({exc!r}): build one with `packrat archive`") from None
    if not profiles:  # the stock handler's
        raise ValueError(f"{path} has no packrat profile: build it with `packrat archive --handler packrat`")
    return archive


def dns_name(name: str) -> str:
    """`name` as a Kubernetes object name: lower case, '-' for anything else ('tiny_text' -> 'tiny-text')."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def installed_ray_version() -> str:
    """The Ray installed here (`pip install .[ray]`): KubeRay's rayVersion, which must match the image's."""
    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return RAY_VERSION


# ---- the deployment ----------------------------------------------------------------------------

NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # a DNS-1123 label, as Service names must be
QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")  # e.g. 8Gi, 512Mi

@dataclass(frozen=True)
class K8sSpec:
    """How an archive is deployed: the pods' CPUs and memory, the image, replicas, the Ray head, the
    volume and TorchServe's token authorisation."""

    archive: Archive
    cores: int  # whole CPUs per serving pod: its requests, limits and CORES_ENV
    memory: str = "8Gi"
    image: str = IMAGE
    kserve_image: str = KSERVE_IMAGE
    replicas: int = 1
    head_cores: int = 2  # the Ray head pod
    head_memory: str = "4Gi"
    storage: str = "10Gi"  # the PVC's size
    token_auth: bool = True
    token_expiration_min: int | None = None  # TorchServe's default: 60
    ray_version: str = RAY_VERSION

    def __post_init__(self) -> None:
        for what in ("cores", "replicas", "head_cores"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{what} must be an integer >= 1 (whole CPUs keep the pods Guaranteed), got {value!r}")
        # The longest name made from it: NAME-predictor-default (KServe's Service), within 63 characters.
        if not NAME.fullmatch(self.name) or len(self.name) > 40:
            raise ValueError(f"{self.name!r} is no Kubernetes name: pass --name with lower-case letters, digits "
                             f"and '-', at most 40 characters")
        for what in ("memory", "head_memory", "storage"):
            if not QUANTITY.fullmatch(getattr(self, what)):
                raise ValueError(f"{what} must be a Kubernetes quantity such as 8Gi or 512Mi, got {getattr(self, what)!r}")
        if self.archive.cores is not None and self.archive.cores != self.cores:
            raise ValueError(f"{self.archive.file} was built for {self.archive.cores} cores: export it with "
                             f"--cores {self.archive.cores}, or rebuild it with `packrat archive --cores {self.cores}`")
        if self.token_auth and self.replicas > 1:
            # Each TorchServe makes its own random keys at start: behind one Service a client's key
            # would be refused by every pod but one.
            raise ValueError("with token authorisation every pod has its own random key, so a Service over "
                             f"{self.replicas} replicas would refuse most requests: use --replicas 1, or "
                             "--no-token-auth and keep the Service inside the cluster (see docs/kubernetes.md)")

    @property
    def name(self) -> str:
        return self.archive.name

    @property
    def claim(self) -> str:
        return f"{self.name}-models"

    @property
    def access_mode(self) -> str:
        # Pods on several nodes can only share a ReadWriteMany volume.
        return "ReadWriteOnce" if self.replicas == 1 else "ReadWriteMany"


# ---- building blocks ---------------------------------------------------------------------------

def _meta(s: K8sSpec, name: str, component: str) -> dict:
    return {"name": name, "labels": _labels(s, component)}


def _labels(s: K8sSpec, component: str) -> dict:
    return {"app.kubernetes.io/name": "packrat", "app.kubernetes.io/instance": s.name,
            "app.kubernetes.io/component": component}


def resources(cores: int, memory: str) -> dict:
    """Requests equal to limits, whole CPUs: the Guaranteed QoS class the static CPU manager pins."""
    amount = {"cpu": str(cores), "memory": memory}
    return {"requests": dict(amount), "limits": dict(amount)}


def _env(cores: int, **extra: str) -> list[dict]:
    return [{"name": k, "value": v} for k, v in {CORES_ENV.name: str(cores), **extra}.items()]


def _security() -> dict:
    # On the container, not the pod: KServe's ServingRuntime has no pod-level securityContext.
    return {"runAsNonRoot": True, "runAsUser": USER_ID, "runAsGroup": USER_ID, "allowPrivilegeEscalation": False}


def torchserve_config(s: K8sSpec) -> str:
    """packrat serve's config.properties, but inference on every address of the pod (for the
    Service) while management and metrics stay on the pod's loopback."""
    extra = {"inference_address": f"http://0.0.0.0:{PORTS.inference}"}
    if s.token_expiration_min is not None:
        extra["token_expiration_min"] = str(s.token_expiration_min)
    return torchserve.config_properties(PORTS, Path(MODEL_DIR), s.token_auth, extra)


def config_map(s: K8sSpec) -> dict:
    data = {"config.properties": torchserve_config(s), "log4j2.xml": torchserve.LOG_CONFIG.read_text(),
            **s.archive.profiles}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(s, s.name, "config"), "data": data}


def pvc(s: K8sSpec) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(s, s.claim, "models"),
            "spec": {"accessModes": [s.access_mode], "resources": {"requests": {"storage": s.storage}}}}


def ready_command(s: K8sSpec) -> list[str]:
    return ["packrat", "ready", "--model", s.name, "--run-dir", RUN_DIR,
            "--management-port", str(PORTS.management)]


def probes(s: K8sSpec) -> dict:
    """Readiness: some worker READY in the management API (not /ping, which says Healthy while
    workers crash), asked by `packrat ready` inside the pod since management is on its loopback.
    Liveness: the inference port accepts connections; /ping would need the inference key when
    token authorisation is on (TorchServe 0.12 answers 400 without it), which a kubelet cannot send."""
    ready = {"exec": {"command": ready_command(s)}, "timeoutSeconds": 8}
    return {
        # The first start may compile the model's packages: give it up to 15 minutes.
        "startupProbe": {**ready, "periodSeconds": 10, "failureThreshold": 90},
        "readinessProbe": {**ready, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {"tcpSocket": {"port": PORTS.inference}, "periodSeconds": 20, "failureThreshold": 3},
    }


def torchserve_container(s: K8sSpec, name: str, **env: str) -> dict:
    command = ["torchserve", "--start", "--foreground", "--ncs", "--ts-config", f"{CONFIG_DIR}/config.properties",
               "--model-store", MODEL_DIR, "--models", f"{s.name}={s.archive.file}",
               "--log-config", f"{CONFIG_DIR}/log4j2.xml"]
    if not s.token_auth:
        command.append("--disable-token-auth")
    mounts = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
              {"name": "run", "mountPath": RUN_DIR}, {"name": "shm", "mountPath": "/dev/shm"}]
    return {
        "name": name, "image": s.image, "command": command,
        "workingDir": RUN_DIR,  # TorchServe writes key_file.json into its working directory
        "env": _env(s.cores, TEMP=f"{RUN_DIR}/tmp", LOG_LOCATION=f"{RUN_DIR}/logs",
                    METRICS_LOCATION=f"{RUN_DIR}/logs", **env),
        "ports": [{"name": "http", "containerPort": PORTS.inference, "protocol": "TCP"}],
        "resources": resources(s.cores, s.memory), "volumeMounts": mounts,
        "securityContext": _security(), **probes(s),
    }


def _volumes(s: K8sSpec) -> list[dict]:
    return [{"name": "config", "configMap": {"name": s.name}},
            {"name": "run", "emptyDir": {}},
            # The pool passes batches through /dev/shm; a container's own is 64 MiB. Memory-backed,
            # so it counts against the memory limit.
            {"name": "shm", "emptyDir": {"medium": "Memory"}}]


# ---- torchserve.yaml ---------------------------------------------------------------------------

def deployment(s: K8sSpec) -> dict:
    container = torchserve_container(s, "torchserve")
    container["volumeMounts"].append({"name": "models", "mountPath": MODEL_DIR, "subPath": STORE_PATH,
                                      "readOnly": True})
    volumes = [*_volumes(s), {"name": "models", "persistentVolumeClaim": {"claimName": s.claim, "readOnly": True}}]
    selector = {"app.kubernetes.io/instance": s.name, "app.kubernetes.io/component": "torchserve"}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(s, s.name, "torchserve"),
        "spec": {
            "replicas": s.replicas, "selector": {"matchLabels": selector},
            # A node rarely has spare whole cores for a second copy during a rolling update.
            "strategy": {"type": "Recreate"},
            "template": {"metadata": {"labels": _labels(s, "torchserve")},
                         "spec": {"containers": [container], "volumes": volumes}},
        },
    }


def service(s: K8sSpec) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(s, s.name, "torchserve"),
            "spec": {"selector": {"app.kubernetes.io/instance": s.name, "app.kubernetes.io/component": "torchserve"},
                     "ports": [{"name": "http", "port": PORTS.inference, "targetPort": "http", "protocol": "TCP"}]}}


def torchserve_docs(s: K8sSpec) -> list[dict]:
    return [config_map(s), pvc(s), deployment(s), service(s)]


# ---- rayservice.yaml ---------------------------------------------------------------------------

def serve_config(s: K8sSpec) -> dict:
    """Ray Serve's config: one application, one replica per worker node, each owning its node's CPUs."""
    args = {"model": s.archive.model, "profiles": [f"{CONFIG_DIR}/{n}" for n in s.archive.profiles],
            "max_batch": s.archive.max_batch, "name": s.name, "replicas": s.replicas, "num_cpus": s.cores}
    engines = {"name": f"{s.name}-engine", "num_replicas": s.replicas, "max_replicas_per_node": 1,
               "ray_actor_options": {"num_cpus": s.cores}}  # the ingress (deployment NAME) keeps its own
    return {"applications": [{"name": s.name, "import_path": "packrat.ray_serve:app", "route_prefix": "/",
                              "args": args, "deployments": [engines]}]}


def ray_pod(s: K8sSpec, name: str, cores: int, memory: str, ports: list[dict]) -> dict:
    container = {"name": name, "image": s.image, "env": _env(cores), "resources": resources(cores, memory),
                 "ports": ports, "securityContext": _security(),
                 "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                                  {"name": "shm", "mountPath": "/dev/shm"}]}
    volumes = [v for v in _volumes(s) if v["name"] != "run"]
    return {"metadata": {"labels": _labels(s, "ray")},
            "spec": {"containers": [container], "volumes": volumes}}


def rayservice(s: K8sSpec) -> dict:
    head_ports = [{"name": "gcs", "containerPort": 6379}, {"name": "dashboard", "containerPort": 8265},
                  {"name": "client", "containerPort": 10001}, {"name": "serve", "containerPort": SERVE_PORT}]
    worker = {"groupName": "packrat", "replicas": s.replicas, "minReplicas": s.replicas, "maxReplicas": s.replicas,
              # Ray admits by these CPUs; they must equal the pinned cores the pod owns.
              "rayStartParams": {"num-cpus": str(s.cores)},
              "template": ray_pod(s, "ray-worker", s.cores, s.memory, [{"name": "serve", "containerPort": SERVE_PORT}])}
    head = {"rayStartParams": {"num-cpus": str(s.head_cores), "dashboard-host": "0.0.0.0"},
            "template": ray_pod(s, "ray-head", s.head_cores, s.head_memory, head_ports)}
    return {
        "apiVersion": "ray.io/v1", "kind": "RayService", "metadata": _meta(s, s.name, "ray"),
        "spec": {"serveConfigV2": yaml.safe_dump(serve_config(s), sort_keys=False),
                 "rayClusterConfig": {"rayVersion": s.ray_version, "headGroupSpec": head,
                                      "workerGroupSpecs": [worker]}},
    }


def ray_docs(s: K8sSpec) -> list[dict]:
    return [config_map(s), rayservice(s)]


# ---- kserve.yaml -------------------------------------------------------------------------------

def runtime_name(s: K8sSpec) -> str:
    return f"{s.name}-packrat"


def serving_runtime(s: K8sSpec) -> dict:
    # TS_OPEN_INFERENCE_PROTOCOL=oip adds v2's health and metadata routes; TorchServe routes
    # /v1/models/NAME:predict and /v2/models/NAME/infer to the handler either way.
    container = torchserve_container(s, "kserve-container", **{torchserve.OIP_ENV: "oip"})
    return {
        "apiVersion": KSERVE_GROUP + "/v1alpha1", "kind": "ServingRuntime",
        "metadata": _meta(s, runtime_name(s), "kserve"),
        "spec": {"supportedModelFormats": [{"name": "packrat", "version": "1", "autoSelect": False}],
                 "protocolVersions": ["v1", "v2"], "containers": [container], "volumes": _volumes(s)},
    }


def inference_service(s: K8sSpec) -> dict:
    meta = _meta(s, s.name, "kserve")
    # RawDeployment: a plain Deployment. Knative's mode adds a queue-proxy sidecar whose requests
    # are not its limits, which would make the pod Burstable.
    meta["annotations"] = {KSERVE_GROUP + "/deploymentMode": "RawDeployment"}
    model = {"modelFormat": {"name": "packrat", "version": "1"}, "runtime": runtime_name(s),
             # pvc:// is mounted at /mnt/models directly (KServe's direct PVC mount): no
             # storage-initializer init container to break the Guaranteed class.
             "storageUri": f"pvc://{s.claim}/{STORE_PATH}",
             "resources": resources(s.cores, s.memory), "env": _env(s.cores)}
    return {"apiVersion": KSERVE_GROUP + "/v1beta1", "kind": "InferenceService", "metadata": meta,
            "spec": {"predictor": {"minReplicas": s.replicas, "maxReplicas": s.replicas, "model": model}}}


def kserve_docs(s: K8sSpec) -> list[dict]:
    return [config_map(s), pvc(s), serving_runtime(s), inference_service(s)]


# ---- kserve-sdk.yaml ---------------------------------------------------------------------------

def sdk_runtime_name(s: K8sSpec) -> str:
    return f"{s.name}-packrat-kserve"


def sdk_model(s: K8sSpec) -> str:
    """The server's --model: the archive (NAME.mar in the model store) served under the objects'
    name, which --name may have changed (as TorchServe's --models NAME=FILE)."""
    return f"{s.name}={Path(s.archive.file).stem}"


def sdk_probes(s: K8sSpec) -> dict:
    """HTTP probes of the server's own routes: the model's OIP ready route says 200 only while its
    pool can serve (503 before it starts, or once every instance fails to load). The server opens
    its ports once its models serve, so the startup probe waits out a first start that compiles."""
    http = PORTS.inference
    ready = {"httpGet": {"path": f"/v2/models/{s.name}/ready", "port": http}, "timeoutSeconds": 5}
    return {"startupProbe": {**ready, "periodSeconds": 10, "failureThreshold": 90},
            "readinessProbe": {**ready, "periodSeconds": 10, "failureThreshold": 3},
            "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": http}, "periodSeconds": 20,
                              "failureThreshold": 3}}


def sdk_container(s: K8sSpec) -> dict:
    rest, grpc = KSERVE_PORTS
    command = ["python", "-m", "packrat.frontends.kserve_server", "--model-store", MODEL_DIR, "--model", sdk_model(s),
               "--host", "0.0.0.0", "--http-port", str(rest), "--grpc-port", str(grpc)]
    mounts = [{"name": "run", "mountPath": RUN_DIR}, {"name": "shm", "mountPath": "/dev/shm"}]
    return {
        "name": "kserve-container", "image": s.kserve_image, "command": command, "workingDir": RUN_DIR,
        # TMPDIR: where the server unpacks the archive (the model store is mounted read-only)
        "env": _env(s.cores, TMPDIR=RUN_DIR),
        "ports": [{"name": "http1", "containerPort": rest, "protocol": "TCP"},
                  {"name": "h2c", "containerPort": grpc, "protocol": "TCP"}],
        "resources": resources(s.cores, s.memory), "volumeMounts": mounts,
        "securityContext": _security(), **sdk_probes(s),
    }


def sdk_serving_runtime(s: K8sSpec) -> dict:
    volumes = [v for v in _volumes(s) if v["name"] != "config"]  # the profiles travel inside the archive
    return {
        "apiVersion": KSERVE_GROUP + "/v1alpha1", "kind": "ServingRuntime",
        "metadata": _meta(s, sdk_runtime_name(s), "kserve-sdk"),
        "spec": {"supportedModelFormats": [{"name": "packrat", "version": "1", "autoSelect": False}],
                 "protocolVersions": ["v2", "grpc-v2", "v1"], "containers": [sdk_container(s)], "volumes": volumes},
    }


def sdk_inference_service(s: K8sSpec) -> dict:
    service = inference_service(s)
    model = service["spec"]["predictor"]["model"]
    model.update(runtime=sdk_runtime_name(s), protocolVersion="v2")
    service["metadata"]["labels"] = _labels(s, "kserve-sdk")
    return service


def kserve_sdk_docs(s: K8sSpec) -> list[dict]:
    return [pvc(s), sdk_serving_runtime(s), sdk_inference_service(s)]


# ---- copy-models.yaml --------------------------------------------------------------------------

def copy_pod(s: K8sSpec) -> dict:
    """A throw-away pod that mounts the PVC read-write, for `kubectl cp` of the archive."""
    container = {"name": "copy", "image": "busybox:1.36",
                 "command": ["sh", "-c", f"mkdir -p /mnt/pvc/{STORE_PATH} && sleep 3600"],
                 "resources": resources(1, "64Mi"),
                 "volumeMounts": [{"name": "models", "mountPath": "/mnt/pvc"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _meta(s, f"{s.name}-copy", "copy"),
            "spec": {"restartPolicy": "Never", "containers": [container],
                     "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": s.claim}}]}}


# ---- files -------------------------------------------------------------------------------------

def _auth_text(s: K8sSpec, workload: str) -> str:
    """How clients authenticate to TorchServe in `workload` (a Deployment name)."""
    if not s.token_auth:
        return ("Token authorisation is OFF: anyone who reaches the Service can call the model. Keep it\n"
                "ClusterIP (no Ingress) and restrict it with a NetworkPolicy or an authenticating gateway.")
    key_file = f"{RUN_DIR}/key_file.json"
    return (f"Token authorisation is on: TorchServe makes random keys at every start into {key_file}\n"
            f"(one pod's keys, hence --replicas 1). Read the inference key and send 'Authorization: Bearer KEY':\n"
            f"  kubectl exec deploy/{workload} -- python -c \"import json; "
            f"print(json.load(open('{key_file}'))['inference']['key'])\"\n"
            f"Keys expire after token_expiration_min (TorchServe's default: 60) minutes and change with the pod.\n"
            f"Renew the inference key (the old one stops working) through the token API on the pod's loopback:\n"
            f"  kubectl exec deploy/{workload} -- python -c \"from packrat.deploy import torchserve; "
            f"torchserve.renew_key(torchserve.Server('{RUN_DIR}', '{s.name}'), 'inference')\"\n"
            f"The readiness probe renews the management key by itself.")


def _headers(s: K8sSpec) -> dict[str, str]:
    n, mar = s.name, s.archive.file
    copy = (f"First put the archive on the PVC: kubectl apply -f copy-models.yaml;\n"
            f"  kubectl wait --for=condition=Ready pod/{n}-copy; kubectl cp {mar} {n}-copy:/mnt/pvc/{STORE_PATH}/{mar};\n"
            f"  kubectl delete pod {n}-copy")
    return {
        "torchserve.yaml": f"packrat: TorchServe with the packrat handler for {n}, {s.cores} pinned cores a pod.\n{copy}\n"
                           f"Then kubectl apply -f torchserve.yaml; in the cluster: POST http://{n}:{PORTS.inference}"
                           f"/predictions/{n}\n{_auth_text(s, n)}",
        "rayservice.yaml": f"packrat: the Ray Serve front end (packrat.ray_serve:app) for {n} on KubeRay, one replica per "
                           f"worker pod.\nkubectl apply -f rayservice.yaml; in the cluster: POST "
                           f"http://{n}-serve-svc:{SERVE_PORT}/predictions/{n}\nRay Serve's HTTP proxy has no "
                           f"authentication: keep it inside the cluster.",
        "kserve-sdk.yaml": f"packrat: a KServe ServingRuntime running packrat's KServe model server ({sdk_runtime_name(s)},\n"
                           f"image {s.kserve_image}) and InferenceService {n} (RawDeployment). Apply this or kserve.yaml.\n"
                           f"{copy}\nThen kubectl apply -f kserve-sdk.yaml; in the cluster: POST http://{n}-predictor/v2/models/"
                           f"{n}/infer (REST), gRPC on port {KSERVE_PORTS[1]}, or /v1/models/{n}:predict\n"
                           f"No authentication (as KServe's own runtimes): keep the Service inside the cluster, or put "
                           f"an authenticating gateway in front.",
        "kserve.yaml": f"packrat: a KServe ServingRuntime ({runtime_name(s)}) and InferenceService {n} (RawDeployment).\n"
                       f"{copy}\nThen kubectl apply -f kserve.yaml; in the cluster: POST http://{n}-predictor/v1/models/"
                       f"{n}:predict or /v2/models/{n}/infer\n{_auth_text(s, n + '-predictor')}",
        "copy-models.yaml": f"The PVC {s.claim} that holds {STORE_PATH}/{mar}, and a helper pod to copy the archive there.",
    }


class _Dumper(yaml.SafeDumper):
    """Plain YAML for people and kubectl: no &anchors for shared dicts, files (config.properties,
    profiles) as literal blocks."""

    def ignore_aliases(self, data) -> bool:
        return True


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def render(s: K8sSpec) -> dict[str, list[dict]]:
    """File name -> the manifests it holds."""
    return {"torchserve.yaml": torchserve_docs(s), "rayservice.yaml": ray_docs(s), "kserve.yaml": kserve_docs(s),
            "kserve-sdk.yaml": kserve_sdk_docs(s), "copy-models.yaml": [pvc(s), copy_pod(s)]}


def write(s: K8sSpec, out: Path) -> list[Path]:
    """Write every file of render(s) into `out`, each led by a comment on how to use it, and the
    ConfigMap's files into out/etc/ (for `docker run -v OUT/etc:/etc/packrat`)."""
    (out / "etc").mkdir(parents=True, exist_ok=True)
    headers, written = _headers(s), []
    for name, docs in render(s).items():
        text = io.StringIO()
        text.write("".join(f"# {line}\n" for line in headers[name].splitlines()))
        yaml.dump_all(docs, text, Dumper=_Dumper, sort_keys=False, width=120)
        (out / name).write_text(text.getvalue())
        written.append(out / name)
    for name, content in config_map(s)["data"].items():
        (out / "etc" / name).write_text(content)
        written.append(out / "etc" / name)
    return written
