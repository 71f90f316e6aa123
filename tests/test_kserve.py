"""The KServe front end (packrat/frontends/kserve_server.py) on a real KServe ModelServer started on
loopback as `packrat serve --engine kserve` starts it (packrat/deploy/kserve.py): two archives of
the tiny model in one server, their pools of pinned instances on one node plan. Real clients:
tritonclient over HTTP and gRPC, and the KServe SDK's own REST and gRPC clients. Also, without a
server, how KServe's parsed requests become engine requests and binary answers KServe's responses."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

pytest.importorskip("kserve", reason="the KServe front end is an optional extra: pip install 'packrat[kserve]'")

from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb  # noqa: E402
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput  # noqa: E402

from packrat.codec import oip  # noqa: E402
from packrat.codec.codec import Codec  # noqa: E402
from packrat.codec.config import CodecConfig  # noqa: E402
from packrat.frontends import kserve_server  # noqa: E402
from packrat.models.zoo import resolve  # noqa: E402
from packrat.serving.pool.api import Answer  # noqa: E402

PROFILE = "# mode: script\nthreads,batch,latency_ms\n" + "".join(
    f"{t},{b},{b * 2.0 / t ** 0.5}\n" for t in (1, 2) for b in (1, 2, 4))
SHAPE = [1, 3, 32, 32]
MAX_BODY = 100_000  # a JSON tiny sample is ~30 KB, a binary one 12 KB


def sample(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


def reference(x: np.ndarray) -> np.ndarray:
    """The tiny model's own output (its weights are seeded: the instances build the same)."""
    with torch.inference_mode():
        return resolve("tiny").build()(torch.from_numpy(x)).numpy()


# ---- without a server ------------------------------------------------------------------------

def decoded(request: InferRequest):
    body, length = kserve_server.infer_body(request)
    return Codec(CodecConfig((3, 32, 32), "float32", "classification")).decode(body, None, length)


def test_grpc_raw_inputs_reach_the_engine_as_their_bytes():
    x = sample(1)
    message = pb.ModelInferRequest(model_name="tiny", id="r1", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=SHAPE)],
        raw_input_contents=[x.tobytes()])
    request = InferRequest.from_grpc(message)
    body, length = kserve_server.infer_body(request)
    assert body[length:] == x.tobytes()  # the raw bytes as they came, after the JSON header
    got = decoded(request)
    assert np.array_equal(got.samples[0].numpy(), x) and got.request_id == "r1" and got.binary_output


def test_json_lists_and_numpy_inputs_decode_alike():
    x = sample(2)
    as_list = InferInput("input", SHAPE, "FP32", data=x.flatten().tolist())
    as_numpy = InferInput("input", SHAPE, "FP32")
    as_numpy.set_data_from_numpy(x, binary_data=False)
    for given in (as_list, as_numpy):
        got = decoded(InferRequest("tiny", [given], request_outputs=[RequestedOutput("output0")]))
        assert np.array_equal(got.samples[0].numpy(), x)


def test_a_binary_answer_becomes_raw_grpc_outputs_and_rest_json():
    outputs = torch.arange(20, dtype=torch.float32).view(2, 10)
    head = {"model_name": "tiny", "id": "r2", "outputs": [{"name": "output0", "shape": [2, 10], "datatype": "FP32"}]}
    body, length = oip.encode(head, [outputs])
    grpc_request = InferRequest.from_grpc(pb.ModelInferRequest(
        model_name="tiny", inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[2])],
        raw_input_contents=[b"\0" * 8]))
    message = kserve_server.infer_response("tiny", grpc_request, Answer(200, body, "", "application/octet-stream",
                                                                        length)).to_grpc()
    assert message.id == "r2" and message.raw_output_contents[0] == outputs.numpy().tobytes()
    assert list(message.outputs[0].shape) == [2, 10]
    rest_request = InferRequest("tiny", [InferInput("input", [2], "FP32", data=[0.0, 0.0])])
    rest, json_length = kserve_server.infer_response("tiny", rest_request, Answer(
        200, body, "", "application/octet-stream", length)).to_rest()
    assert json_length is None and rest["outputs"][0]["data"] == list(range(20))


def test_failed_answers_are_the_protocols_errors():
    from fastapi import HTTPException
    from grpc_interceptor import exceptions as grpc_errors

    with pytest.raises(grpc_errors.InvalidArgument):
        kserve_server.checked(Answer.error(400, "bad"), grpc_request=True)
    with pytest.raises(grpc_errors.Unavailable):
        kserve_server.checked(Answer.error(503, "unloading"), grpc_request=True)
    with pytest.raises(HTTPException) as info:
        kserve_server.checked(Answer.error(413, "too large"), grpc_request=False)
    assert info.value.status_code == 413


def test_archive_settings_take_torchserves_batch_delay_as_the_gather_wait(tmp_path):
    (tmp_path / "model-config.yaml").write_text("batchSize: 4\nmaxBatchDelay: 20\npackrat: {}\n")
    with pytest.raises(ValueError, match="no 'packrat"):
        kserve_server.archive_settings(tmp_path)
    (tmp_path / "model-config.yaml").write_text("maxBatchDelay: 20\npackrat: {model: tiny, max_batch: 4}\n")
    assert kserve_server.archive_settings(tmp_path).gather_ms == 20.0
    (tmp_path / "model-config.yaml").write_text("maxBatchDelay: 20\npackrat: {model: tiny, gather_ms: 3}\n")
    assert kserve_server.archive_settings(tmp_path).gather_ms == 3.0


def test_metrics_count_every_reconfiguration_though_the_controller_keeps_its_last_few():
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest

    from packrat.frontends.kserve_metrics import PackratCollector
    from packrat.serving.pool.api import Health

    def record(error=None):
        return SimpleNamespace(error=error)

    instance = SimpleNamespace(threads=2, batch=4, runtime="inductor")
    controller = SimpleNamespace(plan=SimpleNamespace(batch=4, instances=[instance], expected_latency_ms=12.5),
                                 reconfigurations=[record(), record("failed")])
    rows = [{"threads": 2, "batch": 4, "runtime": "inductor", "predicted_ms": 11.0, "served_ms": 13.0}]
    engine = SimpleNamespace(controller=controller, pool=SimpleNamespace(
        served_figures=dict, health=lambda: Health(1, 1, 0, 0, None, 0, 7, 4, refusals={"late": 3, "queue_full": 1}),
        respawns=2),
        corrector=SimpleNamespace(status=lambda plan, served: {"instances": rows, "corrections": [{}]}))
    registry = CollectorRegistry()
    registry.register(PackratCollector(lambda: {"m": SimpleNamespace(serving=engine), "other": object()}))
    text = generate_latest(registry).decode()
    assert 'packrat_reconfigurations_total{model="m"} 2.0' in text
    assert 'packrat_reconfiguration_failures_total{model="m"} 1.0' in text
    controller.reconfigurations = controller.reconfigurations[1:] + [record(), record()]  # two new, one dropped
    text = generate_latest(registry).decode()
    assert 'packrat_reconfigurations_total{model="m"} 4.0' in text
    for line in ('packrat_plan_batch{model="m"} 4.0', 'packrat_plan_expected_latency_ms{model="m"} 12.5',
                 'packrat_instance_served_latency_ms{batch="4",model="m",runtime="inductor",threads="2"} 13.0',
                 'packrat_answered_requests_total{model="m"} 7.0', 'packrat_respawns_total{model="m"} 2.0',
                 'packrat_corrections{model="m"} 1.0', 'packrat_instances_ready{model="m"} 1.0',
                 'packrat_refusals_total{cause="late",model="m"} 3.0',
                 'packrat_refusals_total{cause="queue_full",model="m"} 1.0',
                 'packrat_refusals_total{cause="unavailable",model="m"} 0.0'):
        assert line in text, line


def test_a_refused_request_is_answered_before_its_body_is_read(monkeypatch):
    """Admission is asked first: a refusal is a 503 with Retry-After, and the body is never read
    (a kept-alive connection drops it in uvicorn)."""
    from types import SimpleNamespace

    from fastapi import FastAPI
    from starlette.testclient import TestClient

    def read(*_):
        raise AssertionError("the body of a refused request was read for the engine")

    model = kserve_server.PackratModel.__new__(kserve_server.PackratModel)
    model.max_body_bytes = 1000
    model.serving = SimpleNamespace(refusal=lambda received_at: Answer.error(503, "would be answered in 3.10 s", 2))
    monkeypatch.setattr(kserve_server, "asgi_body", read)
    monkeypatch.setattr(kserve_server, "linger", read)
    app = kserve_server.serving_app(FastAPI(), SimpleNamespace(get_model=lambda name: model))
    response = TestClient(app).post("/v2/models/m/infer", content=b"x" * 500)
    assert response.status_code == 503 and response.headers["Retry-After"] == "2"
    assert "3.10 s" in response.json()["error"]


def recording_model(answer: Answer = Answer.error(503, "refused")):
    """A PackratModel whose engine keeps the requests it is given (and answers each `answer`)."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    model = kserve_server.PackratModel.__new__(kserve_server.PackratModel)
    model.name, model.max_body_bytes, model.request_timeout_s, model.requests = "m", 1 << 20, 120.0, []

    def submit(request):
        model.requests.append(request)
        future = Future()
        future.set_result(answer)
        return future

    model.serving = SimpleNamespace(arrive=lambda: None, submit=submit, refusal=lambda received_at: None)
    return model


def grpc_infer(timeout_us: int | None = None) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=SHAPE)],
        raw_input_contents=[sample().tobytes()])
    if timeout_us is not None:
        message.parameters["timeout"].int64_param = timeout_us
    return message


@pytest.mark.parametrize("grpc_deadline, timeout_us, expected", [
    (None, None, None),  # no client deadline: the server's
    (0.25, None, 0.25),  # gRPC's deadline
    (None, 400_000, 0.4),  # Triton's timeout parameter, in microseconds
    (0.25, 400_000, 0.25),  # both: the tighter
    (2.0, 400_000, 0.4),
])
def test_a_grpc_calls_deadline_and_tritons_timeout_reach_the_engine(grpc_deadline, timeout_us, expected):
    """KServe hands predict() no gRPC context: the servicer notes when the call began and its
    deadline; the request's deadline counts from then, the client's where it is tighter."""
    from types import SimpleNamespace

    from grpc_interceptor import exceptions as grpc_errors

    model = recording_model()

    class Plane:  # KServe's data plane: the parsed request to the model's predict()
        async def infer(self, request, headers, model_name):
            return await model.predict(request, headers), {}

    servicer = kserve_server.RepositoryServicer(Plane(), None)
    context = SimpleNamespace(invocation_metadata=lambda: (), time_remaining=lambda: grpc_deadline)
    before = time.monotonic()
    with pytest.raises(grpc_errors.Unavailable):
        asyncio.run(servicer.ModelInfer(grpc_infer(timeout_us), context))
    (request,) = model.requests
    assert before <= request.received_at <= time.monotonic()
    assert request.timeout_s == (None if expected is None else pytest.approx(expected))
    assert kserve_server.GRPC_CALL.get() is None  # reset after the call


def test_a_rest_requests_deadline_counts_from_before_its_body_and_reads_tritons_timeout():
    from fastapi import FastAPI
    from starlette.testclient import TestClient
    from types import SimpleNamespace

    model = recording_model(Answer(200, b"{}"))
    received = []
    model.serving.refusal = lambda received_at: received.append(received_at)
    app = kserve_server.serving_app(FastAPI(), SimpleNamespace(get_model=lambda name: model))
    body, length = oip.request({"inputs": [{"name": "input", "shape": SHAPE, "datatype": "FP32"}],
                                "parameters": {"timeout": 300_000}}, [sample().tobytes()])
    before = time.monotonic()
    response = TestClient(app).post("/v2/models/m/infer", content=body, headers={oip.HEADER: str(length)})
    assert response.status_code == 200
    (request,) = model.requests
    assert received == [request.received_at] and before <= request.received_at
    assert request.timeout_s == pytest.approx(0.3)


def test_tritons_timeout_parameter_in_seconds():
    assert kserve_server.parameter_timeout_s(grpc_infer(1_500_000).parameters) == pytest.approx(1.5)
    assert kserve_server.parameter_timeout_s(grpc_infer().parameters) is None
    assert kserve_server.parameter_timeout_s({"timeout": 2000}) == pytest.approx(0.002)
    assert kserve_server.parameter_timeout_s({"timeout": 0}) is None  # no deadline
    assert kserve_server.parameter_timeout_s({"timeout": "soon"}) is None
    assert kserve_server.parameter_timeout_s(None) is None


def asgi_post(app, path: str, messages: list[dict], headers: dict[str, str]) -> tuple[int | None, bytes]:
    """`app` run on one POST whose body arrives as the ASGI `messages` given (then a disconnect, as a
    server reports a closed connection): (status, body) sent, status None where nothing was sent."""
    scope = {"type": "http", "method": "POST", "path": path, "http_version": "1.1", "query_string": b"",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()], "root_path": ""}
    given = iter(messages)
    sent = {}

    async def receive():
        return next(given, {"type": "http.disconnect"})

    async def send(message):
        sent.setdefault(message["type"], message)

    asyncio.run(app(scope, receive, send))
    return sent.get("http.response.start", {}).get("status"), sent.get("http.response.body", {}).get("body", b"")


def test_a_16_mib_binary_header_is_refused_unparsed_and_never_reaches_the_engine():
    """Its timeout parsed whole, such a header held the event loop 2-3.6 s here."""
    from types import SimpleNamespace

    from fastapi import FastAPI
    from test_oip import huge_header

    model = recording_model(Answer(200, b"{}"))
    model.max_body_bytes = 32 << 20
    app = kserve_server.serving_app(FastAPI(), SimpleNamespace(get_model=lambda name: model))
    body = huge_header(timeout_last=False) + sample().tobytes()
    headers = {"Content-Length": str(len(body)), oip.HEADER: str(16 << 20)}
    started = time.perf_counter()
    status, answer = asgi_post(app, "/v2/models/m/infer", [{"type": "http.request", "body": body}], headers)
    took_s = time.perf_counter() - started
    assert status == 413 and "over the limit of 1048576" in json.loads(answer)["error"] and not model.requests
    assert took_s < 0.2  # measured ~1 ms
    status, answer = asgi_post(app, "/v2/models/m/infer", [{"type": "http.request", "body": body[:100]}],
                               {**headers, "Content-Length": "100"})
    assert status == 400 and "but the body has only 100 bytes" in json.loads(answer)["error"] and not model.requests


def refusing_app(limit: int = 16 << 20, refuse: bool = True):
    """KServe's routes as the server adds them, for a model that refuses every request 503 (or
    admits it, with `refuse` False, and is never reached in these tests)."""
    from types import SimpleNamespace

    from fastapi import FastAPI

    model = kserve_server.PackratModel.__new__(kserve_server.PackratModel)
    model.max_body_bytes, model.request_timeout_s = limit, 120.0
    refused = Answer.error(503, "would be answered in 3.10 s", 2) if refuse else None
    model.serving = SimpleNamespace(refusal=lambda received_at: refused)
    return kserve_server.serving_app(FastAPI(), SimpleNamespace(get_model=lambda name: model if name == "m" else None))


@contextlib.contextmanager
def uvicorn_on_loopback(app):
    """`app` served by uvicorn, as KServe serves its app, on a free loopback port; stopped after."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


def slow_upload(port: int, path: str, size: int, close: bool) -> tuple[int, bytes]:
    """POST `size` bytes in 64 KiB pieces a few ms apart, as a client on a slow link sends; then the
    answer. `close`: the request says Connection: close (as urllib and HTTP/1.0 clients do)."""
    import http.client

    def pieces():
        for start in range(0, size, 1 << 16):
            time.sleep(0.003)
            yield b"x" * min(1 << 16, size - start)

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Length": str(size), "Content-Type": "application/json"}
    if close:
        headers["Connection"] = "close"
    try:
        conn.request("POST", path, body=pieces(), headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("close", [True, False], ids=["connection-close", "keep-alive"])
@pytest.mark.parametrize("path", ["/v2/models/m/infer", "/v2/models/absent/infer", "/no/such/route"])
def test_a_client_still_sending_reads_the_early_answer(path, close):
    """A 3 MB body sent slowly to a server that answers before reading it (a refusal by admission,
    an unknown model, an unknown route): the client reads the answer, not a broken pipe. Without
    the body read first, a Connection: close request got EPIPE while still sending."""
    with uvicorn_on_loopback(refusing_app()) as port:
        status, body = slow_upload(port, path, 3 << 20, close)
    assert status == {"/v2/models/m/infer": 503, "/v2/models/absent/infer": 404}.get(path, 404), body
    if status == 503:
        assert b"3.10 s" in body


def test_an_oversized_slow_upload_reads_its_413():
    """The same for a body over the limit: the 413 reaches a client still sending."""
    with uvicorn_on_loopback(refusing_app(limit=1 << 20, refuse=False)) as port:
        status, body = slow_upload(port, "/v2/models/m/infer", 3 << 20, close=True)
    assert status == 413 and b"over 1048576 bytes" in body, body


def chunks(body: bytes, *ends: int) -> list[dict]:
    """ASGI body messages of body[:end] for each end in `ends`, the last one saying the body is done."""
    starts = (0, *ends[:-1])
    return [{"type": "http.request", "body": body[a:b], "more_body": b != ends[-1]} for a, b in zip(starts, ends)]


def test_a_body_cut_short_is_refused_and_never_reaches_the_engine():
    """The client gone before its body's end (http.disconnect), or fewer bytes than its
    Content-Length: 400 "cut short" (to no one, if the connection is closed), never served."""
    from types import SimpleNamespace

    from fastapi import FastAPI

    model = recording_model(Answer(200, b"{}"))
    app = kserve_server.serving_app(FastAPI(), SimpleNamespace(get_model=lambda name: model))
    body = sample().tobytes()
    headers = {"Content-Length": str(len(body)), "Content-Type": "application/octet-stream"}
    gone = chunks(body, 4000, 8000)[:1]  # then a disconnect
    status, answer = asgi_post(app, "/v2/models/m/infer", gone, headers)
    assert status == 400 and "the connection closed after 4000 bytes" in json.loads(answer)["error"]
    status, answer = asgi_post(app, "/v2/models/m/infer", chunks(body, 4000, 8000), headers)
    assert status == 400 and f"8000 of the {len(body)} bytes its Content-Length says" in json.loads(answer)["error"]
    assert not model.requests
    assert asgi_post(app, "/v2/models/m/infer", chunks(body, 4000, len(body)), headers)[0] == 200
    assert [r.body for r in model.requests] == [body]


def test_a_client_that_leaves_mid_body_is_never_served_through_uvicorn():
    """The same through uvicorn as KServe runs it: a socket that sends half its Content-Length and closes."""
    import socket
    from types import SimpleNamespace

    from fastapi import FastAPI

    model = recording_model(Answer(200, b"{}"))
    app = kserve_server.serving_app(FastAPI(), SimpleNamespace(get_model=lambda name: model))
    statuses = []

    async def recorded(scope, receive, send):
        async def send_recorded(message):
            if message["type"] == "http.response.start":
                statuses.append(message["status"])
            await send(message)

        await app(scope, receive, send_recorded)

    with uvicorn_on_loopback(recorded) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                           b"Content-Length: 12288\r\n\r\n" + b"\0" * 6000)
            time.sleep(0.2)  # the server reads the first half before the close
        deadline = time.monotonic() + 10
        while not statuses and time.monotonic() < deadline:
            time.sleep(0.02)
    assert statuses == [400] and not model.requests


# ---- a real server ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from packrat.deploy import archive, kserve
    from packrat.deploy.torchserve import free_port
    from packrat.settings import Settings

    root = tmp_path_factory.mktemp("kserve")
    mars = []
    for name, model in (("tiny", "tiny"), ("tiny2", "tiny"), ("text", "tiny_text")):  # tiny2: the one unloaded
        (root / f"{model}.csv").write_text(f"# model: {model}\n" + PROFILE)
        settings = Settings(model, profiles=(str(root / f"{model}.csv"),), max_batch=4, max_body_bytes=MAX_BODY)
        mars.append(archive.build(settings, root / "store", name=name, max_batch_delay_ms=20))
    running = kserve.KServeServer(root / "run", ("tiny", "tiny2", "text"), http_port=free_port(), grpc_port=free_port())
    kserve.start(running, mars, timeout=240)
    try:
        yield running
    finally:
        kserve.stop(running)


def post(url: str, body: bytes, headers: dict | None = None, timeout: float = 60.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError as exc:  # no answer at all: what this front end must never leave a request with
        return 0, str(exc).encode()


def v2_json(x: np.ndarray) -> bytes:
    return json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.flatten().tolist()}]}).encode()


@pytest.mark.integration
def test_tritonclient_http_metadata_readiness_and_binary_equals_json(server):
    http = pytest.importorskip("tritonclient.http")
    client = http.InferenceServerClient(server.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("tiny")
    metadata = client.get_model_metadata("tiny")
    assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert metadata["outputs"] == [{"name": "output0", "datatype": "FP32", "shape": [-1, 10]}]
    x = sample(3)
    answers = []
    for binary in (True, False):
        given = http.InferInput("input", SHAPE, "FP32")
        given.set_data_from_numpy(x, binary_data=binary)
        result = client.infer("tiny", [given], outputs=[http.InferRequestedOutput("output0", binary_data=binary)])
        answers.append(result.as_numpy("output0"))
    assert np.array_equal(answers[0], answers[1])
    np.testing.assert_allclose(answers[0], reference(x), rtol=1e-4, atol=1e-4)


# tritonclient's gRPC stubs and KServe's declare the same protobuf package (`inference`): one process
# cannot import both, so tritonclient's gRPC client runs in a process of its own.
TRITON_GRPC = """
import json, sys
import numpy as np
import tritonclient.grpc as grpcclient
client = grpcclient.InferenceServerClient(sys.argv[1])
x = np.array(json.loads(sys.argv[2]), np.float32)
given = grpcclient.InferInput("input", list(x.shape), "FP32")
given.set_data_from_numpy(x)
result = client.infer("tiny", [given], outputs=[grpcclient.InferRequestedOutput("output0")])
print(json.dumps({"ready": client.is_server_ready() and client.is_model_ready("tiny"),
                  "metadata": client.get_model_metadata("tiny", as_json=True),
                  "output": result.as_numpy("output0").tolist()}))
"""


@pytest.mark.integration
def test_tritonclient_grpc_answers_as_http_does(server):
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("tritonclient.grpc") is None:  # found, not imported: see above
        pytest.skip("tritonclient[grpc] is not installed")
    x = sample(4)
    done = subprocess.run([sys.executable, "-c", TRITON_GRPC, server.grpc_address, json.dumps(x.tolist())],
                          capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["ready"] and got["metadata"]["inputs"][0]["shape"] == ["-1", "3", "32", "32"]  # int64 as text
    output = np.array(got["output"], np.float32)
    np.testing.assert_allclose(output, reference(x), rtol=1e-4, atol=1e-4)
    status, body = post(f"{server.url}/v2/models/tiny/infer", v2_json(x))
    assert status == 200 and np.array_equal(np.array(json.loads(body)["outputs"][0]["data"], np.float32),
                                            output.flatten())


@pytest.mark.integration
def test_the_kserve_sdk_clients_rest_v2_v1_and_grpc(server):
    from kserve import InferenceGRPCClient, InferenceRESTClient, RESTConfig

    x = sample(5)

    async def ask():
        answers = []
        async with InferenceRESTClient(RESTConfig(protocol="v2", retries=0)) as rest:
            for binary in (True, False):
                given = InferInput("input", SHAPE, "FP32")
                given.set_data_from_numpy(x, binary_data=binary)
                response = await rest.infer(server.url, InferRequest("tiny", [given]), model_name="tiny")
                answers.append(response.outputs[0].as_numpy())
        async with InferenceRESTClient(RESTConfig(protocol="v1", retries=0)) as rest:
            v1 = await rest.infer(server.url, {"instances": x.tolist()}, model_name="tiny")
        async with InferenceGRPCClient(server.grpc_address, retries=0) as grpc_client:
            given = InferInput("input", SHAPE, "FP32")
            given.set_data_from_numpy(x)
            response = await grpc_client.infer(InferRequest("tiny", [given]))
            answers.append(response.outputs[0].as_numpy())
        return answers, v1

    answers, v1 = asyncio.run(ask())
    assert np.array_equal(answers[0], answers[1]) and np.array_equal(answers[0], answers[2])
    top = int(np.argmax(answers[0]))
    (prediction,) = v1["predictions"]  # one instance: its top classes
    assert prediction["predictions"][0]["class"] == top


@pytest.mark.integration
def test_several_named_inputs_binary_json_and_grpc_and_their_metadata(server):
    """A text model's token ids and mask, as named v2 inputs, over REST in binary and in JSON and over
    gRPC; the metadata names both inputs and the embedding's real width."""
    http = pytest.importorskip("tritonclient.http")
    from kserve import InferenceGRPCClient

    client = http.InferenceServerClient(server.url.removeprefix("http://"))
    metadata = client.get_model_metadata("text")
    assert [(i["name"], i["datatype"], i["shape"]) for i in metadata["inputs"]] == [
        ("input_ids", "INT64", [-1, 16]), ("attention_mask", "INT64", [-1, 16])]
    assert metadata["outputs"] == [{"name": "output0", "datatype": "FP32", "shape": [-1, 32]}]
    ids = np.array([[101, 7, 8, 9, 102] + [0] * 11], np.int64)
    mask = (ids != 0).astype(np.int64)
    answers = []
    for binary in (True, False):
        given = [http.InferInput(name, [1, 16], "INT64") for name in ("input_ids", "attention_mask")]
        for entry, values in zip(given, (ids, mask)):
            entry.set_data_from_numpy(values, binary_data=binary)
        answers.append(client.infer("text", given).as_numpy("output0"))

    async def over_grpc():
        given = [InferInput(name, [1, 16], "INT64") for name in ("input_ids", "attention_mask")]
        for entry, values in zip(given, (ids, mask)):
            entry.set_data_from_numpy(values)
        async with InferenceGRPCClient(server.grpc_address, retries=0) as grpc_client:
            return (await grpc_client.infer(InferRequest("text", given))).outputs[0].as_numpy()

    answers.append(asyncio.run(over_grpc()))
    assert np.array_equal(answers[0], answers[1]) and np.array_equal(answers[0], answers[2])
    with torch.inference_mode():
        want = resolve("tiny_text").build()(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    np.testing.assert_allclose(answers[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.integration
def test_a_bad_request_fails_alone_and_oversized_bodies_get_413(server):
    good, bad = v2_json(sample(6)), b'{"inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32"'
    barrier, results = threading.Barrier(4), {}

    def send(index: int, body: bytes) -> None:
        barrier.wait()
        results[index] = post(f"{server.url}/v2/models/tiny/infer", body)

    threads = [threading.Thread(target=send, args=(i, bad if i == 2 else good)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [results[i][0] for i in range(4)] == [200, 200, 400, 200]
    assert "error" in json.loads(results[2][1])
    status, body = post(f"{server.url}/v2/models/tiny/infer", b"0" * (MAX_BODY + 1))
    assert status == 413 and "error" in json.loads(body)
    assert post(f"{server.url}/v2/models/nothing/infer", good)[0] == 404


@pytest.mark.integration
def test_metrics_carry_packrats_figures_beside_kserves(server):
    post(f"{server.url}/v2/models/tiny/infer", v2_json(sample(7)))
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as response:
        text = response.read().decode()
    for line in ('packrat_plan_batch{model="tiny"}', 'packrat_instances_ready{model="tiny"}',
                 'packrat_reconfigurations_total{model="tiny"}', 'request_predict_seconds_count{model_name="tiny"}'):
        assert line in text, line
    assert re.search(r'packrat_instance_predicted_latency_ms{batch="\d+",model="tiny",runtime="\w+",threads="\d+"} \d', text)


class Users:
    """Closed-loop users posting to a model until stopped; every answer's (time, status)."""

    def __init__(self, url: str, users: int):
        self.url, self.answers, self._stop = url, [], threading.Event()
        self._threads = [threading.Thread(target=self._user, args=(seed,), daemon=True) for seed in range(users)]
        for thread in self._threads:
            thread.start()

    def _user(self, seed: int) -> None:
        body = v2_json(sample(seed))
        while not self._stop.is_set():
            status, _ = post(self.url, body, timeout=60)
            self.answers.append((time.monotonic(), status))

    def stop(self) -> list:
        self._stop.set()
        for thread in self._threads:
            thread.join(90)
        return self.answers


@pytest.mark.integration
@pytest.mark.slow
def test_killed_instances_under_load_cost_no_request(server):
    from packrat.bench.faults import kill_one

    users = [Users(f"{server.url}/v2/models/{name}/infer", 3) for name in ("tiny", "tiny2")]
    killed = []
    try:
        for _ in range(3):
            time.sleep(1.5)
            killed.append(kill_one(server.pid, skip=killed))
        time.sleep(2)
    finally:
        answers = [a for u in users for a in u.stop()]
    assert all(killed) and len(answers) > 20
    assert [status for _, status in answers if status != 200] == []


@pytest.mark.integration
@pytest.mark.slow
def test_a_model_unloaded_under_load_answers_what_it_holds_and_loads_again(server):
    users = Users(f"{server.url}/v2/models/tiny2/infer", 6)
    try:
        time.sleep(1.5)
        unloaded_at = time.monotonic()
        status, body = post(f"{server.url}/v2/repository/models/tiny2/unload", b"")
        assert status == 200, body
        time.sleep(1.5)
    finally:
        answers = users.stop()
    before = [s for t, s in answers if t < unloaded_at]
    assert before and set(before) == {200}
    # every request was answered: served, refused by the closing engine (503) or, once gone, 404
    assert {s for _, s in answers} <= {200, 503, 404} and answers[-1][1] == 404
    assert post(f"{server.url}/v2/models/tiny/infer", v2_json(sample(8)))[0] == 200  # the other model serves on
    assert repository_call(server, "RepositoryModelLoad", "tiny2").isLoaded  # back, over gRPC this time
    assert post(f"{server.url}/v2/models/tiny2/infer", v2_json(sample(9)))[0] == 200
    status, body = post(f"{server.url}/v2/repository/models/tiny2/load", b"", timeout=240)
    assert status == 200, body  # loading a model that serves is no error


def repository_call(server, method: str, name: str):
    """A model repository call over gRPC, as KServe's protocol defines it."""
    import grpc

    from kserve.protocol.grpc.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub

    message = getattr(pb, f"{method}Request")(model_name=name)
    with grpc.insecure_channel(server.grpc_address) as channel:
        return getattr(GRPCInferenceServiceStub(channel), method)(message, timeout=240)


def test_the_connection_limit_is_the_raised_files_limit_less_a_reserve(monkeypatch):
    """Past the open-files limit accept() fails and clients wait unanswered: the REST server answers
    503 below it. The soft limit is raised to the hard one first; where that is refused, it stands."""
    import resource

    limits = {"now": (1024, 4096)}
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda which, value: limits.update(now=value))
    assert kserve_server.connection_limit() == 4096 - kserve_server.FD_RESERVE
    assert limits["now"] == (4096, 4096)

    def refuse(which, value):
        raise ValueError("not allowed")

    limits["now"] = (1024, 4096)
    monkeypatch.setattr(resource, "setrlimit", refuse)
    assert kserve_server.connection_limit() == 1024 - kserve_server.FD_RESERVE
    limits["now"] = (200, 200)
    assert kserve_server.connection_limit() == kserve_server.FD_RESERVE  # never below the reserve itself


def test_kserves_own_routes_read_bodies_within_the_servers_limits(monkeypatch):
    """A route of KServe's app that reads its body gets it whole within the server's default size;
    over it, 413 before the route runs (KServe's routes read bodies with no limit of their own)."""
    from types import SimpleNamespace

    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from starlette.responses import JSONResponse

    monkeypatch.setattr(kserve_server, "MAX_BODY_BYTES", 1000)
    app, seen = FastAPI(), []

    async def load(request):  # as KServe's repository routes read theirs: whole, no limit
        seen.append(len(await request.body()))
        return JSONResponse({"name": request.path_params["name"]})

    app.add_route("/v2/repository/models/{name}/load", load, methods=["POST"])

    client = TestClient(kserve_server.serving_app(app, SimpleNamespace(get_model=lambda name: None)))
    assert client.post("/v2/repository/models/m/load", content=b"x" * 1000).status_code == 200
    refused = client.post("/v2/repository/models/m/load", content=b"x" * 1001)
    assert refused.status_code == 413 and "over 1000 bytes" in refused.json()["error"]
    assert seen == [1000]


def test_a_bounded_body_still_arriving_past_its_time_is_answered_408():
    import asyncio

    from packrat.frontends.http import BoundedBody

    called, sent = [], []

    async def app(scope, receive, send):
        called.append(await receive())

    async def trickle():
        await asyncio.sleep(0.05)
        return {"type": "http.request", "body": b"x", "more_body": True}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [(b"content-length", b"100")]}
    asyncio.run(BoundedBody(app, 1000, 0.3)(scope, trickle, send))
    assert not called and sent[0]["status"] == 408


def test_headers_trickling_past_their_deadline_close_the_connection(monkeypatch):
    """uvicorn bounds headers' size, not their time: with the server's protocol a connection whose
    headers are still coming HEADERS_S after it opened is closed; a whole request is answered."""
    import socket
    import threading
    import time

    import uvicorn

    from packrat.frontends import http

    monkeypatch.setattr(http, "HEADERS_S", 0.5)

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, http=http.header_deadline_protocol(), log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as good:
            good.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert good.recv(1024).startswith(b"HTTP/1.1 200")
            time.sleep(0.8)  # kept alive past HEADERS_S with nothing sent: the keep-alive rule's, not ours
            good.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert good.recv(1024).startswith(b"HTTP/1.1 200")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
            started = time.monotonic()
            slow.sendall(b"GET / HTT")
            assert slow.recv(1024) == b""  # closed, not answered
            assert 0.4 < time.monotonic() - started < 3
    finally:
        server.should_exit = True
        thread.join(5)
