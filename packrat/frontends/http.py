"""What the HTTP front ends share (the Ray Serve ingress, the KServe server's REST routes): a request
body read within its limits (its size, its request's deadline, and the bytes every body being read
holds together) and whole (one cut short is refused), an Answer's headers, and the rest of a body
read before an early answer goes out. The Ray ingress speaks Starlette; the KServe server's
inference paths raw ASGI; both read bodies as raw ASGI."""

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
# What the bodies being read in one process may hold together: slow or stalled uploads past it are
# refused 503, where without it each connection could hold its max_body_bytes (16 MiB) for as long as it likes.
BODIES_IN_FLIGHT_BYTES = 256 * 2**20
UNBOUNDED = float("inf")
SWEEP_S = 0.1  # how often the bodies being read are checked against their deadlines
BUDGET_RETRY_AFTER_S = 1  # bodies being read finish or pass their deadline; a retry a second later finds room
HEADERS_S = 20.0  # a request's line and headers must all come within this (nginx's client_header_timeout: 60 s)


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
    the answer's latency. A body the route read already costs nothing more; a 408 (the body past its
    deadline) closes the connection instead."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not _has_body(scope):
            return await self.app(scope, receive, send)
        body_done, closing = False, False

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
            nonlocal closing
            closing = closing or (message["type"] == "http.response.start" and message["status"] == 408)
            if message["type"] == "http.response.body" and not message.get("more_body", False) \
                    and not (body_done or closing):
                await _linger(next_chunk)
            await send(message)

        await self.app(scope, receive_tracked, send_after_body)


class BoundedBody:
    """ASGI middleware for routes that read bodies with no bound of their own (KServe's app): the
    body read whole first, within `limit` bytes, by `timeout_s` after it began and within what
    `reads` lets bodies hold together (asgi_body, and refused as it refuses), then handed to the
    app as one message."""

    def __init__(self, app, limit: int, timeout_s: float, reads: "BodyReads | None" = None):
        self.app, self.limit, self.timeout_s, self.reads = app, limit, timeout_s, reads

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not _has_body(scope):
            return await self.app(scope, receive, send)
        try:
            body = await asgi_body(scope, receive, self.limit, time.monotonic() + self.timeout_s, self.reads)
        except BodyRefused as refused:
            return await send_answer(send, refused.answer())
        given = False

        async def replay():
            nonlocal given
            if given:
                return await receive()  # the disconnect, when it comes
            given = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


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
    if answer.status == 408:  # a body still arriving at its deadline: the server closes (RFC 9110, 15.5.9)
        headers["Connection"] = "close"
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


class BodyRefused(RequestError):
    """A body not read whole: over its size (413), cut short (400), still arriving at its request's
    deadline (408: the connection is closed), or over the bytes the bodies being read may hold (503)."""

    def __init__(self, status: int, reason: str, retry_after_s: int | None = None):
        super().__init__(status, reason)
        self.retry_after_s = retry_after_s

    def answer(self) -> Answer:
        return Answer.error(self.status, self.reason, self.retry_after_s)


class BodyReads:
    """The bodies being read on one event loop: the bytes they hold together, within `cap`, and each
    read's deadline, looked at every `sweep_s` while any is under way: a read past its deadline is
    cancelled where it waits for bytes. One timer for them all (asyncio.timeout, a timer per read,
    cost 10 us a request here). Its users run on the loop's one thread, so no lock."""

    def __init__(self, cap: float = BODIES_IN_FLIGHT_BYTES, sweep_s: float = SWEEP_S):
        self.cap, self.held, self.sweep_s = cap, 0, sweep_s
        self.deadlines: dict[asyncio.Task, float] = {}
        self.expired: set[asyncio.Task] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop = None

    def take(self, size: int) -> bool:
        """Whether `size` more bytes fit; taken if so."""
        if self.held + size > self.cap:
            return False
        self.held += size
        return True

    def give_back(self, size: int) -> None:
        self.held -= size

    def watch(self, deadline: float) -> asyncio.Task:
        """The current task reads a body until `deadline` (time.monotonic()); the task."""
        task, loop = asyncio.current_task(), asyncio.get_running_loop()
        self.deadlines[task] = deadline
        if self._timer is None or self._loop is not loop:
            self._loop, self._timer = loop, loop.call_later(self.sweep_s, self._sweep)
        return task

    def unwatch(self, task: asyncio.Task) -> bool:
        """The task's read is over; whether its deadline cancelled it."""
        self.deadlines.pop(task, None)
        if task not in self.expired:
            return False
        self.expired.discard(task)
        return True

    def _sweep(self) -> None:
        now, self._timer = time.monotonic(), None
        for task, deadline in list(self.deadlines.items()):
            if deadline <= now:
                del self.deadlines[task]
                self.expired.add(task)
                task.cancel()
        if self.deadlines:
            self._timer = self._loop.call_later(self.sweep_s, self._sweep)


async def asgi_body(scope, receive, limit: int, deadline: float | None = None,
                    reads: BodyReads | None = None) -> bytearray:
    """The body from ASGI messages, read by `deadline` (time.monotonic()) and within what `reads`
    lets the bodies being read hold. Refused (BodyRefused): over `limit` bytes, 413 (the rest read
    and dropped within the linger bounds, so the client reads it); cut short (the client gone before
    its end, or fewer bytes than its Content-Length), 400, never served as if whole; still arriving
    at `deadline`, 408; past what `reads` lets them hold, 503 before more of it is read."""
    reads = reads or BodyReads(UNBOUNDED)
    kept: list[bytes] = []
    task = reads.watch(UNBOUNDED if deadline is None else deadline)
    try:
        size, more = await _read_into(kept, receive, limit, reads)
    except asyncio.CancelledError:
        if not reads.unwatch(task):
            raise
        getattr(task, "uncancel", lambda: None)()  # ours, not the server's: the task goes on (Python 3.11+ counts)
        raise BodyRefused(408, f"request body still arriving at its deadline ({sum(map(len, kept))} bytes "
                               f"read): the connection is closed") from None
    finally:
        reads.unwatch(task)
        reads.give_back(sum(map(len, kept)))
    if size > limit:
        if more:
            await linger(receive)
        raise BodyRefused(413, f"request body over {limit} bytes")
    declared = _content_length(scope)
    if declared is not None and size != declared:
        raise BodyRefused(400, f"request body cut short: {size} of the {declared} bytes its Content-Length says")
    return bytearray().join(kept)  # the server's own buffer: a tensor may read its values where they lie


async def _read_into(kept: list[bytes], receive, limit: int, reads: BodyReads) -> tuple[int, bool]:
    """Append the body's chunks to `kept`, each taken from `reads` (the caller gives them back),
    until its end or past `limit`: (the bytes seen, whether more is coming)."""
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # http.disconnect
            raise BodyRefused(400, f"request body cut short: the connection closed after {size} bytes")
        chunk, more = message.get("body", b""), message.get("more_body", False)
        size += len(chunk)
        if size > limit:
            return size, more
        if not reads.take(len(chunk)):
            raise BodyRefused(503, f"the request bodies being read hold {reads.held} bytes, the server's "
                                   f"limit ({reads.cap}); try again later", BUDGET_RETRY_AFTER_S)
        kept.append(chunk)
        if not more:
            return size, more


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


def header_deadline_protocol():
    """uvicorn's httptools protocol whose requests' headers have a deadline: a connection that has
    not sent a whole request line and headers HEADERS_S after it opened (or after the first byte of
    its next request) is closed. uvicorn bounds their size, not their time: a client sending them a
    byte at a time held its connection, one of the server's limited ones, for as long as it liked."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class HeaderDeadline(HttpToolsProtocol):
        _headers_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._headers_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # a next request on a kept-alive connection: its headers get the same time
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._headers_timer = self.loop.call_later(HEADERS_S, self._late)

        def _disarm(self) -> None:
            if self._headers_timer is not None:
                self._headers_timer.cancel()
                self._headers_timer = None

        def _late(self) -> None:
            self._headers_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return HeaderDeadline
