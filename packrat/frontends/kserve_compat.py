"""Where packrat's KServe server answers otherwise than KServe 0.21's own routes and servicer, found by
fuzzing them (issue 71):

- Model versions. Each model is served as version 1 (its metadata says `"versions": ["1"]`), but
  KServe answers any route naming a version (`/v2/models/NAME/versions/V/ready`, or
  `?model_version=V`) 501 "Model versioning not supported yet", so tritonclient's
  `is_model_ready(NAME, "1")` failed with a 5xx. ServedVersion answers a route naming version 1 as
  the unversioned route, and any other version 404.
- One-line reasons. KServe quotes a client's model and input names in its reasons as they came,
  line breaks included; its REST handlers and gRPC statuses here write line breaks as escapes.
- A client's error is answered, not logged. KServe logs a traceback for every invalid input and
  unknown model (REST and gRPC): 20,000 fuzz requests wrote 11 MB of them, each formatted in the
  event loop every request waits for. Here they are answered as KServe answers them, unlogged, as
  packrat's own refusals are."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, urlencode

from grpc import StatusCode
from kserve.errors import InvalidInput, ModelNotFound
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
from kserve.protocol.rest.server import RESTServer
from starlette.responses import JSONResponse

from packrat.errors import one_line
from packrat.frontends.http import send_answer
from packrat.serving.pool.api import Answer

SERVED_VERSION = "1"
VERSION_KEY = "model_version"
VERSIONED_PATH = re.compile(r"(/v2/models/[^/]+)/versions/([^/]*)(/.*)?")
# A client's errors, as KServe answers them: (HTTP status, gRPC status)
CLIENT_ERRORS = {InvalidInput: (400, StatusCode.INVALID_ARGUMENT), ModelNotFound: (404, StatusCode.NOT_FOUND)}


class ServedVersion:
    """ASGI middleware before KServe's routes: a route naming version 1 is answered as the
    unversioned one; a route naming another version 404."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            versions, scope = unversioned(scope)
            wrong = [version for version in versions if version not in ("", SERVED_VERSION)]
            if wrong:
                reason = one_line(f"no version {wrong[0][:40]!r} of a model here: each is served as version "
                                  f"{SERVED_VERSION}")
                return await send_answer(send, Answer.error(404, reason))
        await self.app(scope, receive, send)


def unversioned(scope: dict) -> tuple[list[str], dict]:
    """The versions a request names (its path's, its query's), and its scope without them."""
    versions, path = [], scope["path"]
    found = VERSIONED_PATH.fullmatch(path)
    if found:
        versions.append(found.group(2))
        path = found.group(1) + (found.group(3) or "")
    query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    versions += [value for key, value in query if key == VERSION_KEY]
    if not versions:
        return versions, scope
    kept = urlencode([(key, value) for key, value in query if key != VERSION_KEY]).encode("latin-1", "replace")
    return versions, {**scope, "path": path, "raw_path": quote(path).encode(), "query_string": kept}


class OneLineRESTServer(RESTServer):
    """KServe's REST server whose error handlers write each reason on one line, a client's errors unlogged."""

    def _add_exception_handlers(self, app) -> None:
        super()._add_exception_handlers(app)
        for kind, handler in list(app.exception_handlers.items()):
            app.exception_handlers[kind] = _one_line_handler(handler)
        for kind, (status, _) in CLIENT_ERRORS.items():
            app.exception_handlers[kind] = _client_error(status)


def _client_error(status: int):
    async def answer(request, exc):
        return JSONResponse({"error": one_line(str(exc))}, status_code=status)
    return answer


def _one_line_handler(handler):
    async def handle(request, exc):
        _one_line_reason(exc)
        return await handler(request, exc)
    return handle


def _one_line_reason(exc: BaseException) -> None:
    """KServe's errors carry their message as `reason` (or `error_msg`); grpc_interceptor's as `details`."""
    for name in ("reason", "error_msg", "details"):
        value = getattr(exc, name, None)
        if isinstance(value, str):
            try:
                setattr(exc, name, one_line(value))
            except AttributeError:  # a read-only property
                pass


class OneLineStatus(ExceptionToStatusInterceptor):
    """KServe's gRPC mapping of errors to statuses, each reason on one line, a client's errors unlogged."""

    async def handle_exception(self, ex, request_or_iterator, context, method_name):
        _one_line_reason(ex)
        client = CLIENT_ERRORS.get(type(ex))
        if client is not None:
            await context.abort(client[1], one_line(str(ex)))
        await super().handle_exception(ex, request_or_iterator, context, method_name)
