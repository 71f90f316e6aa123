"""Measuring profile points: L(t, b) of one runtime in pinned processes (packrat/profiling/point.py).

Workers keeps one (runtime, threads)'s processes across points, started and loaded once (a process
start and load cost ~5 s a point before issue 62); loaded points run ⌊T/t⌋ copies in lockstep
rounds (docs/profiling.md, "Loaded or isolated"). measure() takes a point on fresh workers.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from packrat.errors import ProfilingError
from packrat.machine.topology import Topology
from packrat.models.modes import DEFAULT_MODE
from packrat.models.runtimes import DEFAULT_RUNTIME, instance_kind
from packrat.profiling.costs import DEFAULT_PRECISION, Costs
from packrat.profiling.point import budgeted, summarize, time_served

# Loaded by default: split plans served 16-35 % over isolated predictions (issue 32, docs/benchmarks/profiles.md).
DEFAULT_CONTENTION = True
COPY_TIMEOUT_S = 600.0  # each phase of a copy's handshake: loading a large model on a busy machine takes minutes

# `packrat profile`'s timing of a point: few runs, since the machine's drift over minutes, not their
# count, bounds what they tell, and served latencies correct the figures while a plan serves (issue 48).
DEFAULT_WARMUP = 3
DEFAULT_MIN_TIME_S = 1.0
DEFAULT_MAX_RUNS = 30


@dataclass(frozen=True)
class ProfileSettings:
    model: str
    warmup: int = 10
    iters: int | None = 100
    min_time: float | None = None
    graph_mode: str = DEFAULT_MODE  # packrat.models.modes.MODES
    input_shape: tuple[int, ...] | None = None
    ios_cache: str | None = None  # where the ios runtime's schedules are kept (None: runtimes.IOS_CACHE)
    contention: bool = DEFAULT_CONTENTION  # measure each point loaded by copies of itself where they fit
    isolated_too: bool = False  # with contention: measure every point alone as well (two measurements)
    runtime: str = DEFAULT_RUNTIME  # the runtime a point is measured under (run() sets it per runtime)
    served: bool = True  # measure each point's served figure too (decode + model + encode of a sub-batch)
    payload: str | None = None  # the bodies served points answer: jpeg, text, raw; None: the model's natural one
    max_runs: int | None = DEFAULT_MAX_RUNS  # with min_time: a point's timed runs end here if not before
    precision: float | None = DEFAULT_PRECISION  # with min_time: ... or once the mean is known this well

    @property
    def budget(self) -> tuple:
        """The timed runs' budget, as point.budgeted() takes it."""
        return self.iters, self.min_time, self.max_runs, self.precision

    @property
    def costs(self) -> Costs:
        """What measuring a point costs under these rules (costs.py), for the search and replays."""
        return Costs(warmup=self.warmup, min_time=self.min_time, max_runs=self.max_runs, iters=self.iters,
                     served=self.served, precision=self.precision)


def _command(settings: ProfileSettings, threads: int, batch: int | None, cores: list[int]
             ) -> tuple[list[str], dict | None]:
    """The packrat.profiling.point command line for a point pinned to `cores` (batch None: a --loaded
    process told its batches later), and its environment."""
    cmd = [sys.executable, "-m", "packrat.profiling.point", "--model", settings.model,
           "--threads", str(threads), "--cores", ",".join(map(str, cores)), "--warmup", str(settings.warmup)]
    for flag, value in (("--batch", batch), ("--iters", settings.iters), ("--min-time", settings.min_time),
                        ("--max-runs", settings.max_runs), ("--precision", settings.precision)):
        cmd += [flag, str(value)] if value is not None else []
    if settings.input_shape:
        cmd += ["--input-shape", ",".join(map(str, settings.input_shape))]
    cmd += ["--graph-mode", settings.graph_mode, "--runtime", settings.runtime]
    if settings.served:
        cmd += ["--payload", settings.payload or "natural"]
    if settings.runtime != "ios":
        return cmd, None
    from packrat.ios_scheduler.openmp import openmp_env

    return cmd + (["--ios-cache", str(settings.ios_cache)] if settings.ios_cache else []), openmp_env()


def _last_line(text: str, fallback: str) -> str:
    return (text.strip().splitlines() or [fallback])[-1]


def measure_point(settings: ProfileSettings, threads: int, batch: int, cores: list[int], *extra: str) -> dict:
    """Run packrat.profiling.point (with `extra` arguments) in a fresh process pinned to `cores`;
    return its statistics."""
    cmd, env = _command(settings, threads, batch, cores)
    done = subprocess.run(cmd + list(extra), capture_output=True, text=True, env=env)
    if done.returncode != 0:
        reason = _last_line(done.stderr, f"exit status {done.returncode}")
        raise ProfilingError(f"measuring threads={threads} batch={batch} failed: {reason}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def copies_for(settings: ProfileSettings, threads: int, topology: Topology) -> int:
    """How many copies of a t-thread point are measured side by side: with contention ⌊T/t⌋, as a
    homogeneous plan runs them; else one."""
    return topology.num_cores // threads if settings.contention else 1


class _CopyFailed(Exception):
    """One copy of a loaded measurement failed; the message is the reason."""


class _Copy:
    """One `packrat.profiling.point --loaded` process: its stdout read line by line with a deadline,
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

    def send_run(self, command: str = "run") -> None:
        """Send one line: `run` (the model once), `serve` (a served batch once), `batch N` (a new point)."""
        try:
            self.proc.stdin.write(command.encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            raise _CopyFailed(self._reason()) from None

    def close_input(self) -> None:
        """Close stdin: the copy exits after its current run."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass  # already gone

    def stop(self, grace: float) -> None:
        """Wait for the copy to exit (its stdin closed); kill it if it takes over `grace` s."""
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self._stderr.close()


def _ready(copies: list[_Copy], timeout: float) -> list[dict]:
    """What each copy says once it is ready (its mode, cores and threads), within `timeout` s."""
    deadline = time.monotonic() + timeout
    return [json.loads(copy.expect(deadline, f"ready within {timeout:g} s",
                                   lambda line: line.startswith("ready "))[6:]) for copy in copies]


def _timed(settings: ProfileSettings, copies: list[_Copy], timeout: float) -> dict:
    """The statistics of `copies` (ready and warm) run in lockstep rounds of the model, then of served
    batches: a round takes as long as the slowest copy, as a split batch does (one copy: its own
    times). copy_ms: the mean of the copies' own times of the model."""
    own: list[float] = []

    def timed(command: str) -> tuple[float, list[float]]:
        wall, lines = _round(copies, timeout, command)
        own.extend(line[0] for line in lines if command == "run")
        stages = [statistics.fmean(column) for column in zip(*(line[1:] for line in lines))]
        return (wall if len(copies) > 1 else lines[0][0]), stages

    if len(copies) > 1:
        _round(copies, timeout)  # untimed: the first lockstep run warms the hand-off (each copy ran warm already)
    result = {**summarize(budgeted(lambda: timed("run")[0], *settings.budget)), "copy_ms": statistics.fmean(own)}
    return {**result, **(time_served(lambda: timed("serve"), 0, *settings.budget) if settings.served else {})}


def _round(copies: list[_Copy], timeout: float, command: str = "run") -> tuple[float, list[list[float]]]:
    """Run every copy once (`command`: run the model, or serve a batch), together: the wall time in
    ms, and the numbers each copy answered (its own time first)."""
    start = time.perf_counter()
    for copy in copies:
        copy.send_run(command)
    deadline = time.monotonic() + timeout
    lines = [[float(x) for x in copy.read_line(deadline, f"done within {timeout:g} s").split()] for copy in copies]
    return (time.perf_counter() - start) * 1e3, lines


def _row(settings: ProfileSettings, threads: int, batch: int, copies: int, alone: dict | None,
         loaded: dict | None) -> dict:
    """The profile row of a point measured `alone` (its figures also the isolated ones) and/or
    `loaded` by `copies` copies (its figures the row's; isolated ones None when not measured alone)."""
    row = {"threads": threads, "batch": batch, "copies": 1, "runtime": settings.runtime}
    if alone is not None:
        row.update(alone, isolated_ms=alone["latency_ms"], served_isolated_ms=alone.get("served_ms"))
    if loaded is not None:
        row.update(loaded, copies=copies)
        row.setdefault("isolated_ms", None)
        row.setdefault("served_isolated_ms", None)
    return row


def planned_ms(row: dict) -> float:
    """The figure of a measured row that plans are made on: served where measured, else the model's."""
    return row["served_ms"] if row.get("served_ms") is not None else row["latency_ms"]


class Workers:
    """The measuring processes of one (runtime, threads), kept across points: copies_for() copies on
    disjoint core sets (a thread-kind runtime's: one process, a session a set), then told each batch.
    load_s: the start and load; measure_s: the points. A failure stops every copy (ProfilingError)."""

    def __init__(self, settings: ProfileSettings, threads: int, topology: Topology, timeout: float = COPY_TIMEOUT_S):
        started = time.monotonic()
        self.settings, self.threads, self.timeout, self.measure_s = settings, threads, timeout, 0.0
        self.copies = copies_for(settings, threads, topology)
        self.sets = topology.assign([threads] * self.copies)
        self.thread_kind = instance_kind(settings.runtime) == "thread"
        self._procs: list[_Copy] = []
        try:
            if self.thread_kind:  # pinned to every set's cores before torch is imported, a session's thread to its own
                cmd, env = _command(settings, threads, None, sorted(core for cores in self.sets for core in cores))
                sets = ";".join(",".join(map(str, cores)) for cores in self.sets)
                self._procs.append(_Copy(cmd + ["--thread-copies", sets], env))  # a point per `batch N [K]` line
            else:
                self._procs += [_Copy(*_command(settings, threads, None, cores)) for cores in self.sets]
            _ready(self._procs, timeout)
        except BaseException as exc:  # Ctrl-C too: no copy is left running
            self.close(ok=False)
            if not isinstance(exc, (_CopyFailed, ValueError)):
                raise
            raise ProfilingError(f"starting {self.copies} measuring copies of threads={threads} failed: "
                                 f"{exc}") from None
        self.load_s = time.monotonic() - started

    def measure(self, batch: int) -> dict:
        """The profile row of ⟨threads, batch⟩ (_row)."""
        if not self._procs:
            raise ProfilingError(f"the measuring copies of threads={self.threads} are stopped")
        started, alone_too = time.monotonic(), self.copies == 1 or self.settings.isolated_too
        try:
            if self.settings.runtime == "ios":  # searched alone on the point's cores, before any copy times it
                measure_point(self.settings, self.threads, batch, self.sets[0], "--prepare-only")
            if self.thread_kind:
                alone = self._thread_batch(batch, 1) if alone_too else None
                loaded = self._thread_batch(batch, self.copies) if self.copies > 1 else None
            else:
                for copy in self._procs:
                    copy.send_run(f"batch {batch}")
                ready = _ready(self._procs, self.timeout)
                alone = {**_timed(self.settings, self._procs[:1], self.timeout), **ready[0]} if alone_too else None
                loaded = ({**_timed(self.settings, self._procs, self.timeout), "mode": ready[0]["mode"],
                           "copy_cores": [r["cores"] for r in ready]} if self.copies > 1 else None)
        except (_CopyFailed, ValueError) as exc:  # ValueError: a line that is not what the protocol says
            self.close(ok=False)
            raise ProfilingError(f"measuring threads={self.threads} batch={batch} under load ({self.copies} copies) "
                                 f"failed: {exc}") from None
        finally:
            self.measure_s += time.monotonic() - started
        return _row(self.settings, self.threads, batch, self.copies, alone, loaded)

    def _thread_batch(self, batch: int, sessions: int) -> dict:
        """A thread-kind point of the first `sessions` sessions, measured in the process (its JSON line)."""
        self._procs[0].send_run(f"batch {batch} {sessions}")
        deadline = time.monotonic() + self.timeout
        return json.loads(self._procs[0].expect(deadline, f"done within {self.timeout:g} s",
                                                lambda line: line.startswith("{")))

    def close(self, ok: bool = True) -> None:
        """Stop every copy, all told at once (they exit side by side); on failure (or Ctrl-C) at once."""
        for copy in self._procs:
            copy.close_input()
        for copy in self._procs:
            copy.stop(self.timeout if ok else 0)
        self._procs = []

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close(ok=exc[0] is None)


def measure(settings: ProfileSettings, threads: int, batch: int, topology: Topology) -> dict:
    """One profile row for ⟨threads, batch⟩ (Workers.measure), on workers started for it alone."""
    with Workers(settings, threads, topology) as workers:
        return workers.measure(batch)
