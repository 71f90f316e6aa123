"""What the HTTP front ends share (the Ray Serve ingress, the KServe server's REST routes): a request
body read within its limit, and an Answer as a Starlette response. Both speak Starlette."""

from __future__ import annotations

from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from packrat.codec.oip import HEADER
from packrat.serving.pool.api import Answer, Request


async def limited_body(request: HttpRequest, limit: int) -> bytes | None:
    """The body; None when it is over `limit` bytes. An oversized body is still read to its end,
    keeping none of it past the limit: refusing it unread resets the connection, and the client
    would never see the 413."""
    kept, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            kept.append(chunk)
    return b"".join(kept) if size <= limit else None


def engine_request(body: bytes, request: HttpRequest) -> Request:
    """The body as the engine takes it, with the headers that say how to read it."""
    return Request(body, request.headers.get("content-type"), request.headers.get(HEADER))


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
