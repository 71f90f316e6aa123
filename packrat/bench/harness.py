"""The processes and threads a measurement runs: command lines, pinned child processes, workers
that live across rounds, threads that tick, the memory left, pool requests. Nothing here imports
torch at import time: a command that only formats figures stays light."""

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
    """A parser whose help is the benchmark's docstring: its first paragraph as the description,
    the rest (then `examples`) after the options, line breaks kept."""
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
    """This process on `cores`, torch with a thread per core and one inter-op thread: what a
    timed child does first, before torch runs anything."""
    os.sched_setaffinity(0, cores)
    import torch

    torch.set_num_threads(len(cores))
    torch.set_num_interop_threads(1)


def fresh_compile_caches(scratch: Path) -> dict[str, str]:
    """This process's environment with inductor's and packrat's compile caches in `scratch`, for
    the children: the first to compile does it cold, the later ones load what it built."""
    return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
            COMPILE_CACHE_ENV.name: str(scratch / "compiled")}


def child_json(command: Sequence[str], *, marker: str = "", **run) -> dict:
    """Run a child process; its result is the JSON on its last stdout line that starts with
    `marker` (libraries print there too). When it fails, times out (`timeout`, passed on with
    the other keywords to subprocess.run) or prints no result: {"error": why}."""
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
    """A process that lives across requests (its model loaded once, then asked again and again):
    serve(connection, *args) runs in it, with `env` in its environment, answering each request it
    receives on `connection` with one answer, until the connection closes."""

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
    """This process's open-file limit raised to its hard limit (the server and locust inherit it:
    each open-loop user holds a connection); the limit now."""
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
    """The zoo spec's example batch as `batch` pool requests, one per sample, as a client sends
    them (raw tensor bytes for one input, a KServe v2 JSON body for several, or always with `v2`)."""
    from packrat.codec.forms import sample_request
    from packrat.serving.pool.api import Request

    return [Request(*sample_request(spec.inputs, sample, v2)) for sample in zip(*spec.example_inputs(batch))]


def bounded(fn: Callable[[], object], timeout_s: float, default=None):
    """fn()'s result, or `default` when it raises or takes longer than timeout_s (it then runs on in
    a daemon thread, its result dropped)."""
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
    """While active (a with block), calls self.tick() (or `tick`, given) every `every_s` seconds in
    a daemon thread; with `at_once`, first as it starts."""

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
