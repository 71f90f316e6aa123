"""What the HTTP front ends share (the Ray Serve ingress, the KServe server's REST routes): a request
body read within its limit (and whole: one cut short is refused), an Answer's headers, and the rest
of a body read before an early answer goes out. The Ray ingress speaks Starlette; the KServe
server's inference paths raw ASGI; both read bodies as raw ASGI."""

from __future__ import annotations

import asyncio
import time

from packrat.codec import oip
from packrat.codec.oip import HEADER
from packrat.errors import RequestError
from packrat.serving.pool.api import Answer

# A body left unread when the answer goes out is read and dropped first, up to these bounds (nginx's
# lingering close does the same for 5 s): a socket closed with unread bytes sends a reset, and a client
# still sending sees a broken pipe, not the answer. Past them the client is the one holding us up.
LINGER_BYTES = 64 * 2**20
LINGER_S = 5.0


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


def header_refusal(body: bytes, length: str | None) -> Answer | None:
    """The answer to a binary v2 request whose header length is refused (oip.checked_header: past
    the body, or over its limit), before anything of it is parsed; None for any other request."""
    try:
        oip.checked_header(length, len(body))
    except RequestError as exc:
        return Answer.error(exc.status, exc.reason)
    return None


def answer_headers(answer: Answer) -> dict[str, str]:
    """The headers an answer carries: a binary v2 answer's header length, a refusal's Retry-After."""
    headers = {}
    if answer.header_length is not None:
        headers[HEADER] = str(answer.header_length)
    if answer.retry_after_s is not None:
        headers["Retry-After"] = str(answer.retry_after_s)
    return headers


# ---- raw ASGI: the inference path without a framework's per-request work --------------------------

def _next_chunk(receive):
    """A function giving a raw ASGI body's next chunk, raising StopAsyncIteration past its end."""
    more = True

    async def next_chunk() -> bytes:
        nonlocal more
        if not more:
            raise StopAsyncIteration
        message = await receive()
        more = message["type"] == "http.request" and message.get("more_body", False)
        return message.get("body", b"")

    return next_chunk


async def asgi_body(scope, receive, limit: int) -> bytes | None:
    """The body from ASGI messages; None when it is over `limit` bytes (the rest read and dropped
    within the linger bounds, so the client reads the 413). A body cut short (the client gone before
    its end, or fewer bytes than its Content-Length) raises RequestError 400: never served as if whole."""
    kept, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # http.disconnect
            raise RequestError(400, f"request body cut short: the connection closed after {size} bytes")
        chunk, more = message.get("body", b""), message.get("more_body", False)
        size += len(chunk)
        if size > limit:
            if more:
                await linger(receive)
            return None
        kept.append(chunk)
        if not more:
            break
    declared = _content_length(scope)
    if declared is not None and size != declared:
        raise RequestError(400, f"request body cut short: {size} of the {declared} bytes its Content-Length says")
    return kept[0] if len(kept) == 1 else b"".join(kept)


def _content_length(scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.strip().isdigit() else None
    return None


async def linger(receive) -> int:
    """Read and drop a raw ASGI body none of which was read, within the linger bounds; the bytes."""
    return await _linger(_next_chunk(receive))


async def send_answer(send, answer: Answer, extra: tuple = ()) -> None:
    """The answer as two ASGI messages: its status, type and headers (answer_headers), then its body."""
    headers = [(b"content-type", answer.content_type.encode()), (b"content-length", str(len(answer.body)).encode()),
               *((name.lower().encode(), value.encode()) for name, value in answer_headers(answer).items()), *extra]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})


def scope_headers(scope) -> dict[bytes, bytes]:
    """The request's headers by lower-case name (ASGI gives them lower-cased)."""
    return dict(scope["headers"])
