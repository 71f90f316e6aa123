"""A light closed-loop HTTP load (`packrat bench http --ceiling`): kept-alive connections sending the
same pre-built bytes on asyncio, reading only status and length, so one client process outruns the
front end it loads. Answers count inside a common window, the server's CPU read at its edges."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

HEADER_END = b"\r\n\r\n"


@dataclass(frozen=True)
class LoadSpec:
    """One client process's part: `connections` sending `request` (whole HTTP) in a closed loop from `start_at`
    (monotonic), answers counted in its window, `warmup_s` later for `seconds`; on `cores` if given."""

    host: str
    port: int
    request: bytes
    connections: int
    start_at: float
    warmup_s: float
    seconds: float
    cores: tuple[int, ...] | None = None

    @property
    def window(self) -> tuple[float, float]:
        begin = self.start_at + self.warmup_s
        return begin, begin + self.seconds


def http_request(host: str, port: int, path: str, body: bytes, content_type: str,
                 header_length: int | None = None) -> bytes:
    """A kept-alive POST of `body`, as tritonclient sends a binary v2 request."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}"]
    if header_length is not None:
        lines.append(f"Inference-Header-Content-Length: {header_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def answer_length(head: bytes) -> int:
    """The length of an answer's body from its header block (0 without a Content-Length)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


class Counts:
    """What one client process saw in the window: answers by status, and their latencies."""

    def __init__(self, window: tuple[float, float]):
        self.window = window
        self.statuses: dict[int, int] = {}
        self.latencies_ms: list[float] = []
        self.errors = 0

    def answered(self, status: int, sent_at: float, now: float) -> None:
        if self.window[0] <= now < self.window[1]:
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self.latencies_ms.append((now - sent_at) * 1e3)


class Connection(asyncio.Protocol):
    """One kept-alive connection in a closed loop: a request, its whole answer, the next request."""

    def __init__(self, request: bytes, counts: Counts, done: asyncio.Future):
        self.request, self.counts, self.done = request, counts, done
        self.buffer, self.sent_at, self.transport = bytearray(), 0.0, None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.send()

    def send(self) -> None:
        self.sent_at = time.monotonic()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(HEADER_END)
        if end < 0:
            return
        size = end + len(HEADER_END) + answer_length(bytes(self.buffer[:end]))
        if len(self.buffer) < size:
            return
        now = time.monotonic()
        self.counts.answered(int(self.buffer[9:12]), self.sent_at, now)
        del self.buffer[:size]
        if now < self.counts.window[1]:
            self.send()
        else:
            self.transport.close()

    def connection_lost(self, exc) -> None:
        if time.monotonic() < self.counts.window[1]:
            self.counts.errors += 1  # the server closed it early: counted, not reopened
        if not self.done.done():
            self.done.set_result(None)


async def _load(spec: LoadSpec) -> Counts:
    loop = asyncio.get_running_loop()
    counts = Counts(spec.window)
    await asyncio.sleep(max(0.0, spec.start_at - time.monotonic()))
    done = [loop.create_future() for _ in range(spec.connections)]
    for future in done:
        try:
            await loop.create_connection(lambda f=future: Connection(spec.request, counts, f), spec.host, spec.port)
        except OSError:
            counts.errors += 1
            future.set_result(None)
    await asyncio.wait_for(asyncio.gather(*done), timeout=spec.window[1] - time.monotonic() + 30)
    return counts


def run_client(spec: LoadSpec) -> dict:
    """One client process's load (run it in a process of its own): {"statuses", "latencies_ms", "errors"}."""
    if spec.cores:
        os.sched_setaffinity(0, spec.cores)
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    counts = runner(_load(spec))
    return {"statuses": counts.statuses, "latencies_ms": counts.latencies_ms, "errors": counts.errors}


def merged(results: Sequence[dict]) -> dict:
    """The clients' counts together: answers (200), failed (another status, a connection lost), latencies."""
    statuses: dict[int, int] = {}
    for result in results:
        for status, count in result["statuses"].items():
            statuses[int(status)] = statuses.get(int(status), 0) + count
    return {"answers": statuses.get(200, 0), "failed": sum(n for s, n in statuses.items() if s != 200)
            + sum(r["errors"] for r in results),
            "latencies_ms": sorted(x for r in results for x in r["latencies_ms"])}
