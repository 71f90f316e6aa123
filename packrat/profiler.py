"""Offline profiler: measures L(t, b) over a grid, each point in a fresh pinned process.

Each point is measured alone (the isolated figure) and, with contention on, again
while ⌊T/t⌋ copies of it run side by side on disjoint cores, as a homogeneous plan
of that point runs them (the loaded figure, the profile's latency_ms).

Points are appended to the profile file as they finish, so Ctrl-C leaves a valid
file and a later run with the same arguments measures only what is missing.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from . import profile as profile_io
from .measure import summarize
from .topology import Topology, detect

# Whether `packrat profile` measures loaded figures unless told otherwise. Loaded figures are
# expected to predict plans better than isolated ones; the oracle benchmark decides, here only.
DEFAULT_CONTENTION = True
# The loaded measurement's handshake: each phase (load and warm up, timed runs, stopping) may
# take this many times the whole isolated measurement of the point, and never less than the floor.
LOADED_TIMEOUT_FACTOR = 10.0
LOADED_TIMEOUT_FLOOR_S = 60.0
_LATENCY_FLAG = {"loaded": "--contention", "isolated": "--isolated"}  # `packrat profile`'s flags, for hints


class ProfilingError(RuntimeError):
    """A measurement process failed; the message says which point and why."""


@dataclass(frozen=True)
class Settings:
    model: str
    warmup: int = 10
    iters: int | None = 100
    min_time: float | None = None
    graph_mode: bool = True
    input_shape: tuple[int, ...] | None = None
    ios_cache: str | None = None  # profile IOS-compiled instances; schedules cached here
    contention: bool = DEFAULT_CONTENTION  # also measure each point loaded by copies of itself


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def metadata(settings: Settings, topology: Topology) -> dict[str, str]:
    import torch

    from .models import resolve

    spec = resolve(settings.model, settings.input_shape)
    return {
        "model": settings.model,
        "mode": "ios" if settings.ios_cache else ("script" if settings.graph_mode and spec.scriptable else "eager"),
        "torch": torch.__version__,
        "cpu": cpu_model(),
        "latency": "loaded" if settings.contention else "isolated",
        "cores": str(topology.num_cores),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def _command(settings: Settings, threads: int, batch: int, cores: list[int]) -> tuple[list[str], dict | None]:
    """The packrat.measure command line for a point pinned to `cores`, and its environment."""
    cmd = [sys.executable, "-m", "packrat.measure", "--model", settings.model,
           "--threads", str(threads), "--batch", str(batch), "--cores", ",".join(map(str, cores)),
           "--warmup", str(settings.warmup)]
    if settings.iters is not None:
        cmd += ["--iters", str(settings.iters)]
    if settings.min_time is not None:
        cmd += ["--min-time", str(settings.min_time)]
    if settings.input_shape:
        cmd += ["--input-shape", ",".join(map(str, settings.input_shape))]
    if not settings.graph_mode:
        cmd.append("--eager")
    if not settings.ios_cache:
        return cmd, None
    from ios_scheduler.runtime import openmp_env

    return cmd + ["--ios-cache", str(settings.ios_cache)], openmp_env()


def _last_line(text: str, fallback: str) -> str:
    return (text.strip().splitlines() or [fallback])[-1]


def measure_point(settings: Settings, threads: int, batch: int, cores: list[int]) -> dict:
    """Run packrat.measure in a fresh process pinned to `cores`; return its statistics."""
    cmd, env = _command(settings, threads, batch, cores)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        reason = _last_line(done.stderr, f"exit status {done.returncode}")
        raise ProfilingError(f"measuring threads={threads} batch={batch} failed: {reason}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def copies_for(threads: int, topology: Topology) -> int:
    """How many copies of a t-thread point a homogeneous plan runs side by side: ⌊T/t⌋."""
    return topology.num_cores // threads


class _CopyFailed(Exception):
    """One copy of a loaded measurement failed; the message is the reason."""


class _Copy:
    """One `packrat.measure --loaded` process: its stdout read line by line with a deadline,
    its stderr kept in a file (so it never blocks on a full pipe) for the failure reason."""

    def __init__(self, cmd: list[str], env: dict | None):
        self._stderr = tempfile.TemporaryFile()
        self._buffer = b""
        self.proc = subprocess.Popen(cmd + ["--loaded"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, env=env)

    def _reason(self) -> str:
        try:
            code = self.proc.wait(timeout=5)  # its stdout closed: it is exiting
        except subprocess.TimeoutExpired:
            return "a copy closed its output but kept running"
        self._stderr.seek(0)
        return _last_line(self._stderr.read().decode(errors="replace"), f"exit status {code}")

    def read_line(self, deadline: float, what: str) -> str:
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise _CopyFailed(f"a copy was not {what}")
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                raise _CopyFailed(self._reason())
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace").strip()

    def expect(self, deadline: float, what: str, is_it) -> str:
        """The first line for which is_it(line) holds; earlier lines (a library's chatter) are skipped."""
        while True:
            line = self.read_line(deadline, what)
            if is_it(line):
                return line

    def send_go(self) -> None:
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.flush()
        except OSError:
            raise _CopyFailed(self._reason()) from None

    def stop(self, grace: float) -> None:
        """Close stdin (the copy then exits after its current run); kill it if it takes over `grace` s."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass  # already gone
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self._stderr.close()


def measure_loaded(settings: Settings, threads: int, batch: int, core_sets: list[list[int]],
                   timeout: float = LOADED_TIMEOUT_FLOOR_S) -> dict:
    """One copy of the point per core set, all timed at once, each loaded by the others.

    Each copy loads and warms up, says ready, starts timing on the shared go, reports, and keeps
    running until all have reported. latency_ms is the mean of the copies' means; the other
    statistics pool every copy's samples. Each phase may take `timeout` s; on any failure every
    copy is killed and ProfilingError names the point and the reason."""
    copies: list[_Copy] = []
    ok = False
    try:
        for cores in core_sets:
            copies.append(_Copy(*_command(settings, threads, batch, cores)))
        deadline = time.monotonic() + timeout
        for copy in copies:
            copy.expect(deadline, f"ready within {timeout:g} s", lambda line: line == "ready")
        for copy in copies:  # all at once: every copy's timed window starts with the others running
            copy.send_go()
        deadline = time.monotonic() + timeout
        lines = [copy.expect(deadline, f"done within {timeout:g} s of go", lambda line: line.startswith("{"))
                 for copy in copies]
        results = [json.loads(line) for line in lines]
        ok = True
    except (_CopyFailed, ValueError) as exc:  # ValueError: a result line that is not JSON
        raise ProfilingError(f"measuring threads={threads} batch={batch} under load "
                             f"({len(core_sets)} copies) failed: {exc}") from None
    finally:
        for copy in copies:
            copy.stop(timeout if ok else 0)  # on failure (or Ctrl-C) no copy is left running
    return _combine(results)


def _combine(results: list[dict]) -> dict:
    """One loaded figure from the copies' results (see measure_loaded)."""
    pooled = summarize([sample for r in results for sample in r["samples_ms"]])
    return {**pooled, "latency_ms": statistics.fmean(r["latency_ms"] for r in results),
            "mode": results[0]["mode"], "copy_cores": [r["cores"] for r in results]}


def measure(settings: Settings, threads: int, batch: int, topology: Topology) -> dict:
    """One profile row for ⟨threads, batch⟩: measured alone and, with settings.contention and room
    for more than one copy, loaded by ⌊T/t⌋ copies; latency_ms is then the loaded figure."""
    started = time.monotonic()
    isolated = measure_point(settings, threads, batch, topology.cores_for(threads))
    row = {"threads": threads, "batch": batch, **isolated, "isolated_ms": isolated["latency_ms"], "copies": 1}
    copies = copies_for(threads, topology) if settings.contention else 1
    if copies > 1:
        timeout = max(LOADED_TIMEOUT_FLOOR_S, LOADED_TIMEOUT_FACTOR * (time.monotonic() - started))
        loaded = measure_loaded(settings, threads, batch, topology.assign([threads] * copies), timeout)
        row.update(loaded, copies=copies)
    return row


def measurements(settings: Settings, threads: int, topology: Topology) -> int:
    """Timed measurements a point with `threads` takes: 2 when it is also measured loaded, else 1.
    (The copies of a loaded measurement run at once, so they take about one measurement's time.)"""
    return 2 if settings.contention and copies_for(threads, topology) > 1 else 1


def _cost(settings: Settings, threads: int, batch: int, topology: Topology) -> float:
    """A point's expected share of the run, for the progress bar: time per run grows ∝ b / t."""
    return batch / threads * measurements(settings, threads, topology)


def _existing(out: Path, meta: dict[str, str]) -> set[tuple[int, int]]:
    """Points already measured in `out`, which must be of the same model, mode and latency kind."""
    if not out.exists() or out.stat().st_size == 0:
        return set()
    existing = profile_io.load(out)
    found = {**existing.metadata, "latency": "loaded" if existing.loaded else "isolated"}  # older files: isolated
    for key in ("model", "mode", "latency"):
        if found.get(key, meta[key]) != meta[key]:
            hint = f" (or resume it with {_LATENCY_FLAG[found[key]]})" if key == "latency" else ""
            raise profile_io.ProfileError(f"{out}: holds a profile with {key} {found[key]!r}, "
                                          f"not {meta[key]!r}; choose another --out{hint}")
    return set(existing.latency)


def run(settings: Settings, threads: list[int], batches: list[int], out: str | Path,
        topology: Topology | None = None, progress: bool = True) -> profile_io.Profile:
    """Measure every missing ⟨t, b⟩ of the grid into `out`; return the whole profile."""
    out = Path(out)
    topology = topology or detect()
    too_many = [t for t in threads if t > topology.num_cores]
    if too_many:
        raise ValueError(f"--threads: {max(too_many)} exceeds the {topology.num_cores} cores this process may use")
    meta = metadata(settings, topology)
    done = _existing(out, meta)
    todo = [(t, b) for t in sorted(threads) for b in sorted(batches) if (t, b) not in done]
    # Progress is weighted by expected cost so the time-left estimate is useful.
    costs = {(t, b): _cost(settings, t, b, topology) for t, b in todo}
    bar = tqdm(total=sum(costs.values()), disable=not progress or not todo, unit="",
               bar_format="{desc} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
    with bar, profile_io.ProfileWriter(out, meta) as writer:
        for index, (t, b) in enumerate(todo, start=1):
            bar.set_description(f"point {index}/{len(todo)}: threads={t} batch={b}")
            writer.write(measure(settings, t, b, topology))  # columns outside the CSV are dropped
            bar.update(costs[t, b])
    return profile_io.load(out)
