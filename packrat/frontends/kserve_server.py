"""The KServe front end: a `kserve.ModelServer` whose models are packrat engines in its own process.

Each model is an Engine (packrat/serving/engine.py) built from a packrat archive, as the TorchServe
handler builds it: the same settings, profile, plan, pool of pinned instances, reconfiguration,
watchdog, served-figure corrections and node plan (several models in one server plan the
machine's cores together). The server speaks the Open Inference Protocol v2 over REST and gRPC,
KServe v1 `:predict`, the model repository extension (load, unload) and `/metrics`.

How a request reaches the engine, by path:
- REST `/v2/models/NAME/infer`, `/v1/models/NAME:predict` and TorchServe's `/predictions/NAME`: the
  raw body, read within `max_body_bytes` (413 beyond), goes to the engine as it came (JSON, or the
  binary tensor extension with its Inference-Header-Content-Length); the instance decodes it. KServe's own REST
  route would parse it first (pydantic, numpy, lists) in this process's one event loop, work the
  instance redoes. These paths are answered in raw ASGI ahead of KServe's app (InferenceFirst):
  FastAPI's routing and KServe's timing middleware were most of what a refusal cost.
- gRPC `ModelInfer`: KServe's servicer parses the message into an InferRequest; predict() turns its
  inputs into a v2 binary body (raw_input_contents as they are) and the binary answer back into an
  InferResponse whose outputs are raw bytes (raw_output_contents).
Every answer is the request's own: a bad input is its 400, its batch-mates are answered normally.
A request's deadline counts from when its route began (its body's reading and parsing are in it), or
its gRPC call; the client's own where tighter: the call's gRPC deadline, Triton's `timeout` parameter
(microseconds; oip.timeout_s reads it from a REST body cheaply).
An answer sent before its body was read (admission's 503, a 404, a 413) reaches a client still
sending: on a kept-alive connection uvicorn drops the rest of the body after the answer; on one that
closes after it, the rest is read and dropped first (frontends/http.py), or the close would reset.
The REST server's own limits: a backlog of BACKLOG connections, and connection_limit() open
connections before uvicorn answers 503; one process, one event loop (the engines are in it).

    python -m packrat.frontends.kserve_server --model-store model_store [--model NAME ...]
        [--host 127.0.0.1] [--http-port 8080] [--grpc-port 8081]

`packrat serve --engine kserve` builds the archives and runs this; `packrat export k8s` writes a
ServingRuntime that runs it in a pod.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import resource
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from pathlib import Path

import grpc
import kserve
import kserve.model_server
import numpy as np
import torch
import yaml
from fastapi import FastAPI, HTTPException
from grpc_interceptor import exceptions as grpc_errors
from kserve.errors import ModelNotFound
from kserve.metrics import PREDICT_HIST_TIME
from kserve.model_repository import ModelRepository
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from packrat.codec import oip
from packrat.codec.kserve import model_metadata
from packrat.frontends.http import (BODIES_IN_FLIGHT_BYTES, BodyReads, BodyRefused, BoundedBody,
                                    ReadBodyBeforeAnswering, asgi_body, header_deadline_protocol, header_refusal,
                                    linger, scope_headers, send_answer)
from packrat.frontends.kserve_compat import OneLineRESTServer, OneLineStatus, ServedVersion
from packrat.frontends.kserve_metrics import PackratCollector
from packrat.frontends import front_ends
from packrat.planning.front_ends import FrontEnds, front_ends_count
from packrat.frontends.torchserve_control import follow_reconfigure_requests
from packrat.serving.engine import Engine
from packrat.serving.pool.api import Answer, Request
from packrat.settings import CONTROL_DIR_ENV, MAX_BODY_BYTES, REQUEST_TIMEOUT_S, Settings

log = logging.getLogger(__name__)
MODEL_CONFIG = "model-config.yaml"  # an archive's TorchServe config: batching, and packrat's settings
RESTART_GRACE_S = 1.0  # answers in hand get out before the server re-executes itself (PackratRepository.restart)
GRPC_HEADROOM = 1 << 20  # a gRPC message may exceed the body limit by its header; the engine still refuses the rest
# a gRPC call's receipt, set by the servicer's ModelInfer for the predict() it awaits (the same task):
# (time.monotonic() as it began, the client's deadline then in seconds or None)
GRPC_CALL: ContextVar[tuple[float, float | None] | None] = ContextVar("packrat_grpc_call", default=None)
BACKLOG = 2048  # connections the kernel holds before they are accepted (uvicorn's default; capped by somaxconn)
FD_RESERVE = 256  # open files kept back from connections: instances' sockets, shared memory, archives, logs
# gRPC status of each HTTP status an Answer carries (400 and the others: invalid argument)
GRPC_ERRORS = {404: grpc_errors.NotFound, 413: grpc_errors.ResourceExhausted, 500: grpc_errors.Internal,
               503: grpc_errors.Unavailable, 504: grpc_errors.DeadlineExceeded}


# ---- one model: an engine as a KServe model ------------------------------------------------------

class PackratModel(kserve.Model):
    """A packrat engine registered in KServe's model repository. (KServe's own `engine` attribute
    means something else: an engine to start; ours is `serving`.)"""

    def __init__(self, name: str, model_dir: Path, settings: Settings, restart=None):
        super().__init__(name)
        self.closed = threading.Event()  # set once unloaded: readiness goes, `packrat reconfigure` stops
        self.serving = Engine(settings, model_dir, name, max_batch=settings.max_batch, asynchronous=True,
                              restart=restart)  # restart(reason): the repository's, with no cores left
        self.max_body_bytes = settings.max_body_bytes
        self.request_timeout_s = settings.request_timeout_s or REQUEST_TIMEOUT_S  # a body still arriving then: 408
        try:
            self.metadata = model_metadata(name, self.serving.spec.inputs, probe_output(self.serving))
        except BaseException:
            self.serving.close()  # a model that failed to start holds no cores
            raise
        self.ready = True

    def load(self) -> bool:
        """KServe calls this before an inference whenever healthy() says no: the engine is already
        up (or gone), so there is nothing to load."""
        return self.ready

    async def healthy(self) -> bool:
        """Ready while the pool can serve: an instance is ready, or a respawn with a fair chance is
        under way (requests wait for it); not once every instance fails to load or is a stuck
        thread (no cores left), or after unload."""
        return not self.closed.is_set() and self.serving.pool.health().unavailable is None

    def get_input_types(self) -> list[dict]:
        return self.metadata["inputs"]

    def get_output_types(self) -> list[dict]:
        return self.metadata["outputs"]

    async def answer(self, request: Request) -> Answer:
        """The engine's answer to one request; the engine gathers concurrent ones into batches."""
        self.serving.arrive()
        return await asyncio.wrap_future(self.serving.submit(request))

    async def predict(self, payload, headers=None, response_headers=None):
        """KServe's parsed request (gRPC, or its own REST routes): an InferRequest, or a v1 dict. Its
        deadline counts from the gRPC call's start (else from here); the client's, if tighter: the
        call's gRPC deadline, or Triton's `timeout` request parameter."""
        received_at, timeout_s = GRPC_CALL.get() or (time.monotonic(), None)
        if isinstance(payload, InferRequest):
            body, length = infer_body(payload)
            timeout_s = tighter(timeout_s, parameter_timeout_s(payload.parameters))
            answer = await self.answer(Request(body, "application/octet-stream", length, received_at, timeout_s))
            return infer_response(self.name, payload, checked(answer, payload.from_grpc))
        answer = await self.answer(Request(json.dumps(payload).encode(), "application/json", received_at=received_at,
                                           timeout_s=timeout_s))
        return json.loads(checked(answer, False).body)

    def stop(self) -> None:
        """Unloaded: no longer ready; the engine closes in the background, answering the requests it
        holds 503 at once (the pool's close) and leaving the node, whose other models may grow onto
        its cores. KServe calls this from its event loop, which must not wait for the close."""
        self.ready = False
        self.closed.set()
        threading.Thread(target=self.serving.close, name=f"packrat-unload-{self.name}").start()

    def status(self) -> dict:
        return {**self.serving.status(), "metadata": self.metadata}


def probe_output(engine: Engine) -> dict | None:
    """The model's real output ({"datatype", "shape"}) from one request of zeros through the engine
    (inputs a request may leave out, such as an attention mask, left to the codec to fill), so the
    metadata says what answers hold; None, with a warning, if the model does not answer it."""
    given = [spec for spec in engine.spec.inputs if spec.fill is None] or list(engine.spec.inputs[:1])
    zeros = [torch.zeros((1, *spec.shape), dtype=getattr(torch, spec.dtype)) for spec in given]
    inputs = [{"name": spec.name, "shape": list(x.shape), "datatype": oip.datatype(x.dtype)}
              for spec, x in zip(given, zeros)]
    body, length = oip.request({"inputs": inputs, "parameters": {"binary_data_output": True}},
                               [x.numpy().tobytes() for x in zeros])
    answer = engine.submit(Request(body, "application/octet-stream", length)).result()
    if not answer.ok:
        log.warning("packrat: the model did not answer a request of zeros (%s): its metadata names no output "
                    "shape", answer.reason)
        return None
    output = oip.split(answer.body, answer.header_length)[0]["outputs"][0]
    return {"datatype": output["datatype"], "shape": output["shape"]}


def parameter_timeout_s(parameters) -> float | None:
    """Triton's `timeout` request parameter (microseconds) in seconds, from gRPC's InferParameter map
    or a REST request's dict; None when absent or not a positive number."""
    value = parameters.get("timeout") if parameters else None
    if value is not None and hasattr(value, "WhichOneof"):  # a gRPC InferParameter
        kind = value.WhichOneof("parameter_choice")
        value = getattr(value, kind) if kind in ("int64_param", "uint64_param", "double_param") else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return None
    return value / 1e6


def tighter(*timeouts_s: float | None) -> float | None:
    """The tightest of the deadlines given (None: none)."""
    given = [t for t in timeouts_s if t is not None]
    return min(given) if given else None


def infer_body(request: InferRequest) -> tuple[bytes, int]:
    """A v2 binary body from KServe's InferRequest: gRPC's raw_input_contents as they are, numpy data
    as its bytes, BYTES elements in their binary layout, lists of numbers left in the JSON header.
    Every output is asked for in binary, so the answer comes back as raw bytes too."""
    entries, chunks = [], []
    for given in request.inputs:
        entries.append({"name": given.name, "shape": list(given.shape), "datatype": given.datatype})
        chunks.append(_chunk(given, entries[-1]))
    head = {"inputs": entries, "parameters": {"binary_data_output": True}}
    if request.id:
        head["id"] = request.id
    if request.request_outputs:
        head["outputs"] = [{"name": o.name, "parameters": {"binary_data": True}} for o in request.request_outputs]
    return oip.request(head, chunks)


def _chunk(given, entry: dict):
    """An input's bytes for the binary body, or None with its numbers put in `entry`'s JSON "data"."""
    raw = getattr(given, "_raw_data", None)  # where KServe keeps gRPC's raw_input_contents
    if raw:
        return raw
    data = given.data
    if given.datatype == "BYTES":
        return oip.bytes_chunk(np.asarray(data, dtype=object).flatten().tolist())
    if isinstance(data, np.ndarray):
        return data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes()
    entry["data"] = data
    return None


def checked(answer: Answer, grpc_request: bool) -> Answer:
    """The answer if it succeeded; else its status and reason as the protocol's error."""
    if answer.ok:
        return answer
    if grpc_request:
        raise GRPC_ERRORS.get(answer.status, grpc_errors.InvalidArgument)(answer.reason)
    raise HTTPException(status_code=answer.status, detail=answer.reason)


def infer_response(name: str, request: InferRequest, answer: Answer) -> InferResponse:
    """KServe's InferResponse of a binary v2 answer: each output's raw bytes, not converted (gRPC
    sends them as raw_output_contents; KServe's REST encoding turns them into what was asked)."""
    head, rest = oip.split(answer.body, answer.header_length)
    outputs = head["outputs"]
    raw = oip.chunks(outputs, rest)
    infer_outputs = [InferOutput(o["name"], o["shape"], o["datatype"]) for o in outputs]
    return InferResponse(head.get("id") or request.id, name, infer_outputs, raw_outputs=raw,
                         from_grpc=request.from_grpc, use_binary_outputs=request.use_binary_outputs,
                         requested_outputs=request.request_outputs)


# ---- the repository: archives in a model store, loaded and unloaded on the node ------------------

class PackratRepository(ModelRepository):
    """KServe's model repository over a packrat model store: NAME.mar archives (as `packrat
    archive` builds them; unpacked here) or NAME/ directories holding an archive's files. Loading a
    model starts its engine, which joins the node's plan of cores; unloading closes it."""

    def __init__(self, store: Path, sources: dict[str, str] | None = None,
                 front_end: front_ends.FrontEnd | None = None):
        super().__init__(str(store))
        self.store = Path(store)
        self.front_end = front_end or front_ends.FrontEnd()  # this server among the front ends (front_ends.py)
        self.sources = dict(sources or {})  # served name -> its archive's name in the store, where they differ
        self._unpacked = Path(tempfile.mkdtemp(prefix="packrat-kserve-"))
        self._loading: dict[str, asyncio.Future] = {}

    def available(self) -> list[str]:
        """The models the store holds, loaded or not."""
        found = {p.stem for p in self.store.glob("*.mar")} | {p.name for p in self.store.iterdir()
                                                              if (p / MODEL_CONFIG).is_file()}
        return sorted(found)

    def start_model(self, name: str) -> PackratModel:
        """NAME's engine, built from its archive (blocks until its pool serves: seconds to minutes)."""
        model_dir = self._model_dir(name)
        settings = archive_settings(model_dir)
        model = PackratModel(name, model_dir, settings, restart=self.restart)
        control_dir = CONTROL_DIR_ENV.get()
        if control_dir:  # `packrat reconfigure` asks through a file, as with TorchServe
            follow_reconfigure_requests(model.serving.controller, control_dir, name, settings.max_batch,
                                        until=model.closed)
        return model

    def _model_dir(self, name: str) -> Path:
        name = self.sources.get(name, name)
        if (self.store / name / MODEL_CONFIG).is_file():
            return self.store / name
        archive = self.store / f"{name}.mar"
        if not archive.is_file():
            raise ModelNotFound(name)
        target = self._unpacked / name
        shutil.rmtree(target, ignore_errors=True)
        with zipfile.ZipFile(archive) as packed:  # extractall keeps every member inside target
            packed.extractall(target)
        return target

    async def load(self, name: str) -> bool:
        """The repository extension's load: start NAME unless it serves already (in a thread: the
        event loop keeps answering the other models meanwhile). Two loads of one name share one start."""
        if self.get_model(name) is not None:
            return True
        if name not in self._loading:
            self._loading[name] = asyncio.ensure_future(asyncio.to_thread(self.start_model, name))
        try:
            model = await asyncio.shield(self._loading[name])
        finally:
            self._loading.pop(name, None)
        self.update(model)
        log.info("packrat model %s loaded: %s", name, model.serving.controller.plan.describe())
        return True

    def unload(self, name: str) -> None:
        """Leaves the repository at once (new requests get 404); its engine answers those it holds 503."""
        super().unload(name)  # KeyError for an unknown name, which the extension answers 404
        log.info("packrat model %s unloaded", name)

    def close(self) -> None:
        for name in list(self.get_models()):
            self.unload(name)
        shutil.rmtree(self._unpacked, ignore_errors=True)

    def restart(self, reason: str, grace_s: float = RESTART_GRACE_S, execv=os.execv) -> None:
        """A model has no cores left (stuck thread instances hold them, and only the end of this
        process ends them): the server re-executes itself with the arguments it was started with,
        same pid (a pod's container, `packrat serve`'s watch and the port stay), once every model
        is marked not ready and its engine closed (what they hold answered 503), and `grace_s` has
        let those answers out. Models loaded later through the repository extension are not
        loaded again."""
        log.error("packrat KServe server restarts itself: %s", reason)
        models = [model for model in self.get_models().values() if isinstance(model, PackratModel)]
        for model in models:
            model.ready = False
            model.closed.set()
        for model in models:
            try:
                model.serving.close()
            except Exception as exc:  # the restart must happen whatever a close does
                log.warning("packrat model %s did not close cleanly: %s", model.name, exc)
        time.sleep(grace_s)
        execv(sys.executable, sys.orig_argv)


def archive_settings(model_dir: Path) -> Settings:
    """The settings an archive's model-config.yaml carries under `packrat:`; the pool gathers a
    batch for at most its TorchServe maxBatchDelay, unless the settings say `gather_ms`."""
    config = yaml.safe_load((model_dir / MODEL_CONFIG).read_text()) or {}
    section = config.get("packrat")
    if not isinstance(section, dict) or "model" not in section:
        raise ValueError(f"{model_dir / MODEL_CONFIG} has no 'packrat: {{model: ...}}' section: "
                         f"build the archive with `packrat archive`")
    settings = Settings.from_section(section)
    delay = config.get("maxBatchDelay")
    if settings.gather_ms is None and isinstance(delay, (int, float)):
        settings = settings.replace(gather_ms=float(delay))
    return settings


# ---- REST: the inference paths ahead of KServe's app, the raw body to the engine ------------------

# v2 (with or without a version), v1 and TorchServe's paths: the same clients and load tests reach either front end
INFER_PATH = re.compile(r"/(?:v2/models/([^/]+)(?:/versions/[^/]+)?/infer|v1/models/([^/:]+):predict"
                        r"|predictions/([^/]+))/?")


class InferenceFirst:
    """The REST server's ASGI app. A POST to a packrat model's inference path is answered here, in
    raw ASGI, ahead of FastAPI's routing and KServe's own middleware (a route match, dependency
    resolution, a timing middleware reading getrusage: work each request pays, a refusal under
    overload included); everything else goes to KServe's app, behind ReadBodyBeforeAnswering and
    BoundedBody (its bodies within the server's default size and time limits). The
    deployer's middleware on KServe's app (app.add_middleware: authentication, CORS, rate limits)
    runs in front of the inference paths too, as it runs in front of the app's routes. Bodies are
    read by their request's deadline, within the bytes `bodies` lets all of them hold together."""

    def __init__(self, app, repository: PackratRepository, bodies: BodyReads | None = None):
        self.kserve_app, self.repository, self.bodies = app, repository, bodies or BodyReads()
        # KServe's own routes read bodies unbounded: read here within the server's defaults first
        self.app = ReadBodyBeforeAnswering(BoundedBody(ServedVersion(app), MAX_BODY_BYTES, REQUEST_TIMEOUT_S, self.bodies))
        self._infer = None  # the inference paths behind the deployer's middleware: built at the first
        # request, once the app has started and no middleware can be added to it

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            found = INFER_PATH.fullmatch(scope["path"])
            model = found and self.repository.get_model(next(name for name in found.groups() if name))
            if isinstance(model, PackratModel):
                scope[MODEL_KEY] = model
                return await (self._infer or self._built())(scope, receive, send)
        await self.app(scope, receive, send)

    def _built(self):
        self._infer = behind(deployer_middleware(self.kserve_app), self.infer)
        return self._infer

    async def infer(self, scope, receive, send) -> None:
        await send_answer(send, await self.answer(scope[MODEL_KEY], scope, receive))

    async def answer(self, model: PackratModel, scope, receive) -> Answer:
        """Admission first, before the body is read: a refusal costs no core. Its deadline counts from here."""
        received_at = time.monotonic()
        refused = model.serving.refusal(received_at)
        if refused is not None:
            if _closes_after(scope):  # uvicorn drops the rest of a kept-alive body itself; a closing one would reset
                await linger(receive)
            return refused
        try:
            body = await asgi_body(scope, receive, model.max_body_bytes, received_at + model.request_timeout_s,
                                   self.bodies)
        except BodyRefused as refused:  # not read whole: answered (if anyone is left to read it), never served
            return refused.answer()
        headers = scope_headers(scope)
        length = headers.get(HEADER_KEY)
        length = length.decode() if length is not None else None
        refused = header_refusal(body, length)
        if refused is not None:
            return refused
        content_type = headers.get(b"content-type")
        request = Request(body, content_type.decode() if content_type else None, length, received_at,
                          oip.timeout_s(body, length))
        started = time.perf_counter()
        answer = await model.answer(request)
        PREDICT_HIST_TIME.labels(model_name=model.name).observe(time.perf_counter() - started)
        return answer


HEADER_KEY = oip.HEADER.lower().encode()
MODEL_KEY = "packrat_model"  # the scope's key for the model an inference path names, past the deployer's middleware
# KServe's own middleware, by module (its REST server adds them at start): the inference paths skip them
KSERVE_MIDDLEWARE = ("timing_asgi", "asgi_logger")


def deployer_middleware(app) -> list:
    """The middleware the deployer added to KServe's app (Starlette's entries, outermost first),
    KServe's own aside."""
    return [entry for entry in getattr(app, "user_middleware", ())
            if not entry.cls.__module__.startswith(KSERVE_MIDDLEWARE)]


def behind(middleware: list, endpoint):
    """`endpoint` behind `middleware`, as Starlette stacks an app's; and, where there is any, behind
    ReadBodyBeforeAnswering: an answer of theirs sent before the body was read (a 401) still reaches
    a client that is sending it."""
    if not middleware:
        return endpoint
    for cls, args, kwargs in reversed(middleware):
        endpoint = cls(endpoint, *args, **kwargs)
    return ReadBodyBeforeAnswering(endpoint)


def _closes_after(scope) -> bool:
    """Whether the connection closes after this answer (HTTP/1.0, or Connection: close)."""
    if scope.get("http_version") == "1.0":
        return True
    return any(name == b"connection" and b"close" in value.lower() for name, value in scope["headers"])


def serving_app(app: FastAPI, repository: PackratRepository, bodies: BodyReads | None = None) -> InferenceFirst:
    """What the REST server runs: the inference paths, then KServe's app with /status added."""
    add_routes(app, repository)
    return InferenceFirst(app, repository, bodies)


def add_routes(app: FastAPI, repository: PackratRepository) -> None:
    """/status on KServe's app: every packrat model's plan, health and figures."""

    front_end = getattr(repository, "front_end", None) or front_ends.FrontEnd()  # a lone server's, where none is said

    async def status(request: HttpRequest) -> Response:
        models = repository.get_models()
        local = {name: model.status() for name, model in models.items() if isinstance(model, PackratModel)}
        others = [] if request.query_params.get("local") else await front_end.gather("/status?local=1")
        return JSONResponse(front_ends.with_front_ends(local, front_end.describe(), others))

    async def metrics(request: HttpRequest) -> Response:
        """Every front end's metrics, labelled by front end, whichever answers (?local=1: its own)."""
        own = generate_latest(REGISTRY)
        if not request.query_params.get("local"):
            others = [(entry["index"], page) for entry, page in await front_end.gather("/metrics?local=1")]
            own = front_ends.merged_metrics([(front_end.index, own), *others])
        return Response(own, media_type=CONTENT_TYPE_LATEST)

    app.add_api_route("/status", status, methods=["GET"], include_in_schema=False)
    if front_end.count > 1:  # ahead of KServe's own /metrics, registered when the server starts
        app.add_api_route("/metrics", metrics, methods=["GET"], include_in_schema=False)


# ---- the server ------------------------------------------------------------------------------------

class PackratModelServer(kserve.ModelServer):
    """KServe's ModelServer with its REST and gRPC servers bound to `host` (KServe binds every
    address; packrat serves loopback unless told otherwise), its per-request log lines off, the raw
    REST routes first, and packrat's figures on its /metrics."""

    def __init__(self, repository: PackratRepository, host: str, http_port: int, grpc_port: int | None,
                 max_body_bytes: int, access_log: bool = False, bodies_in_flight_bytes: int = BODIES_IN_FLIGHT_BYTES):
        super().__init__(http_port=http_port, grpc_port=grpc_port or 0, registered_models=repository,
                         enable_grpc=grpc_port is not None, enable_latency_logging=False, grace_period=5)
        self.host, self.repository = host, repository
        self.grpc_message_bytes = max_body_bytes + GRPC_HEADROOM
        quiet_logs(access_log)
        self.app = serving_app(kserve.model_server.app, repository, BodyReads(bodies_in_flight_bytes))
        self._collector = PackratCollector(repository.get_models)
        REGISTRY.register(self._collector)

    def start(self, models: list) -> None:
        """As KServe's start, with the servers bound to `host`; returns when a signal stops them."""
        self._register_and_check_atleast_one_model_is_ready(models)
        self._rest_server = OneLineRESTServer("kserve.model_server:app", self.dataplane,
                                              self.model_repository_extension, self.http_port,
                                              grace_period=self.grace_period, event_loop=self.event_loop,
                                              timeout_keep_alive=self.timeout_keep_alive)
        self._rest_server.config.app = self.app  # KServe's app (its routes added at start) behind packrat's paths
        self._rest_server.config.host = self.host
        self._rest_server.config.backlog = BACKLOG
        self._rest_server.config.limit_concurrency = connection_limit()
        self._rest_server.config.http = header_deadline_protocol()
        sockets = self.repository.front_end.sockets(self.host, self.http_port, BACKLOG)
        self.servers.append(self._rest_server.start() if sockets is None else self._rest(sockets))
        self.repository.front_end.start_meter(self.answered)
        if self.enable_grpc:
            self._grpc_server = GrpcServer(self)
            self.servers.append(self._grpc_server.start())
        self.setup_event_loop()
        self.register_signal_handler()
        asyncio.run(self._serve())

    async def _rest(self, sockets) -> None:
        """KServe's REST server on the sockets given (front_ends.py); its own start() binds the port."""
        self._rest_server.create_application()
        await self._rest_server._server.serve(sockets=sockets)

    def answered(self) -> int:
        """Requests the engines answered so far (the front end's share of a core is weighed by them)."""
        return sum(model.serving.pool.health().answered for model in self.repository.get_models().values()
                   if isinstance(model, PackratModel))

    def close(self) -> None:
        REGISTRY.unregister(self._collector)
        self.repository.close()


class RepositoryServicer(InferenceServicer):
    """KServe's gRPC servicer with its model repository calls answered: in KServe 0.21 they read a
    result the repository extension never returns (it returns None), so every gRPC load and unload
    failed with INTERNAL after doing its work. And ModelInfer notes when the call began and the
    client's deadline (KServe hands predict() no gRPC context) for the request's own deadline."""

    async def ModelInfer(self, request, context):
        token = GRPC_CALL.set((time.monotonic(), context.time_remaining()))  # None: the call has no deadline
        try:
            return await super().ModelInfer(request, context)
        finally:
            GRPC_CALL.reset(token)

    async def RepositoryModelLoad(self, request, context):
        await self._mode_repository_extension.load(model_name=request.model_name)
        return pb.RepositoryModelLoadResponse(model_name=request.model_name, isLoaded=True)

    async def RepositoryModelUnload(self, request, context):
        await self._mode_repository_extension.unload(model_name=request.model_name)
        return pb.RepositoryModelUnloadResponse(model_name=request.model_name, isUnloaded=True)


class GrpcServer:
    """KServe's gRPC servicer on grpc.aio, bound to the server's host (KServe's own binds [::]),
    without KServe's log line per call."""

    def __init__(self, server: PackratModelServer):
        self.server, self._grpc = server, None

    async def start(self) -> None:
        options = [("grpc.max_receive_message_length", self.server.grpc_message_bytes),
                   ("grpc.max_send_message_length", self.server.grpc_message_bytes)]
        self._grpc = grpc.aio.server(ThreadPoolExecutor(max_workers=self.server.max_threads),
                                     interceptors=(OneLineStatus(),), options=options)
        servicer = RepositoryServicer(self.server.dataplane, self.server.model_repository_extension)
        grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, self._grpc)
        self._grpc.add_insecure_port(f"{self.server.host}:{self.server.grpc_port}")
        await self._grpc.start()
        await self._grpc.wait_for_termination()

    async def stop(self, sig: int | None = None) -> None:
        if self._grpc is not None:
            await self._grpc.stop(grace=self.server.grace_period)


def connection_limit() -> int:
    """Open connections (and requests under way) past which the REST server answers 503 (uvicorn's
    limit_concurrency): the open-files limit, raised to its hard limit, less FD_RESERVE. Past the
    files limit accept() would fail, and clients would wait in the backlog until they time out."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):  # a container may refuse it: the soft limit stands
            pass
    soft = 1 << 20 if soft == resource.RLIM_INFINITY else soft
    return max(FD_RESERVE, soft - FD_RESERVE)


def quiet_logs(access_log: bool) -> None:
    """KServe logs a timing line per REST request and uvicorn an access line: both cost the one
    event loop that serves every request, so they are off unless asked for (errors still show)."""
    logging.getLogger("kserve.trace").setLevel(logging.WARNING)
    if not access_log:
        logging.getLogger("uvicorn.access").setLevel(logging.WARNING)


# ---- the command -----------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m packrat.frontends.kserve_server",
                                description="Serve packrat archives with a KServe ModelServer: OIP v2 over REST "
                                            "and gRPC, KServe v1, the model repository extension, /metrics.")
    p.add_argument("--model-store", type=Path, required=True, help="a folder of NAME.mar archives (or NAME/ folders)")
    p.add_argument("--model", dest="models", action="append", default=None, metavar="NAME[=ARCHIVE]",
                   help="a model to load at start, served as NAME from ARCHIVE.mar (or the folder ARCHIVE; "
                        "default: NAME's); repeat it (default: every model in the store)")
    p.add_argument("--front-ends", default="1", type=front_ends_count, metavar="N|auto",
                   help="front-end processes sharing the ports, each with its own event loop and engines on its "
                        "own block of the cores; auto: as many as the plans' capacity needs at one front end's "
                        "ceiling, at most one per core (default: 1)")
    p.add_argument("--cores", default=None, metavar="LIST", help="the CPUs this server runs on, e.g. 0-3 (default: its "
                   "affinity); with several front ends, the supervisor gives each its block")
    p.add_argument("--front-end", default=None, help=argparse.SUPPRESS)  # I/N: this server's place, from the supervisor
    p.add_argument("--front-end-dir", default=None, help="where the front ends say where they are (default: a "
                   "temporary folder)")
    p.add_argument("--rest-fd", type=int, default=None, help=argparse.SUPPRESS)  # the REST socket, inherited
    p.add_argument("--host", default="127.0.0.1", help="the address REST and gRPC listen on (default: loopback)")
    p.add_argument("--http-port", type=int, default=8080, help="REST port (default: 8080)")
    p.add_argument("--grpc-port", type=int, default=8081, help="gRPC port (default: 8081; 0: no gRPC)")
    p.add_argument("--access-log", action="store_true", help="log a line per REST request (off: it costs each one)")
    p.add_argument("--bodies-in-flight-mb", type=float, default=BODIES_IN_FLIGHT_BYTES / 2**20,
                   help="what the REST request bodies being read may hold together; past it a request is answered "
                        "503 with Retry-After (default: %(default)g)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # packrat's own lines (the budget, the plan, loads, reconfigurations) beside KServe's, which has its own
    logging.basicConfig(format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    logging.getLogger("packrat").setLevel(logging.INFO)
    given = dict(entry.split("=", 1) if "=" in entry else (entry, entry) for entry in args.models or [])
    front_end = front_ends.FrontEnd.of(args)  # pinned to --cores, if given
    repository = PackratRepository(args.model_store, given, front_end)
    try:
        names = list(given) or repository.available()
        if not front_end.supervised:  # the top process: serves alone, or supervises several front ends
            choice = front_end_choice(args.front_ends, repository, names)
            if choice.count > 1:
                repository.close()
                return front_ends.supervise(sys.argv[1:] if argv is None else argv, choice, args.host,
                                            args.http_port, BACKLOG, front_end.directory)
            front_ends.record_choice(front_end.directory, choice, front_end.cores)
        models = []
        for name in names:  # one after another: each joins the node's plan, and the others move for it
            models.append(repository.start_model(name))
            repository.update(models[-1])  # closed with the repository if a later one fails
        limit = max((m.max_body_bytes for m in models), default=MAX_BODY_BYTES)
        server = PackratModelServer(repository, args.host, args.http_port, args.grpc_port or None, limit,
                                    args.access_log, int(args.bodies_in_flight_mb * 2**20))
        log.info("packrat KServe server: %s on %s (REST %d, gRPC %s)", ", ".join(names), args.host, args.http_port,
                 args.grpc_port or "off")
        server.start(models)
    finally:
        repository.close()
    return 0


def front_end_choice(asked: str, repository: PackratRepository, names: list[str]) -> FrontEnds:
    """How many front ends serve `names`: as asked, or (auto) from their plans' capacity."""
    if asked == "1":
        return FrontEnds(1, "one front end (--front-ends 1)")
    dirs = [repository._model_dir(name) for name in names]
    return front_ends.decide(asked, [(archive_settings(d), d) for d in dirs])


if __name__ == "__main__":
    raise SystemExit(main())
