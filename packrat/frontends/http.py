"""What the HTTP front ends share (the Ray Serve ingress, the KServe server's REST routes): a request
body read within its limit, an Answer as a Starlette response, and the rest of a body read before a
refusal goes out. Both speak Starlette."""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from packrat.codec import oip
from packrat.codec.oip import HEADER
from packrat.serving.pool.api import Answer, Request

# A body left unread when the answer goes out is read and dropped first, up to these bounds (nginx's
# lingering close does the same for 5 s): a socket closed with unread bytes sends a reset, and a client
# still sending sees a broken pipe, not the answer. Past them the client is the one holding us up.
LINGER_BYTES = 64 * 2**20
LINGER_S = 5.0


async def limited_body(request: HttpRequest, limit: int) -> bytes | None:
    """The body; None when it is over `limit` bytes. An oversized body is read on (within the linger
    bounds), keeping none of it past the limit: refusing it unread resets the connection, and the
    client would never see the 413."""
    kept, size = [], 0
    stream = request.stream()
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            await _linger(stream.__anext__)
            return None
        kept.append(chunk)
    return b"".join(kept)


async def _linger(next_chunk) -> int:
    """Read and drop what is left of a body, within LINGER_BYTES and LINGER_S; the bytes dropped.
    `next_chunk` gives the next chunk, raising StopAsyncIteration at the body's end."""
    dropped, until = 0, time.monotonic() + LINGER_S
    try:
        while dropped < LINGER_BYTES:
            dropped += len(await asyncio.wait_for(next_chunk(), max(0.0, until - time.monotonic())))
    except (StopAsyncIteration, asyncio.TimeoutError):
        pass
    return dropped


class ReadBodyBeforeAnswering:
    """ASGI middleware for every route: an answer finished while its request's body is still coming
    (an early 503, a 404, a 413) waits for that body to be read and dropped, within the linger
    bounds, so the connection closes cleanly and the client reads the answer. The wait is part of
    the answer's latency. A body the route read already costs nothing more."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not _has_body(scope):
            return await self.app(scope, receive, send)
        body_done = False

        async def receive_tracked():
            nonlocal body_done
            message = await receive()
            body_done = body_done or message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def next_chunk() -> bytes:
            if body_done:
                raise StopAsyncIteration
            return (await receive_tracked()).get("body", b"")

        async def send_after_body(message):
            if message["type"] == "http.response.body" and not message.get("more_body", False) and not body_done:
                await _linger(next_chunk)
            await send(message)

        await self.app(scope, receive_tracked, send_after_body)


def _has_body(scope) -> bool:
    """Whether the request says a body follows (a length above 0, or chunks)."""
    for name, value in scope.get("headers", ()):
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


def engine_request(body: bytes, request: HttpRequest, received_at: float | None = None) -> Request:
    """The body as the engine takes it, with the headers that say how to read it, when it was
    received (time.monotonic(), taken before the body was read) and the client's deadline (Triton's
    `timeout` parameter, oip.timeout_s)."""
    length = request.headers.get(HEADER)
    return Request(body, request.headers.get("content-type"), length, received_at, oip.timeout_s(body, length))


def answer_response(answer: Answer, headers: dict | None = None) -> Response:
    """The answer as it is: its status, body (JSON, or a binary v2 answer with its header length), type
    and, for a refusal, when to try again."""
    headers = {**(headers or {}), **answer_headers(answer)}
    return Response(answer.body, status_code=answer.status, media_type=answer.content_type, headers=headers)


def answer_headers(answer: Answer) -> dict[str, str]:
    """The headers an answer carries: a binary v2 answer's header length, a refusal's Retry-After."""
    headers = {}
    if answer.header_length is not None:
        headers[HEADER] = str(answer.header_length)
    if answer.retry_after_s is not None:
        headers["Retry-After"] = str(answer.retry_after_s)
    return headers
