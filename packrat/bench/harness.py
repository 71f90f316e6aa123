"""The processes and threads a measurement runs: command lines, pinned children, workers across rounds,
threads that tick, pool requests. No torch at import time: a command that only formats stays light."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from packrat.settings import COMPILE_CACHE_ENV


def doc_parser(doc: str, examples: str = "") -> argparse.ArgumentParser:
    """A parser whose help is `doc`: its first paragraph before the options, the rest and `examples` after."""
    description, _, rest = doc.strip().partition("\n\n")
    epilog = "\n\n".join(part for part in (rest, examples) if part) or None
    return argparse.ArgumentParser(description=description, epilog=epilog,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def local_topology(threads: int | None, flag: str = "--threads"):
    """This process's cores as a Topology, or its first `threads` of them (`flag` gave that number)."""
    from packrat.machine.topology import detect

    topology = detect()
    if threads is None:
        return topology
    if threads > topology.num_cores:
        raise SystemExit(f"{flag} {threads}: this process may use only {topology.num_cores} cores")
    return detect(set(topology.cores[:threads]))


def first_cores(count: int) -> list[int]:
    """The first `count` of the cores this process may run on."""
    return sorted(os.sched_getaffinity(0))[:count]


def pin(cores: Sequence[int]) -> None:
    """This process on `cores`, torch with a thread per core and one inter-op: a timed child's first step."""
    os.sched_setaffinity(0, cores)
    import torch

    torch.set_num_threads(len(cores))
    torch.set_num_interop_threads(1)


def fresh_compile_caches(scratch: Path) -> dict[str, str]:
    """An environment with the compile caches in `scratch`: the first child compiles cold, the others load it."""
    return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
            COMPILE_CACHE_ENV.name: str(scratch / "compiled")}


def child_json(command: Sequence[str], *, marker: str = "", **run) -> dict:
    """The JSON on a child's last stdout line starting with `marker` (libraries print there too); {"error":
    why} when it fails, prints none or outlasts `timeout` (`run` goes to subprocess.run)."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, check=False, **run)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {run.get('timeout')} s"}
    found = [line[len(marker):] for line in done.stdout.splitlines() if line.startswith(marker) and line.strip()]
    if done.returncode == 0 and found:
        return json.loads(found[-1])
    tail = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["?"])[-1]
    return {"error": f"exit {done.returncode}: {tail[:300]}"}


class Worker:
    """A process that keeps its model across requests: serve(connection, *args) runs in it with `env`,
    answering each request on `connection` until it closes."""

    def __init__(self, serve: Callable, *args, env: dict | None = None):
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # a fresh interpreter: pinned before torch loads
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=_served, args=(serve, theirs, env or {}, args), name="packrat-worker")
        self.process.start()
        theirs.close()

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def ask(self, request, timeout: float | None = None):
        """The answer to `request`; {"error": why} when the process ends, or is killed past `timeout` s."""
        try:
            self.connection.send(request)
            if self.connection.poll(timeout):
                return self.connection.recv()
        except (EOFError, OSError):
            self.process.join()
            return {"error": f"its process ended (exit code {self.process.exitcode})"}
        self.close(0)
        return {"error": f"timed out after {timeout} s"}

    def close(self, grace_s: float = 30.0) -> None:
        """The connection closed (the process ends when it reads no more), killed past `grace_s`."""
        self.connection.close()
        self.process.join(grace_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _served(serve: Callable, connection, env: dict, args: tuple) -> None:
    os.environ.update(env)
    serve(connection, *args)


MEMORY_RESERVE_MIB = 2048  # left free while pools and sessions start: the OS, the engine, the timed calls' buffers


def available_mib() -> float:
    import psutil

    return psutil.virtual_memory().available / 2 ** 20


def log(message: str) -> None:
    """A timed progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def raise_open_files() -> int:
    """The open-file limit, raised to the hard one for the children (an open-loop user holds a connection)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def error_text(exc: BaseException) -> str:
    """An exception in one line, with its type: what a benchmark reports for a failed step."""
    from packrat.errors import first_line

    return f"{type(exc).__name__}: {first_line(exc)}"


def pool_requests(spec, batch: int, v2: bool = False) -> list:
    """The spec's example batch as `batch` pool requests (Request.as_received): raw tensors, or v2
    JSON (several inputs, or `v2`)."""
    from packrat.codec.forms import sample_request
    from packrat.serving.pool.api import Request

    return [Request.as_received(*sample_request(spec.inputs, sample, v2)) for sample in zip(*spec.example_inputs(batch))]


def bounded(fn: Callable[[], object], timeout_s: float, default=None):
    """fn()'s result, or `default` when it raises or outlasts timeout_s (left running in a daemon thread)."""
    box: list = []

    def call() -> None:
        try:
            box.append(fn())
        except Exception:  # noqa: BLE001 - any failure means "no answer"
            pass

    thread = threading.Thread(target=call, daemon=True, name="chaos-bounded")
    thread.start()
    thread.join(timeout_s)
    return box[0] if box else default


def wait_until(check: Callable[[], object], timeout_s: float, poll_s: float = 0.25) -> bool:
    """Poll check() every poll_s until it holds (True) or timeout_s has passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


class Periodic:
    """In a with block, calls tick() every `every_s` s in a daemon thread (first at once with `at_once`)."""

    def __init__(self, every_s: float, name: str, tick: Callable[[], object] | None = None, at_once: bool = False):
        self.every_s, self.at_once = every_s, at_once
        if tick is not None:
            self.tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        if self.at_once:
            self.tick()
        while not self._stop.wait(self.every_s):
            self.tick()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
