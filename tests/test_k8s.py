"""`packrat export k8s` and `packrat ready`: the manifests validated offline against Kubernetes'
schemas (kubernetes-validate), Guaranteed QoS on every container, the probes, and the readiness
check against a fake management API. No cluster, no TorchServe."""

from __future__ import annotations

import json
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import kubernetes_validate
import pytest
import yaml

from packrat.cli import main as cli
from packrat.cli.ready import cmd_ready
from packrat.deploy import k8s
from packrat.deploy import torchserve
from packrat.deploy import archive
from packrat.settings import CORES_ENV, Settings

K8S_VERSION = kubernetes_validate.latest_version()  # the newest schemas the package ships (1.37 here)
CORE_KINDS = {"Deployment", "Service", "ConfigMap", "PersistentVolumeClaim", "Pod"}
PROFILE = "threads,batch,latency_ms\n1,1,20.0\n2,1,12.0\n1,4,70.0\n2,4,40.0\n"


def make_archive(directory: Path, name: str = "resnet50", model: str = "resnet50", profiles=("profile.csv",),
                 cores: int | None = None, handler: str = "packrat") -> Path:
    """A .mar as `packrat archive` lays it out (its model-config.yaml from the archive's own writer),
    without the handler's code, which export does not read."""
    names = list(profiles) if handler == "packrat" else []
    config = archive.model_config_yaml(Settings(model, profiles=names, max_batch=4, cores=cores), handler=handler)
    manifest = {"model": {"modelName": name, "handler": f"{handler}_handler.py", "modelVersion": "1.0",
                          "configFile": "model-config.yaml"}, "runtime": "python", "archiverVersion": "0.12.0"}
    path = directory / f"{name}.mar"
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        mar.writestr("model-config.yaml", config)
        for profile in names:
            mar.writestr(profile, PROFILE)
    return path


CASES = {
    "one pod, token auth": dict(cores=4, memory="6Gi"),
    "three pods, no token auth, two profiles": dict(cores=16, memory="32Gi", replicas=3, token_auth=False,
                                                    head_cores=4, image="registry.example.com/packrat:1",
                                                    token_expiration_min=30),
}


@pytest.fixture(params=list(CASES), scope="module")
def rendered(request, tmp_path_factory):
    """(settings, {file name: [documents]}) as written to disk and read back."""
    directory = tmp_path_factory.mktemp("k8s")
    profiles = ("profile-0.csv", "profile-1.csv") if "two profiles" in request.param else ("profile.csv",)
    settings = k8s.K8sSpec(k8s.read_archive(make_archive(directory, profiles=profiles)), **CASES[request.param])
    files = k8s.write(settings, directory / "out")
    return settings, {f.name: list(yaml.safe_load_all(f.read_text())) for f in files if f.suffix == ".yaml"}


def docs_of(files: dict, kind: str) -> list[dict]:
    return [d for docs in files.values() for d in docs if d["kind"] == kind]


def containers(node, key: str = "containers"):
    """Every container list under `key` anywhere in a manifest (pod templates of CRDs included)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield from v
            else:
                yield from containers(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from containers(item, key)


def pod_specs(doc: dict) -> list[dict]:
    """The pod specs a manifest makes (custom resources' templates too), as the kubelet gets them."""
    kind, spec = doc["kind"], doc.get("spec", {})
    if kind == "Deployment":
        return [spec["template"]["spec"]]
    if kind == "Pod":
        return [spec]
    if kind == "RayService":
        cluster = spec["rayClusterConfig"]
        return [g["template"]["spec"] for g in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]]
    if kind == "ServingRuntime":
        return [{k: spec[k] for k in ("containers", "volumes")}]
    return []


def test_every_file_is_written_with_a_comment_on_how_to_use_it(rendered, tmp_path):
    settings, files = rendered
    assert set(files) == {"torchserve.yaml", "rayservice.yaml", "kserve.yaml", "kserve-sdk.yaml", "copy-models.yaml"}
    written = k8s.write(settings, tmp_path)
    for path in written:
        if path.suffix == ".yaml":
            assert path.read_text().startswith("# packrat: ") or path.name == "copy-models.yaml"
            assert "&id" not in path.read_text()  # no YAML anchors for people to untangle
    config_map = docs_of(files, "ConfigMap")[0]
    assert {p.name: p.read_text() for p in written if p.parent.name == "etc"} == config_map["data"]


def test_core_kinds_validate_against_kubernetes_schemas(rendered):
    _, files = rendered
    kinds = set()
    for docs in files.values():
        for doc in docs:
            if doc["kind"] in CORE_KINDS:
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
                kinds.add(doc["kind"])
    assert kinds == CORE_KINDS


def test_pod_templates_of_custom_resources_are_valid_pod_specs(rendered):
    _, files = rendered
    for kind in ("RayService", "ServingRuntime"):
        for doc in docs_of(files, kind):
            for spec in pod_specs(doc):
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": spec}
                kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_a_broken_manifest_fails_validation(rendered):
    """The validation above can fail: strict mode rejects an unknown field."""
    _, files = rendered
    deployment = json.loads(json.dumps(docs_of(files, "Deployment")[0]))
    deployment["spec"]["template"]["spec"]["containers"][0]["cpus"] = 4
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_every_container_is_guaranteed_with_whole_cpus(rendered):
    settings, files = rendered
    seen = 0
    for docs in files.values():
        assert not list(containers(docs, "initContainers"))
        for container in containers(docs):
            resources = container["resources"]
            assert resources["requests"] == resources["limits"], container["name"]
            assert set(resources["limits"]) == {"cpu", "memory"}
            assert str(resources["limits"]["cpu"]).isdigit()
            seen += 1
    assert seen == 6  # TorchServe's Deployment, the Ray head and worker, the two ServingRuntimes, the copy pod
    for service in docs_of(files, "InferenceService"):
        assert service["spec"]["predictor"]["model"]["resources"] == k8s.resources(settings.cores, settings.memory)


def test_packrat_cores_equals_the_cpu_limit(rendered):
    settings, files = rendered
    serving_containers = [c for name in ("torchserve.yaml", "kserve.yaml", "kserve-sdk.yaml", "rayservice.yaml")
                          for d in files[name] for c in containers(d)]
    assert len(serving_containers) == 5
    for container in serving_containers:
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env[CORES_ENV.name] == container["resources"]["limits"]["cpu"]
    worker = docs_of(files, "RayService")[0]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert worker["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == str(settings.cores)


def test_readiness_is_packrat_ready_not_ping(rendered):
    settings, files = rendered
    torchserve_runtimes = [d for d in files["kserve.yaml"] if d["kind"] == "ServingRuntime"]
    for doc in docs_of(files, "Deployment") + torchserve_runtimes:
        for container in containers(doc):
            for probe in ("readinessProbe", "startupProbe"):
                command = container[probe]["exec"]["command"]
                assert command[:2] == ["packrat", "ready"] and "ping" not in json.dumps(container[probe])
                args = cli.build_parser().parse_args(command[1:])  # a command packrat really has
                assert args.func is cmd_ready and args.model == settings.name
                assert args.run_dir == Path(container["workingDir"])  # where TorchServe writes key_file.json
            assert container["livenessProbe"]["tcpSocket"]["port"] == 8080


def test_inference_on_every_address_management_on_loopback(rendered):
    settings, files = rendered
    config_maps = docs_of(files, "ConfigMap")
    assert all(c == config_maps[0] for c in config_maps)  # one object, the same in every file
    properties = dict(line.split("=", 1) for line in config_maps[0]["data"]["config.properties"].splitlines())
    assert properties["inference_address"] == "http://0.0.0.0:8080"
    assert properties["management_address"] == "http://127.0.0.1:8081"
    assert properties["metrics_address"] == "http://127.0.0.1:8082"
    assert properties["disable_token_authorization"] == str(not settings.token_auth).lower()
    assert properties.get("token_expiration_min") == (str(settings.token_expiration_min)
                                                      if settings.token_expiration_min else None)
    assert set(settings.archive.profiles) <= set(config_maps[0]["data"])
    service = docs_of(files, "Service")[0]
    assert service["spec"]["ports"][0]["port"] == 8080


def test_kserve_reads_the_pvc_directly(rendered):
    settings, files = rendered
    runtime, isvc = docs_of(files, "ServingRuntime")[0], docs_of(files, "InferenceService")[0]
    claims = [d["metadata"]["name"] for d in files["kserve.yaml"] if d["kind"] == "PersistentVolumeClaim"]
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == f"pvc://{claims[0]}/model-store"
    assert isvc["spec"]["predictor"]["model"]["runtime"] == runtime["metadata"]["name"]
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1" and isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert runtime["spec"]["protocolVersions"] == ["v1", "v2"]
    container = runtime["spec"]["containers"][0]
    assert container["name"] == "kserve-container"
    assert {"name": "TS_OPEN_INFERENCE_PROTOCOL", "value": "oip"} in container["env"]
    command = container["command"]
    assert command[:2] == ["torchserve", "--start"] and command[command.index("--model-store") + 1] == "/mnt/models"
    assert ("--disable-token-auth" in command) is not settings.token_auth


def test_kserve_sdk_runs_packrats_model_server_guaranteed_with_http_probes(rendered):
    settings, files = rendered
    runtime, isvc = (next(d for d in files["kserve-sdk.yaml"] if d["kind"] == kind)
                     for kind in ("ServingRuntime", "InferenceService"))
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1" and isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"] != docs_of(files, "ServingRuntime")[0]["metadata"]["name"]
    assert model["storageUri"] == f"pvc://{settings.claim}/model-store" and model["protocolVersion"] == "v2"
    container, = runtime["spec"]["containers"]
    assert container["image"] == settings.kserve_image
    command = container["command"]
    assert command[:3] == ["python", "-m", "packrat.frontends.kserve_server"]
    args = server_args(command[3:])  # options the server has
    assert (args.model_store, args.models, args.host) == (Path("/mnt/models"), ["resnet50=resnet50"], "0.0.0.0")
    assert [p["containerPort"] for p in container["ports"]] == [args.http_port, args.grpc_port]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/models/resnet50/ready", "port": args.http_port}
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert "exec" not in json.dumps(container)  # no Python process started every 10 s inside the CPU budget


def server_args(argv: list[str]):
    pytest.importorskip("kserve", reason="the KServe front end is an optional extra")
    from packrat.frontends.kserve_server import parse_args

    return parse_args(argv)


def test_rayservice_runs_one_packrat_replica_per_worker(rendered):
    settings, files = rendered
    ray = docs_of(files, "RayService")[0]
    assert ray["apiVersion"] == "ray.io/v1"
    app, = yaml.safe_load(ray["spec"]["serveConfigV2"])["applications"]
    assert app["import_path"] == "packrat.ray_serve:app"
    assert app["args"]["model"] == "resnet50" and app["args"]["max_batch"] == 4
    assert app["args"]["profiles"] == [f"/etc/packrat/{n}" for n in settings.archive.profiles]
    deployment, = app["deployments"]  # the engines (packrat.ray_serve.app names them NAME-engine)
    assert deployment["name"] == f"{app['name']}-engine" == f"{app['args']['name']}-engine"
    assert deployment["max_replicas_per_node"] == 1 and deployment["num_replicas"] == settings.replicas
    assert deployment["ray_actor_options"]["num_cpus"] == settings.cores
    cluster = ray["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        limit = group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]
        assert group["rayStartParams"]["num-cpus"] == limit
    assert cluster["workerGroupSpecs"][0]["replicas"] == settings.replicas


def test_token_auth_with_several_replicas_is_refused(tmp_path):
    archive = k8s.read_archive(make_archive(tmp_path))
    with pytest.raises(ValueError, match="own random key"):
        k8s.K8sSpec(archive, 4, replicas=2)
    assert k8s.K8sSpec(archive, 4, replicas=2, token_auth=False).access_mode == "ReadWriteMany"


@pytest.mark.parametrize("change, message", [
    (dict(cores=0), "integer >= 1"), (dict(memory="lots"), "quantity"), (dict(name="Bad_Name"), "Kubernetes name"),
])
def test_bad_settings_are_refused(tmp_path, change, message):
    archive = k8s.read_archive(make_archive(tmp_path))
    if "name" in change:
        archive = k8s.Archive(change.pop("name"), archive.file, archive.model, archive.max_batch, archive.profiles)
    with pytest.raises(ValueError, match=message):
        k8s.K8sSpec(archive, **{"cores": 4, **change})


def test_archive_checks(tmp_path):
    assert k8s.read_archive(make_archive(tmp_path, cores=8)).cores == 8
    with pytest.raises(ValueError, match="built for 8 cores"):
        k8s.K8sSpec(k8s.read_archive(make_archive(tmp_path, cores=8)), 4)
    with pytest.raises(ValueError, match="no packrat profile"):
        k8s.read_archive(make_archive(tmp_path, name="stock", handler="stock"))
    (tmp_path / "junk.mar").write_text("not a zip")
    with pytest.raises(ValueError, match="no archive of the packrat handler"):
        k8s.read_archive(tmp_path / "junk.mar")


def test_cli_export_k8s(tmp_path, capsys):
    mar = make_archive(tmp_path, name="tiny_text", model="tiny_text")
    code = cli.main(["export", "k8s", "--archive", str(mar), "--cores", "2", "--memory", "3Gi",
                     "--out", str(tmp_path / "out"), "--json"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["name"] == "tiny-text"  # made DNS-safe
    assert sorted(Path(f).name for f in printed["files"] if f.endswith(".yaml")) == sorted(
        ["torchserve.yaml", "rayservice.yaml", "kserve.yaml", "kserve-sdk.yaml", "copy-models.yaml"])
    assert (tmp_path / "out" / "etc" / "config.properties").is_file()
    runtime = next(d for d in yaml.safe_load_all((tmp_path / "out" / "kserve-sdk.yaml").read_text())
                   if d["kind"] == "ServingRuntime")
    command = runtime["spec"]["containers"][0]["command"]
    assert command[command.index("--model") + 1] == "tiny-text=tiny_text"  # served as the objects are named
    deployment = next(d for d in yaml.safe_load_all((tmp_path / "out" / "torchserve.yaml").read_text())
                      if d["kind"] == "Deployment")
    assert "tiny-text=tiny_text.mar" in deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cli.main(["export", "k8s", "--archive", str(mar), "--cores", "2", "--replicas", "2",
                     "--out", str(tmp_path / "out")]) == 2
    assert "own random key" in capsys.readouterr().err


# ---- packrat ready against a fake management API --------------------------------------------------

class FakeTorchServe:
    """GET /models/NAME and the token API of TorchServe 0.12's management address, as measured:
    a wrong or expired key is answered 400 (InvalidKeyException); /token?type=management with the
    API key makes a new management key and rewrites key_file.json."""

    def __init__(self, run_dir: Path, model: str, statuses: list[str]):
        self.run_dir, self.model, self.statuses = run_dir, model, statuses
        self.keys = {"management": "m-1", "inference": "i-1", "API": "api"}
        self.expired = False
        self.write_keys()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                url = urlparse(self.path)
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                if url.path == "/token":
                    if token != fake.keys["API"]:
                        return self.answer(400, {"code": 400, "type": "InvalidKeyException"})
                    api = parse_qs(url.query)["type"][0]
                    fake.keys[api] = fake.keys[api] + "+"
                    fake.expired = False
                    fake.write_keys()
                    return self.answer(200, {})
                if token != fake.keys["management"] or fake.expired:
                    return self.answer(400, {"code": 400, "type": "InvalidKeyException"})
                if url.path != f"/models/{fake.model}":
                    return self.answer(404, {"code": 404, "type": "ModelNotFoundException"})
                workers = [{"id": str(9000 + i), "status": s} for i, s in enumerate(fake.statuses)]
                return self.answer(200, [{"modelName": fake.model, "workers": workers}])

            def answer(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def write_keys(self):
        (self.run_dir / "key_file.json").write_text(json.dumps(
            {api: {"key": key, "expiration time": "2030-01-01T00:00:00Z"} for api, key in self.keys.items()}))

    def ready(self, model: str | None = None) -> int:
        return cli.main(["ready", "--model", model or self.model, "--run-dir", str(self.run_dir),
                         "--management-port", str(self.port)])


@pytest.fixture
def fake(tmp_path):
    server = FakeTorchServe(tmp_path, "resnet50", ["READY"])
    yield server
    server.http.shutdown()
    server.http.server_close()


def test_ready_when_some_worker_is_ready(fake, capsys):
    assert fake.ready() == 0
    assert "resnet50: ready" in capsys.readouterr().out
    fake.statuses[:] = ["UNLOADING", "READY"]
    assert fake.ready() == 0


@pytest.mark.parametrize("statuses", [[], ["LOADING"], ["UNLOADING", "STOPPED"]])
def test_not_ready_without_a_ready_worker(fake, statuses):
    fake.statuses[:] = statuses
    assert fake.ready() == 1


def test_an_unknown_model_is_not_ready(fake):
    assert fake.ready("other") == 1


def test_an_expired_management_key_is_renewed(fake):
    fake.expired = True
    assert fake.ready() == 0
    keys = json.loads((fake.run_dir / "key_file.json").read_text())
    assert keys["management"]["key"] == "m-1+" and keys["inference"]["key"] == "i-1"  # clients' key untouched
    assert fake.ready() == 0


def test_a_wrong_api_key_leaves_it_not_ready(fake):
    fake.expired = True
    fake.keys["API"] = "changed"  # the file keeps the old one
    assert fake.ready() == 1


def test_nothing_listening_is_not_ready(tmp_path):
    port = torchserve.free_port()
    assert cli.main(["ready", "--model", "m", "--run-dir", str(tmp_path), "--management-port", str(port)]) == 1


def test_ready_reads_the_server_packrat_serve_recorded(fake):
    torchserve.Server(fake.run_dir, fake.model, torchserve.Ports(management=fake.port)).save()
    assert cli.main(["ready", "--run-dir", str(fake.run_dir)]) == 0
