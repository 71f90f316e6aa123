"""What the measurements share beyond rounds, the clock and pools answering (rounds.py, pool.py):
command lines, child processes, pool requests, markdown output. Nothing here imports torch at
import time: a command that only formats figures stays light."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from packrat.settings import COMPILE_CACHE_ENV


def doc_parser(doc: str, examples: str = "") -> argparse.ArgumentParser:
    """A parser whose help is the benchmark's docstring: its first paragraph as the description,
    the rest (then `examples`) after the options, line breaks kept."""
    description, _, rest = doc.strip().partition("\n\n")
    epilog = "\n\n".join(part for part in (rest, examples) if part) or None
    return argparse.ArgumentParser(description=description, epilog=epilog,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def positional_args(doc: str, *arguments: tuple[str, Callable, object]) -> list:
    """The values of a script that takes its arguments by position only, each optional:
    (name, type, default) per argument, in order. --help prints the docstring."""
    parser = doc_parser(doc)
    for name, kind, default in arguments:
        parser.add_argument(name, nargs="?", type=kind, default=default)
    parsed = parser.parse_args()
    return [getattr(parsed, name) for name, _, _ in arguments]


def local_topology(threads: int | None):
    """This process's cores as a Topology, or its first `threads` of them."""
    from packrat.machine.topology import detect

    topology = detect()
    if threads is None:
        return topology
    if threads > topology.num_cores:
        raise SystemExit(f"--threads {threads}: this process may use only {topology.num_cores} cores")
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


def child_json(command: Sequence[str], *, marker: str = "", check: bool = False, **run) -> dict:
    """Run a child process; its result is the JSON on its last stdout line that starts with
    `marker` (libraries print there too). When it fails, times out (`timeout`, passed on with
    the other keywords to subprocess.run) or prints no result: {"error": why}, or with `check`
    a RuntimeError."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, check=False, **run)
    except subprocess.TimeoutExpired:
        result = {"error": f"timed out after {run.get('timeout')} s"}
    else:
        found = [line[len(marker):] for line in done.stdout.splitlines() if line.startswith(marker) and line.strip()]
        if done.returncode == 0 and found:
            return json.loads(found[-1])
        tail = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["?"])[-1]
        result = {"error": f"exit {done.returncode}: {tail[:300]}"}
    if check:
        raise RuntimeError(result["error"])
    return result


class Worker:
    """A child process that lives across requests (its model loaded once, then asked again and
    again): a JSON line each way, its answers the stdout lines that start with `marker` (libraries
    print there too), its stderr kept in `log` for the line that explains a death."""

    def __init__(self, command: Sequence[str], *, marker: str, log: Path, env: dict | None = None):
        self.marker, self.log, self.answers = marker, Path(log), queue.Queue()
        with open(self.log, "w") as err:
            self.process = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=err, text=True, env=env)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.startswith(self.marker):
                self.answers.put(line[len(self.marker):])
        self.answers.put(None)  # end of output: the process has ended

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def ask(self, request: dict, timeout: float | None = None) -> dict:
        """The answer to `request`; {"error": why} when the process ends, or is killed past `timeout` s."""
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.answers.get(timeout=timeout)
        except OSError:  # its stdin closed: it has ended
            line = None
        except queue.Empty:
            self.process.kill()
            self.process.wait()
            return {"error": f"timed out after {timeout} s"}
        if line is None:
            tail = (self.log.read_text().strip().splitlines() or ["?"])[-1]
            return {"error": f"exit {self.process.wait()}: {tail[:300]}"}
        return json.loads(line)

    def close(self, grace_s: float = 30.0) -> None:
        """Its stdin closed (it ends when it reads no more), killed when it outlives `grace_s`."""
        if self.process.stdin and not self.process.stdin.closed:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


MEMORY_RESERVE_MIB = 2048  # left free while pools and sessions start: the OS, the engine, the timed calls' buffers


def available_mib() -> float:
    import psutil

    return psutil.virtual_memory().available / 2 ** 20


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


def fmt_num(value: float | None, digits: int = 1) -> str:
    """`value` with `digits` decimals; "-" for None, NaN or infinity."""
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def markdown_row(cells: Iterable) -> str:
    """One row of a markdown table; cells are str()-ed, pipes escaped, line breaks made spaces."""
    return "| " + " | ".join(str(cell).replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"


def markdown_head(header: Sequence) -> str:
    """A markdown table's header row and the line under it."""
    return markdown_row(header) + "\n" + "|---" * len(header) + "|"


def markdown_table(header: Sequence, rows: Iterable[Sequence]) -> str:
    return "\n".join([markdown_head(header)] + [markdown_row(row) for row in rows])
