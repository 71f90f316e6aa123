"""The Ray Serve ingress (packrat/frontends/ray_serve.py: PackratIngress) without a cluster: real
HTTP requests as Starlette hands them over, the engines' deployment handle faked."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is an optional extra: pip install 'packrat[ray]'")

from starlette.requests import Request as HttpRequest  # noqa: E402

from packrat.codec import oip  # noqa: E402
from packrat.frontends.ray_serve import PackratIngress  # noqa: E402
from packrat.serving.pool.api import Answer  # noqa: E402


class Engines:
    """The engines' handle: each call recorded as (method, args), answered by `answer(method, args)`."""

    def __init__(self, answer=lambda method, args: (Answer(200, b"{}"), {})):
        self.calls, self._answer = [], answer

    def __getattr__(self, method: str):
        async def call(*args):
            self.calls.append((method, args))
            return self._answer(method, args)

        return SimpleNamespace(remote=call)


def post(ingress: PackratIngress, body: bytes, headers: dict[str, str], messages: list[dict] | None = None):
    """The ingress's response to a POST of `body` (or of the ASGI `messages` given) to its v2 path."""
    scope = {"type": "http", "method": "POST", "path": f"/v2/models/{ingress.name}/infer", "query_string": b"",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()], "root_path": ""}
    given = iter(messages or [{"type": "http.request", "body": body}])

    async def receive():
        return next(given, {"type": "http.disconnect"})

    return asyncio.run(ingress(HttpRequest(scope, receive)))


def test_a_16_mib_binary_header_is_refused_before_any_engine_sees_it():
    from test_oip import huge_header

    engines = Engines()
    ingress = PackratIngress("m", engines, 32 << 20)
    header = huge_header(timeout_last=True)
    body = header + b"\0" * 12
    started = time.perf_counter()
    response = post(ingress, body, {oip.HEADER: str(len(header))})
    took_s = time.perf_counter() - started
    assert response.status_code == 413 and "over the limit of 1048576" in json.loads(response.body)["message"]
    assert not engines.calls and took_s < 0.2  # measured ~1 ms
    response = post(ingress, body[:100], {oip.HEADER: str(16 << 20)})
    assert response.status_code == 400 and "but the body has only 100 bytes" in json.loads(response.body)["message"]
    response = post(ingress, b"{}", {oip.HEADER: "2"})  # a header within its limit: to an engine
    assert response.status_code == 200 and engines.calls[0][0] == "infer" and engines.calls[0][1][2] == "2"


def test_a_body_cut_short_is_refused_and_never_reaches_an_engine():
    """The client gone before its body's end, or fewer bytes than its Content-Length: 400, no engine called."""
    engines = Engines()
    ingress = PackratIngress("m", engines, 1 << 20)
    body = b"\0" * 12288
    headers = {"Content-Length": str(len(body)), "Content-Type": "application/octet-stream"}
    half = {"type": "http.request", "body": body[:6000], "more_body": True}
    response = post(ingress, body, headers, [half])  # then a disconnect
    assert response.status_code == 400 and "closed after 6000 bytes" in json.loads(response.body)["message"]
    response = post(ingress, body, headers, [{**half, "more_body": False}])
    assert response.status_code == 400 and "6000 of the 12288 bytes" in json.loads(response.body)["message"]
    assert not engines.calls
    assert post(ingress, body, headers).status_code == 200 and engines.calls[0][1][0] == body


def test_a_retry_after_a_dead_engine_counts_the_time_lost_against_the_deadline(monkeypatch):
    """The engine that died held the request LOST_S before it did; the next engine is told the whole
    wait since the ingress received it (its deadline counts from there), not the wait before the first try."""
    from ray.exceptions import RayActorError

    from packrat.frontends import ray_serve

    lost_s = 0.3
    monkeypatch.setattr(ray_serve, "RETRY_PAUSE_S", 0.01)
    waits = []

    class DyingFirst(Engines):
        def __getattr__(self, method: str):
            async def call(*args):
                waits.append(args[-1])
                if len(waits) == 1:
                    await asyncio.sleep(lost_s)
                    raise RayActorError()
                return Answer(200, b"{}"), {}

            return SimpleNamespace(remote=call)

    response = post(PackratIngress("m", DyingFirst(), 1 << 20), b"\0" * 16, {"Content-Length": "16"})
    assert response.status_code == 200 and len(waits) == 2
    assert waits[1] - waits[0] >= lost_s  # the sleep's own bound; the retry pause adds to it


def test_a_body_still_arriving_at_its_deadline_is_answered_408_and_closes_and_no_engine_sees_it():
    """The ingress reads its body by the request's deadline (the engines' request_timeout_s): a
    client that stalls gets 408 with Connection: close, not a connection held for as long as it likes."""
    engines = Engines()
    ingress = PackratIngress("m", engines, 1 << 20, request_timeout_s=0.3)
    scope = {"type": "http", "method": "POST", "path": "/v2/models/m/infer", "query_string": b"", "root_path": "",
             "headers": [(b"content-length", b"1000")]}
    given = [{"type": "http.request", "body": b"x" * 10, "more_body": True}]

    async def receive():
        if given:
            return given.pop()
        await asyncio.sleep(60)  # the rest never comes

    started = time.monotonic()
    response = asyncio.run(ingress(HttpRequest(scope, receive)))
    assert response.status_code == 408 and response.headers["connection"] == "close"
    assert "still arriving at its deadline (10 bytes read)" in json.loads(response.body)["message"]
    assert 0.25 <= time.monotonic() - started < 2 and not engines.calls


def test_the_ingress_passes_the_engines_deadline_to_its_body_reads():
    from packrat.frontends import ray_serve

    bound = ray_serve.app({"model": "tiny", "profile": __file__, "request_timeout_s": "7"})
    assert bound._bound_deployment.init_args[2:] == (16 << 20, 7.0)  # the body limit, then the deadline
