"""Hostile and unusual clients of the KServe server's REST inference paths (issue 71): a body read
by its request's deadline (408, the connection closed) and within what all bodies being read may
hold together (503 with Retry-After); the deployer's middleware on KServe's app run in front of the
raw-ASGI inference paths; hundreds of connections trickling a byte a second against a real server."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import threading
import time

import numpy as np
import pytest

pytest.importorskip("kserve", reason="the KServe front end is an optional extra: pip install 'packrat[kserve]'")

from fastapi import FastAPI  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402
from test_kserve import recording_model, sample, uvicorn_on_loopback  # noqa: E402

from packrat.codec import oip  # noqa: E402
from packrat.frontends import kserve_server  # noqa: E402
from packrat.frontends.http import BodyReads  # noqa: E402
from packrat.serving.pool.api import Answer  # noqa: E402

OK = Answer(200, b'{"outputs": []}', content_type="application/json")


def app_of(model, kserve_app: FastAPI | None = None, bodies: BodyReads | None = None):
    from types import SimpleNamespace

    repository = SimpleNamespace(get_model=lambda name: model if name == "m" else None)
    return kserve_server.serving_app(kserve_app or FastAPI(), repository, bodies)


def raw_request(port: int, head: bytes, body: bytes, wait_s: float) -> tuple[bytes, float, bool]:
    """Send `head` and the start of `body`, then nothing: (what the server sent back within `wait_s`,
    seconds until it answered, whether it closed the connection after)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as client:
        started = time.monotonic()
        client.sendall(head + body)
        got, closed = b"", False
        try:
            while True:
                chunk = client.recv(65536)
                if not chunk:
                    closed = True
                    break
                got += chunk
        except socket.timeout:
            pass
        return got, time.monotonic() - started, closed


def head_of(path: str, length: int, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n").encode()


# ---- a body read by its deadline ----------------------------------------------------------------

@pytest.mark.parametrize("middleware", [False, True], ids=["plain", "behind-a-deployers-middleware"])
def test_a_body_still_arriving_at_its_deadline_is_answered_408_and_its_connection_closed(middleware):
    """Before, a client that sent part of its body and stalled held its connection (and what it sent)
    for as long as it liked; now it gets 408 at its request's deadline and the connection closes. A
    deployer's middleware in front (which lingers over unread bodies for other answers) does not
    hold the 408 back."""
    model = recording_model(OK)
    model.request_timeout_s = 0.6
    kserve_app = FastAPI()
    if middleware:
        @kserve_app.middleware("http")
        async def passes(request, call_next):
            return await call_next(request)
    with uvicorn_on_loopback(app_of(model, kserve_app)) as port:
        got, took_s, closed = raw_request(port, head_of("/v2/models/m/infer", 1000), b"x" * 10, wait_s=5)
    assert got.startswith(b"HTTP/1.1 408 "), got
    assert b"connection: close" in got.lower() and closed
    assert b"still arriving at its deadline (10 bytes read)" in got
    assert 0.5 <= took_s < 2.5  # the deadline, not the 5 s linger or the client's own timeout
    assert not model.requests


def test_a_whole_body_within_its_deadline_is_served():
    model = recording_model(OK)
    model.request_timeout_s = 0.6
    body = sample().tobytes()
    with uvicorn_on_loopback(app_of(model)) as port:
        got, _, _ = raw_request(port, head_of("/predictions/m", len(body)), body, wait_s=1)
    assert got.startswith(b"HTTP/1.1 200 ") and [r.body for r in model.requests] == [body]


# ---- what the bodies being read hold together ----------------------------------------------------

def test_a_body_past_what_the_bodies_being_read_may_hold_is_refused_503_and_the_bytes_given_back():
    """Two uploads under way: the first holds 80 kB of a 100 kB budget; the second's 30 kB would pass
    it, so it is refused at once (503, Retry-After) before more of it is read, while the first is
    served; every byte is given back once they are answered."""
    model = recording_model(OK)
    bodies = BodyReads(100_000)
    app = app_of(model, bodies=bodies)
    first = sample().tobytes() * 7  # 86 kB
    sent: dict[str, dict] = {"first": {}, "second": {}}

    def request(name: str, messages: list[dict], length: int, rest: asyncio.Event | None = None):
        scope = {"type": "http", "method": "POST", "path": "/v2/models/m/infer", "http_version": "1.1",
                 "query_string": b"", "root_path": "",
                 "headers": [(b"content-length", str(length).encode()), (b"content-type", b"application/octet-stream")]}

        async def receive():
            if messages:
                return messages.pop(0)
            await rest.wait()
            return {"type": "http.request", "body": first[80_000:], "more_body": False}

        async def send(message):
            sent[name].setdefault(message["type"], message)

        return app(scope, receive, send)

    async def both():
        rest = asyncio.Event()
        task = asyncio.create_task(request("first", [{"type": "http.request", "body": first[:80_000],
                                                      "more_body": True}], len(first), rest))
        await asyncio.sleep(0.05)
        assert bodies.held == 80_000
        await request("second", [{"type": "http.request", "body": b"x" * 30_000, "more_body": True}], 60_000)
        rest.set()
        await task

    asyncio.run(both())
    refused, served = sent["second"], sent["first"]
    assert refused["http.response.start"]["status"] == 503
    assert (b"retry-after", b"1") in refused["http.response.start"]["headers"]
    assert "hold 80000 bytes, the server's limit (100000)" in json.loads(refused["http.response.body"]["body"])["error"]
    assert served["http.response.start"]["status"] == 200 and [r.body for r in model.requests] == [first]
    assert bodies.held == 0


def test_the_budget_gives_back_what_a_body_refused_or_cut_short_held():
    from test_kserve import asgi_post, chunks

    bodies = BodyReads(1 << 20)
    model = recording_model(OK)
    model.max_body_bytes = 50_000
    app = app_of(model, bodies=bodies)
    body = b"\0" * 40_000
    headers = {"Content-Length": str(len(body))}
    assert asgi_post(app, "/v2/models/m/infer", chunks(body, 20_000), headers)[0] == 400  # then a disconnect
    assert asgi_post(app, "/v2/models/m/infer", chunks(body * 2, 30_000, 80_000),
                     {"Content-Length": "80000"})[0] == 413
    assert asgi_post(app, "/v2/models/m/infer", chunks(body, 20_000, 40_000), headers)[0] == 200
    assert bodies.held == 0


# ---- the deployer's middleware runs in front of the inference paths -------------------------------

TOKEN = "Bearer s3cret"


def with_auth(kind: str) -> FastAPI:
    """KServe's app with an authentication middleware added by the deployer, as a function
    (BaseHTTPMiddleware, @app.middleware) or as a pure ASGI class; and KServe's own timing
    middleware, which the inference paths skip."""
    from timing_asgi import TimingClient, TimingMiddleware
    from timing_asgi.integrations import StarletteScopeToName

    app = FastAPI()
    app.timed = []

    class Timings(TimingClient):
        def timing(self, metric_name, timing, tags):
            app.timed.append(metric_name)

    app.add_middleware(TimingMiddleware, client=Timings(), metric_namer=StarletteScopeToName("kserve.io", app))
    if kind == "function":
        @app.middleware("http")
        async def authenticate(request, call_next):
            if request.headers.get("authorization") != TOKEN:
                return JSONResponse({"error": "unauthorised"}, status_code=401)
            return await call_next(request)
    else:
        class Authenticate:
            def __init__(self, inner, token: str):
                self.inner, self.token = inner, token.encode()

            async def __call__(self, scope, receive, send):
                if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != self.token:
                    return await JSONResponse({"error": "unauthorised"}, status_code=401)(scope, receive, send)
                await self.inner(scope, receive, send)

        app.add_middleware(Authenticate, token=TOKEN)
    return app


def inference_requests() -> list[tuple[str, bytes, dict]]:
    """(path, body, headers) of a request on each inference path: v2 JSON, v2 binary, v1, TorchServe's."""
    x = sample()
    v2_json = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                      "data": x.flatten().tolist()}]}).encode()
    binary, length = oip.request({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32"}]},
                                 [x.tobytes()])
    return [("/v2/models/m/infer", v2_json, {"Content-Type": "application/json"}),
            ("/v2/models/m/versions/1/infer", binary, {"Content-Type": "application/octet-stream",
                                                      oip.HEADER: str(length)}),
            ("/v1/models/m:predict", json.dumps({"instances": x.tolist()}).encode(),
             {"Content-Type": "application/json"}),
            ("/predictions/m", x.tobytes(), {"Content-Type": "application/octet-stream"})]


@pytest.mark.parametrize("kind", ["function", "asgi-class"])
def test_the_deployers_authentication_guards_every_inference_path(kind):
    """Before, the raw-ASGI inference paths answered ahead of KServe's app and its middleware: a
    request without the credential was served. Now each path is refused 401 without it (the
    engine never sees the request) and served with it; KServe's own timing middleware stays off
    these paths."""
    model = recording_model(OK)
    kserve_app = with_auth(kind)
    client = TestClient(app_of(model, kserve_app))
    for path, body, headers in inference_requests():
        refused = client.post(path, content=body, headers=headers)
        assert refused.status_code == 401 and refused.json() == {"error": "unauthorised"}, path
        assert not model.requests, path
        served = client.post(path, content=body, headers={**headers, "Authorization": TOKEN})
        assert served.status_code == 200, (path, served.text)
        assert model.requests.pop().body == body
    assert client.get("/status").status_code == 401  # the app's own routes, as before
    assert kserve_app.timed == []


def test_without_deployers_middleware_the_inference_paths_are_the_bare_endpoint():
    """Nothing added: no middleware layer (nor the body-lingering wrapper) on the inference paths."""
    app = app_of(recording_model(OK))
    TestClient(app).post("/predictions/m", content=sample().tobytes())
    assert app._infer == app.infer


# ---- hundreds of connections trickling a byte a second against a real server -----------------------

TRICKLERS = 300
DEADLINE_S = 2.5


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from test_kserve import PROFILE

    from packrat.deploy import archive, kserve
    from packrat.deploy.torchserve import free_port
    from packrat.settings import Settings

    root = tmp_path_factory.mktemp("hostile")
    (root / "tiny.csv").write_text("# model: tiny\n" + PROFILE)
    settings = Settings("tiny", profiles=(str(root / "tiny.csv"),), max_batch=4, request_timeout_s=DEADLINE_S)
    mar = archive.build(settings, root / "store", name="tiny", max_batch_delay_ms=5)
    running = kserve.KServeServer(root / "run", ("tiny",), http_port=free_port(), grpc_port=None)
    kserve.start(running, [mar], timeout=240)
    try:
        yield running
    finally:
        kserve.stop(running)


class GoodUser:
    """One closed-loop user of whole binary requests on a kept-alive connection: each latency, by when it ended."""

    def __init__(self, port: int):
        import http.client

        x = sample()
        self.body, length = oip.request({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32"}]},
                                        [x.tobytes()])
        self.headers = {"Content-Type": "application/octet-stream", oip.HEADER: str(length)}
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.latencies: list[tuple[float, float]] = []  # (ended at, seconds)
        self.statuses: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            self.conn.request("POST", "/v2/models/tiny/infer", body=self.body, headers=self.headers)
            response = self.conn.getresponse()
            response.read()
            ended = time.monotonic()
            self.statuses.append(response.status)
            self.latencies.append((ended, ended - started))

    def p50_between(self, start: float, end: float) -> float:
        return statistics.median(s for at, s in self.latencies if start <= at < end)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.conn.close()


async def trickle(port: int, until: float) -> tuple[float, float | None, bytes]:
    """A client declaring a 12 kB body and sending it a byte a second: (when it began, when the
    server answered or closed, what it answered); None: neither, by `until`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    began = time.monotonic()
    writer.write(head_of("/v2/models/tiny/infer", 12_000))
    answered = asyncio.ensure_future(reader.read(4096))
    try:
        while time.monotonic() < until:
            if answered.done():
                return began, time.monotonic(), answered.result()
            writer.write(b"x")
            await asyncio.wait([answered], timeout=1.0)
        return began, None, b""
    finally:
        answered.cancel()
        writer.close()


def tricklers(port: int, count: int, until: float, results: list) -> threading.Thread:
    async def all_of_them():
        results.extend(await asyncio.gather(*(trickle(port, until) for _ in range(count))))

    thread = threading.Thread(target=lambda: asyncio.run(all_of_them()), daemon=True)
    thread.start()
    return thread


def server_memory(pid: int) -> int:
    """The server process's PSS (its RSS where PSS cannot be read)."""
    import psutil

    process = psutil.Process(pid)
    try:
        return process.memory_full_info().pss
    except (psutil.AccessDenied, AttributeError):
        return process.memory_info().rss


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.serial
def test_hundreds_of_connections_trickling_a_byte_a_second_are_cut_at_their_deadline_while_good_requests_flow(server):
    """300 connections declare a body and send it a byte a second. Each is answered 408 (or closed)
    by its request's deadline (2.5 s here), the good user's p50 during them stays within a wide
    bound of before, and the server's memory within 64 MiB. Before, they trickled on unanswered."""
    good = GoodUser(server.http_port)
    try:
        time.sleep(2.0)  # warm
        before_start = time.monotonic()
        time.sleep(2.0)
        before_end, memory_before = time.monotonic(), server_memory(server.pid)
        results: list = []
        until = before_end + DEADLINE_S + 4.0
        thread = tricklers(server.http_port, TRICKLERS, until, results)
        peak = memory_before
        while thread.is_alive():
            peak = max(peak, server_memory(server.pid))
            time.sleep(0.25)
        during_end = time.monotonic()
    finally:
        good.close()
    assert len(results) == TRICKLERS
    late = [(began, at) for began, at, _ in results if at is None or at - began > DEADLINE_S + 1.5]
    assert not late, f"{len(late)} of {TRICKLERS} slow connections not answered or closed by their deadline"
    answers = [got.split(b"\r\n", 1)[0] for _, _, got in results]
    assert sum(a.startswith(b"HTTP/1.1 408") for a in answers) >= 0.9 * TRICKLERS, set(answers)
    assert set(good.statuses) == {200}
    p50_before = good.p50_between(before_start, before_end)
    p50_during = good.p50_between(before_end, during_end)
    assert p50_during <= max(3 * p50_before, p50_before + 0.05), (p50_before, p50_during)
    assert peak - memory_before < 64 * 2**20, (memory_before, peak)
