"""Slow clients against the KServe server (issue 71): --connections connections that each declare a
body and send it a byte a second, for --seconds, while one good closed-loop user sends whole binary
v2 requests of the tiny model.

The server runs the tiny model with a deadline of --deadline-s (its request_timeout_s): a body still
arriving then is answered 408 and its connection closed; the slow client then connects again, so
--connections trickle all along. Reported: the good user's p50 before the slow clients and during
them, the server process's PSS before and its peak during, and for every slow connection how long
after it connected the server answered or closed it (the deadline plus the sweep's 0.1 s at most,
where the server keeps up). The slow clients run in a process of their own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from packrat.bench.harness import doc_parser

EXAMPLES = "example:\n  python benchmarks/slow_clients.py --connections 300 --seconds 60 --deadline-s 20"
PROFILE = "# model: tiny\n# mode: script\nthreads,batch,latency_ms\n" + "".join(
    f"{t},{b},{b * 2.0 / t ** 0.5}\n" for t in (1, 2) for b in (1, 2, 4))
DECLARED = 100_000  # the body each slow client declares: never all sent at a byte a second


def parse_args(argv=None):
    p = doc_parser(__doc__, EXAMPLES)
    p.add_argument("--connections", type=int, default=300, help="slow connections at once (default: 300)")
    p.add_argument("--seconds", type=float, default=60, help="how long they trickle (default: 60)")
    p.add_argument("--deadline-s", type=float, default=20, help="the server's request_timeout_s (default: 20)")
    p.add_argument("--before-s", type=float, default=20, help="the good user alone first, after a warm-up (default: 20)")
    p.add_argument("--trickle", nargs=3, metavar=("PORT", "CONNECTIONS", "SECONDS"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---- the slow clients, in a process of their own --------------------------------------------------

async def trickle(port: int, until: float, cut: list) -> None:
    """Connect, declare a body, send a byte a second; each time the server answers or closes, note
    (seconds since connecting, its status line) and connect again, until `until`."""
    head = (f"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {DECLARED}\r\n\r\n").encode()
    while time.monotonic() < until:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        began = time.monotonic()
        writer.write(head)
        answered = asyncio.ensure_future(reader.read(4096))
        while time.monotonic() < until and not answered.done():
            writer.write(b"x")
            await asyncio.wait([answered], timeout=1.0)
        if answered.done():
            cut.append((time.monotonic() - began, answered.result().split(b"\r\n", 1)[0].decode(errors="replace")))
        answered.cancel()
        writer.close()


def trickle_main(port: int, connections: int, seconds: float) -> None:
    cut: list = []

    async def all_of_them():
        until = time.monotonic() + seconds
        await asyncio.gather(*(trickle(port, until, cut) for _ in range(connections)))

    asyncio.run(all_of_them())
    print(json.dumps(cut))


# ---- the server, the good user, the memory ------------------------------------------------------------

def start_server(root: Path, deadline_s: float):
    from packrat.deploy import archive, kserve
    from packrat.deploy.torchserve import free_port
    from packrat.settings import Settings

    (root / "tiny.csv").write_text(PROFILE)
    settings = Settings("tiny", profiles=(str(root / "tiny.csv"),), max_batch=4, request_timeout_s=deadline_s)
    mar = archive.build(settings, root / "store", name="tiny", max_batch_delay_ms=5)
    server = kserve.KServeServer(root / "run", ("tiny",), http_port=free_port(), grpc_port=None)
    return kserve.start(server, [mar], timeout=240)


class GoodUser(threading.Thread):
    """Whole binary v2 requests on a kept-alive connection: (ended at, seconds, status) each."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        import http.client

        import numpy as np

        from packrat.codec import oip

        x = np.random.default_rng(0).standard_normal((1, 3, 32, 32), dtype=np.float32)
        self.body, length = oip.request({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32"}]},
                                        [x.tobytes()])
        self.headers = {"Content-Type": "application/octet-stream", oip.HEADER: str(length)}
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.done, self.stopping = [], threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            self.conn.request("POST", "/v2/models/tiny/infer", body=self.body, headers=self.headers)
            response = self.conn.getresponse()
            response.read()
            self.done.append((time.monotonic(), time.monotonic() - started, response.status))

    def p50_ms(self, start: float, end: float) -> float:
        return 1e3 * statistics.median(s for at, s, _ in self.done if start <= at < end)


def pss(pid: int) -> int:
    import psutil

    return psutil.Process(pid).memory_full_info().pss


def cpu_s(pid: int) -> float:
    """The process's CPU time so far (user + system), its own threads' only (the instances are children)."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def measure(args) -> dict:
    from packrat.deploy import kserve

    with tempfile.TemporaryDirectory(prefix="packrat-slow-clients-") as tmp:
        server = start_server(Path(tmp), args.deadline_s)
        good = GoodUser(server.http_port)
        try:
            good.start()
            time.sleep(5)  # warm
            before_start, cpu_start = time.monotonic(), cpu_s(server.pid)
            time.sleep(args.before_s)
            before_end, memory_before, cpu_before = time.monotonic(), pss(server.pid), cpu_s(server.pid)
            slow = subprocess.Popen([sys.executable, __file__, "--trickle", str(server.http_port),
                                     str(args.connections), str(args.seconds)], stdout=subprocess.PIPE, text=True)
            peak = memory_before
            while slow.poll() is None:
                peak = max(peak, pss(server.pid))
                time.sleep(0.5)
            during_end, cpu_during = time.monotonic(), cpu_s(server.pid)
            cut = json.loads(slow.stdout.read())
            requests = [sum(start <= at < end for at, _, _ in good.done)
                        for start, end in ((before_start, before_end), (before_end, during_end))]
        finally:
            good.stopping.set()
            good.join(60)
            kserve.stop(server)
    after = [s for s, _ in cut]
    return {"connections": args.connections, "seconds": args.seconds, "deadline_s": args.deadline_s,
            "good_p50_before_ms": round(good.p50_ms(before_start, before_end), 2),
            "good_p50_during_ms": round(good.p50_ms(before_end, during_end), 2),
            "good_requests_not_200": sum(status != 200 for _, _, status in good.done),
            # the server process's CPU per good request answered, before and during: what the slow ones add
            "server_cpu_ms_per_good_request_before": round(1e3 * (cpu_before - cpu_start) / requests[0], 3),
            "server_cpu_ms_per_good_request_during": round(1e3 * (cpu_during - cpu_before) / requests[1], 3),
            "server_cores_before": round((cpu_before - cpu_start) / (before_end - before_start), 3),
            "server_cores_during": round((cpu_during - cpu_before) / (during_end - before_end), 3),
            "pss_before_mib": round(memory_before / 2**20, 1), "pss_peak_mib": round(peak / 2**20, 1),
            "slow_cut": len(cut), "slow_answers": sorted({line for _, line in cut}),
            "slow_cut_after_s": {"min": round(min(after), 2), "max": round(max(after), 2)} if after else None}


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.trickle:
        port, connections, seconds = args.trickle
        return trickle_main(int(port), int(connections), float(seconds))
    result = measure(args)
    result["p50_ratio"] = round(result["good_p50_during_ms"] / result["good_p50_before_ms"], 3)
    result["pss_growth_mib"] = round(result["pss_peak_mib"] - result["pss_before_mib"], 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
