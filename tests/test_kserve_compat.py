"""Where packrat's KServe server answers otherwise than KServe's own routes (packrat/frontends/
kserve_compat.py), as the fuzzing campaign found them: a model version is version 1 or 404 (KServe
said 501), and every reason is on one line (KServe quoted a client's names with their line breaks)."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("kserve", reason="the KServe front end is an optional extra: pip install 'packrat[kserve]'")

from kserve.errors import InvalidInput, ModelNotFound  # noqa: E402

from packrat.errors import one_line  # noqa: E402
from packrat.frontends.kserve_compat import OneLineRESTServer, OneLineStatus, ServedVersion, unversioned  # noqa: E402


def scope(path: str, query: bytes = b"") -> dict:
    return {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": query,
            "headers": []}


def test_a_route_naming_version_1_is_the_unversioned_route():
    versions, plain = unversioned(scope("/v2/models/m/versions/1/ready"))
    assert versions == ["1"] and plain["path"] == "/v2/models/m/ready" and plain["raw_path"] == b"/v2/models/m/ready"
    versions, plain = unversioned(scope("/v2/models/m", b"x=1&model_version=1"))
    assert versions == ["1"] and plain["path"] == "/v2/models/m" and plain["query_string"] == b"x=1"
    assert unversioned(scope("/v2/models/m/ready", b"x=1")) == ([], scope("/v2/models/m/ready", b"x=1"))


def served(path: str, query: bytes = b"") -> tuple[list, list]:
    """What ServedVersion sends, and the scopes it passes on."""
    passed, sent = [], []

    async def app(scope, receive, send):
        passed.append(scope)

    async def send(message):
        sent.append(message)

    asyncio.run(ServedVersion(app)(scope(path, query), None, send))
    return sent, passed


def test_another_version_is_404_with_a_one_line_reason():
    sent, passed = served("/v2/models/m/versions/2%0Ax/ready")
    assert sent[0]["status"] == 404 and not passed
    reason = json.loads(sent[1]["body"])["error"]
    assert "no version '2%0Ax'" in reason and len(reason.splitlines()) == 1
    sent, passed = served("/v2/models/m", b"model_version=a%0Ab")
    assert sent[0]["status"] == 404 and len(json.loads(sent[1]["body"])["error"].splitlines()) == 1
    sent, passed = served("/v2/models/m/versions/1/ready")
    assert not sent and passed[0]["path"] == "/v2/models/m/ready"


def test_one_line_escapes_every_line_break():
    assert one_line("a\nb\r\x85c\u2028d") == "a\\nb\\r\\x85c\\u2028d"


def test_kserves_rest_errors_and_grpc_statuses_are_one_line_and_a_clients_unlogged(monkeypatch):
    from fastapi import FastAPI
    from kserve.logging import logger
    from starlette.testclient import TestClient

    logged = []
    monkeypatch.setattr(logger, "error", lambda *args, **kwargs: logged.append(args))

    app = FastAPI()

    async def missing():
        raise ModelNotFound("a\nb")

    app.add_api_route("/missing", missing)
    OneLineRESTServer._add_exception_handlers(object.__new__(OneLineRESTServer), app)
    response = TestClient(app).get("/missing")
    assert response.status_code == 404 and response.json() == {"error": "Model with name a\\nb does not exist."}

    class Context:
        async def abort(self, code, details):
            raise RuntimeError((code.name, details))

    with pytest.raises(RuntimeError) as info:
        asyncio.run(OneLineStatus().handle_exception(InvalidInput("bad\ninput"), None, Context(), "ModelInfer"))
    assert info.value.args[0] == ("INVALID_ARGUMENT", "bad\\ninput")
    with pytest.raises(RuntimeError) as info:
        asyncio.run(OneLineStatus().handle_exception(ModelNotFound("x"), None, Context(), "ModelInfer"))
    assert info.value.args[0] == ("NOT_FOUND", "Model with name x does not exist.")
    assert not logged  # a traceback per bad request filled the log (11 MB in 20,000 fuzz requests)
