"""The Ray Serve front end: one packrat engine per node of a Ray cluster.

Two deployments. `NAME-engine` is an Engine (packrat/serving/engine.py) per node (`max_replicas_per_node=1`):
each plans for its own node, with the CPU budget it sees (affinity, CFS quota, `cores`) and the
profile taken on the machine most like it, so a cluster of N nodes runs N engines. `NAME` is the
ingress beside Ray Serve's HTTP proxy on the head node: it routes HTTP, refuses oversized bodies,
and hands each request to an engine (Ray Serve's router picks the less loaded of two), sending it
to another when its engine dies while answering. Requests and answers are those of the TorchServe
handler (the shared codec): raw tensors, images, text, JSON, KServe v1 and the whole v2 (Open
Inference) protocol, including the model ready and metadata routes TorchServe 404s.

    app = packrat.ray_serve.app({"model": "resnet50", "profiles": ["profiles/resnet50.csv"]})
    serve.run(app, route_prefix="/")

`packrat serve --engine ray` does that against a running cluster. KubeRay's RayService names
`packrat.ray_serve:app` with the same arguments (`packrat export k8s`).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import ray
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from packrat.codec import oip
from packrat.codec.kserve import model_metadata
from packrat.frontends.http import BodyReads, BodyRefused, answer_headers, asgi_body, header_refusal
from packrat.serving.engine import Engine
from packrat.serving.pool.api import Answer, Request
from packrat.settings import REQUEST_TIMEOUT_S, Settings

log = logging.getLogger("packrat.ray_serve")
ENGINE_ATTEMPTS = 4  # tries of a request whose engine dies under it (each on another engine if one is up)
RETRY_PAUSE_S = 0.5  # × the attempt: time for Ray Serve to drop a dead engine from its routing
HEAD_NODE = "node:__internal_head__"  # the resource Ray gives the head node alone
INGRESS_REQUESTS = 10_000  # requests the ingress holds; the engines' own limit is what queues them
APP_KEYS = ("name", "replicas", "num_cpus")  # the application's own arguments; the others are Settings


class PackratEngine:
    """One node's engine (a Ray Serve deployment placed one replica per node); the ingress calls it."""

    def __init__(self, name: str, section: dict, profile_texts: dict[str, str]):
        # Profiles travel as text: a replica may land on a node that has none of the driver's files.
        self._profile_dir = tempfile.TemporaryDirectory(prefix="packrat-ray-")
        for file_name, text in profile_texts.items():
            (Path(self._profile_dir.name) / file_name).write_text(text)
        settings = Settings.from_section(section).replace(profiles=tuple(profile_texts))
        self.engine = Engine(settings, self._profile_dir.name, name, max_batch=settings.max_batch,
                             asynchronous=True, restart=self._replaced)
        self.node = ray.get_runtime_context().get_node_id()
        # Which engine answered: the node, and the cores it plans for (its CPU budget).
        self.headers = {"X-Packrat-Node": self.node,
                        "X-Packrat-Cores": ",".join(map(str, self.engine.budget.topology.cores))}
        self.metadata = model_metadata(name, self.engine.spec.inputs)
        log.info("packrat engine on node %s: %s", self.node, self.engine.budget.describe())

    async def infer(self, body: bytes, content_type: str | None, header_length: str | None,
                    waited_s: float = 0.0) -> tuple[Answer, dict]:
        """The request's Answer, and the headers naming this engine. One the pool would refuse is
        answered before anything is made of its body. `waited_s`: how long the ingress held it
        before the call (its clock is another process's, perhaps another node's): its deadline
        counts from then, the hop between them aside; the client's (Triton's `timeout`) if tighter."""
        received_at = time.monotonic() - waited_s
        refused = self.engine.refusal(received_at)
        if refused is not None:
            return refused, self.headers
        self.engine.arrive()
        request = Request(body, content_type, header_length, received_at, oip.timeout_s(body, header_length))
        answer = await asyncio.wrap_future(self.engine.submit(request))
        return answer, self.headers

    def ready(self) -> bool:
        return self.engine.pool.health().ready > 0

    def status(self) -> dict:
        return {**self.engine.status(), "node": self.node}

    def model_metadata(self) -> dict:
        return self.metadata

    @staticmethod
    def _replaced(reason: str) -> None:
        """The engine's restart: Ray Serve's, which replaces a replica whose check_health fails (its
        actor process ends, and the stuck threads with it)."""
        log.error("packrat engine unavailable (%s): Ray Serve replaces this replica once its health check fails", reason)

    def check_health(self) -> None:
        """Ray Serve's periodic check: a pool that can no longer serve (no cores left, or the model
        cannot be loaded) gets its replica replaced."""
        unavailable = self.engine.pool.health().unavailable
        if unavailable:
            raise RuntimeError(f"packrat pool unavailable: {unavailable}")

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()


class PackratIngress:
    """The HTTP side: routes, body limits (its size, its request's deadline, what the bodies being read
    hold together), and a request whose engine dies under it sent to another.

    Ray Serve's proxy never retries a request whose replica dies while running it; this ingress
    does (inference is idempotent), so a node lost under load costs no request while another
    node's engine serves."""

    def __init__(self, name: str, engines: DeploymentHandle, max_body_bytes: int,
                 request_timeout_s: float = REQUEST_TIMEOUT_S):
        self.name, self.engines, self.max_body_bytes = name, engines, max_body_bytes
        self.request_timeout_s, self.bodies = request_timeout_s, BodyReads()
        # Where this model answers predictions: TorchServe's, KServe v1's and v2's paths.
        self.infer_paths = (f"/predictions/{name}", f"/v1/models/{name}:predict", f"/v2/models/{name}/infer",
                            f"/v2/models/{name}/versions/1/infer")

    async def __call__(self, request: HttpRequest) -> Response:
        path = request.url.path.rstrip("/")
        if request.method == "POST" and path in self.infer_paths:
            return await self._infer(request)
        if request.method == "GET":
            return await self._get(path)
        return _error(405 if path in self.infer_paths else 404, f"no route for {request.method} {path}")

    async def _infer(self, request: HttpRequest) -> Response:
        received_at = time.monotonic()  # the engine counts the request's deadline from here (waited_s)
        try:
            body = await asgi_body(request.scope, request.receive, self.max_body_bytes,
                                   received_at + self.request_timeout_s, self.bodies)
        except BodyRefused as refused:  # not read whole: answered (if anyone is left to read it), never served
            return _error(refused.status, refused.reason, answer_headers(refused.answer()))
        length = request.headers.get(oip.HEADER)
        refused = header_refusal(body, length)
        if refused is not None:
            return _error(refused.status, refused.reason)
        answer, headers = await self._call("infer", body, request.headers.get("content-type"), length,
                                           received_at=received_at)
        if answer.status != 200:
            return _error(answer.status, answer.reason, answer_headers(answer))
        binary = {oip.HEADER: str(answer.header_length)} if answer.header_length is not None else {}
        return Response(answer.body, media_type=answer.content_type, headers={**headers, **binary})

    async def _call(self, method: str, *args, received_at: float | None = None):
        """An engine's answer to method(*args), from another engine if one dies while answering.
        `received_at`: when the ingress received the request; each try then passes how long it has
        waited since (the engine's waited_s), the time lost on engines that died included."""
        for attempt in range(ENGINE_ATTEMPTS):
            waited = () if received_at is None else (time.monotonic() - received_at,)
            try:
                return await getattr(self.engines, method).remote(*args, *waited)
            except RayActorError as exc:  # its node or process died: the work was lost, not done
                if attempt == ENGINE_ATTEMPTS - 1:
                    raise
                log.warning("packrat engine lost while answering (%s): trying another", type(exc).__name__)
                await asyncio.sleep(RETRY_PAUSE_S * (attempt + 1))

    async def _get(self, path: str) -> Response:
        model = f"/v2/models/{self.name}"
        if path in ("/ready", "/v2/health/ready", f"{model}/ready", "/ping"):
            ready = await self._call("ready")
            return JSONResponse({"ready": ready}, status_code=200 if ready else 503)
        if path == "/v2/health/live":
            return JSONResponse({"live": True})
        if path == "/v2":
            return JSONResponse({"name": "packrat", "version": _version(), "extensions": ["binary_tensor_data"]})
        if path in (model, f"{model}/versions/1"):
            return JSONResponse(await self._call("model_metadata"))
        if path == "/status":
            return JSONResponse(await self._call("status"))
        return _error(404, f"no route for GET {path}")


def _error(status: int, reason: str, headers: dict | None = None) -> Response:
    return JSONResponse({"code": status, "type": "error", "message": reason}, status_code=status, headers=headers)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("packrat-serve")
    except PackageNotFoundError:
        return "0"


def app(args: dict) -> "serve.Application":
    """A Ray Serve application (an application builder: `serve run packrat.ray_serve:app
    model=resnet50 profiles=...`, or KubeRay's import_path). Arguments: `model`, `profiles` (paths,
    or one `profile`), `name` (default: the model's), `max_batch` (8), `replicas` (engines, at most
    one per node; 1), `cores`, `num_cpus` (Ray CPUs each engine reserves, 1), and any other
    packrat setting (packrat/settings.py: `plan`, `request_timeout_s`, ...), checked there."""
    args = dict(args)
    own = {key: args.pop(key) for key in APP_KEYS if key in args}
    if "profile" in args:  # one profile
        args["profiles"] = [args.pop("profile")]
    settings = Settings.from_section(args)  # checks every setting; `serve run` passes strings
    name = app_name({"model": settings.model, "name": own.get("name")})
    replicas, num_cpus = int(own.get("replicas", 1)), float(own.get("num_cpus", 1))
    texts = {f"profile-{i}.csv": Path(path).read_text() for i, path in enumerate(settings.profiles)}
    engines = serve.deployment(
        PackratEngine, name=f"{name}-engine", num_replicas=replicas, max_replicas_per_node=1,
        # An engine holds at most the batch its plan is for; more wait in the ingress's router.
        max_ongoing_requests=settings.max_batch, ray_actor_options={"num_cpus": num_cpus},
        health_check_period_s=5.0,
    ).bind(name, settings.to_section(), texts)
    # The ingress sits on the head node with the proxy: losing any other node leaves both up.
    ingress = serve.deployment(PackratIngress, name=name, max_ongoing_requests=INGRESS_REQUESTS,
                               ray_actor_options={"num_cpus": 0, "resources": {HEAD_NODE: 0.001}})
    return ingress.bind(name, engines, settings.max_body_bytes, settings.request_timeout_s or REQUEST_TIMEOUT_S)


def deploy(args: dict, *, address: str = "auto", host: str = "127.0.0.1", port: int = 8000,
           timeout_s: float = 600.0) -> tuple[str, str]:
    """Deploy app(args) on the running Ray cluster at `address` (HTTP on host:port, loopback unless
    told otherwise; one proxy, on the head node) and wait until every replica is ready; its URL and name.
    `replicas` defaults to the cluster's alive nodes: one engine per node."""
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    args = dict(args)
    args.setdefault("replicas", sum(1 for node in ray.nodes() if node["Alive"]))
    serve.start(http_options={"host": host, "port": port}, proxy_location="HeadOnly")
    name = app_name(args)
    serve.run(app(args), name=name, route_prefix="/", blocking=False)
    _wait_running(name, timeout_s)
    return _proxy_url(host, port), name


@contextmanager
def deployed(args: dict, **kwargs):
    """deploy(args, **kwargs) for the length of a `with` block: (url, name); then Ray Serve is shut
    down and this process leaves the cluster."""
    try:
        yield deploy(args, **kwargs)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def _proxy_url(host: str, port: int) -> str:
    """Where the proxy listens: a cluster whose Serve was started earlier keeps its own address."""
    from ray.serve.context import _get_global_client

    try:
        config = _get_global_client().http_config
    except Exception:  # a Ray version without it: assume ours took
        return f"http://{host}:{port}"
    if (config.host, config.port) != (host, port):
        log.warning("Ray Serve already listens on %s:%s; its HTTP options stay as they are", config.host, config.port)
    return f"http://{config.host}:{config.port}"


def app_name(args: dict) -> str:
    """The served model's name: `name`, else the model's (a zoo name, or a file's or folder's stem)."""
    return args.get("name") or Path(str(args["model"]).split(":")[-1]).stem


def _wait_running(name: str, timeout_s: float) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while (status := serve.status().applications.get(name)) is None or status.status != "RUNNING":
        if status is not None and status.status in ("DEPLOY_FAILED", "UNHEALTHY"):
            raise RuntimeError(f"Ray Serve could not deploy {name}: {status.message}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} was not running on Ray Serve after {timeout_s:.0f} s "
                               f"({status.status if status else 'not deployed'})")
        time.sleep(0.5)


def shutdown(address: str = "auto") -> None:
    """Remove every Ray Serve application and proxy from the cluster (the cluster keeps running)."""
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    serve.shutdown()
