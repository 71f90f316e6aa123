"""Offline profiler: measures L(t, b) over a grid, each point in a fresh pinned process.

By default (contention) each point is measured as ⌊T/t⌋ copies of it on disjoint cores run
each batch together, as a homogeneous plan of that point runs them (the loaded figure, the
profile's latency_ms: the slowest copy of each round decides it, as it decides a plan's batch);
the copies run at once, so a loaded point costs about the wall time of a lone one. A point no
second copy fits beside (t > T/2) is measured alone: it is served alone. With isolated_too, every
point is also measured alone (two measurements where copies fit: what the oracle benchmark
compares); with contention off, every point is measured alone only (the default before issue 32).

Points are appended to the profile file as they finish, so Ctrl-C leaves a valid
file and a later run with the same arguments measures only what is missing.

Served figures (issue 41, by default): every measurement of a point also times the whole sub-batch as a
pool instance serves it from the model's natural payload (or the one asked for): decode, model,
encode (packrat/profiling/point.py), in the same process and with the same budget, right after the
model alone; the profile keeps both (profiles.py) and plans on the served one. Loaded, the copies
run their served batches in lockstep rounds after their model rounds. A file of an older layout, or
one taken model-only, is resumed model-only (said), so a profile never mixes the two.

Runtimes (packrat/models/runtimes.py): every point is measured under each runtime asked for, in
its own fresh process, the runtime's artefact built (and checked against eager) once before its
first point. A runtime that cannot run the model, or whose outputs differ from eager's, is
refused with the reason (printed, and kept in the new profile's metadata) and its points skipped.
The opt-in ios runtime (an IOS schedule, searched alone on the point's cores before the point is
timed) is measured after the others, where they leave threads idle (reach.py). A thread-kind
runtime (onnxruntime-thread: sessions hosted as threads of the serving process) is measured as the
pool serves it: its ⌊T/t⌋ copies are sessions on pinned threads of one process (measure_threads).
"""

from __future__ import annotations

import datetime
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from packrat.errors import ProfileError, ProfilingError
from packrat.machine.budget import cpu_budget
from packrat.machine.topology import Topology, cpu_model
from packrat.models.modes import DEFAULT_MODE
from packrat.models.runtimes import DEFAULT_RUNTIME, OPT_IN, instance_kind
from packrat.profiling import profiles, reach
from packrat.profiling.dominance import DROP_AFTER, DominanceWatch, corners, diagonal_first
from packrat.profiling.point import served_summary, summarize

# Whether `packrat profile` measures loaded figures unless told otherwise. Issue 10's oracle found
# them no better on the 2-core VM (mean |predicted/measured - 1| 8.4 % loaded vs 7.6 % isolated),
# but then a loaded point cost two measurements and instances ran 6-14 % over their points anyway.
# Issue 32: split plans served 16-35 % over their isolated predictions (BERT 2×⟨1, 4⟩ 1140 ms
# predicted, 1542-1619 served), which picked wrong plans; a loaded point now costs one measurement,
# so the profile measures as the planner serves (BENCHMARKS.md, issue 32).
DEFAULT_CONTENTION = True
# The loaded measurement's handshake: each phase (load and warm up, timed runs, stopping) may
# take this many times the whole isolated measurement of the point, and never less than the floor.
LOADED_TIMEOUT_FACTOR = 10.0
LOADED_TIMEOUT_FLOOR_S = 60.0
# ... and without a lone measurement to scale from (loaded only, the default), this long per phase:
# loading and compiling a large model on a busy machine may take minutes.
LOADED_TIMEOUT_NO_YARDSTICK_S = 600.0
_LATENCY_FLAG = {"loaded": "--contention", "isolated": "--isolated"}  # `packrat profile`'s flags, for hints


# `packrat profile`'s timing of a point: a few untimed runs, then at least this long of timed runs
# (3 at least), and the served figure as long again. 100 runs after 10 (the default before issue 48)
# took ResNet-50's 24-point profile on 2 cores past 15 minutes; points that take long need few runs
# to be known as well as the machine's drift lets them be (±10-30 % here over minutes), and served
# latencies correct the figures while the plan serves (serving/served.py).
DEFAULT_WARMUP = 3
DEFAULT_MIN_TIME_S = 1.0


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


def metadata(settings: ProfileSettings, topology: Topology, runtimes: dict[str, str | None] | None = None
             ) -> dict[str, str]:
    """A new profile's head; `runtimes`: each runtime asked for -> None, or why it was refused."""
    import torch

    from packrat.models.zoo import resolve

    spec = resolve(settings.model, settings.input_shape)
    runtimes = runtimes or {DEFAULT_RUNTIME: None}
    refused = "; ".join(why for why in runtimes.values() if why)
    served = {"payload": payload_kind(settings, spec)} if settings.served else {}
    return {
        "model": settings.model,
        "mode": settings.graph_mode if spec.scriptable else "eager",
        "torch": torch.__version__,
        "cpu": cpu_model(),
        "latency": "loaded" if settings.contention else "isolated",
        "cores": str(topology.num_cores),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "runtimes": ",".join(r for r, why in runtimes.items() if not why),
        **({"refused": refused} if refused else {}),
        **served,
    }


def payload_kind(settings: ProfileSettings, spec=None) -> str:
    """The payload served points answer: settings.payload, or the model's natural one as it is
    served (codec.payloads.served_payload: a token model without a tokenizer takes token ids, raw);
    ValueError when the model cannot take it."""
    from packrat.codec.payloads import check_payload_of, served_payload
    from packrat.models.zoo import resolve

    spec = spec or resolve(settings.model, settings.input_shape)
    kind = settings.payload or served_payload(spec)
    check_payload_of(spec, kind, settings.model)
    if kind == "text" and not getattr(spec, "tokenizer", None):
        raise ValueError(f"a text payload needs a tokenizer: {settings.model} comes without one, so its instances "
                         f"answer text with 400; profile it with --payload raw (token ids)")
    if kind not in ("jpeg", "text", "raw"):
        raise ValueError(f"a served point answers jpeg, text or raw bodies, not {kind}")
    return kind


def _command(settings: ProfileSettings, threads: int, batch: int, cores: list[int]) -> tuple[list[str], dict | None]:
    """The packrat.profiling.point command line for a point pinned to `cores`, and its environment."""
    cmd = [sys.executable, "-m", "packrat.profiling.point", "--model", settings.model,
           "--threads", str(threads), "--batch", str(batch), "--cores", ",".join(map(str, cores)),
           "--warmup", str(settings.warmup)]
    if settings.iters is not None:
        cmd += ["--iters", str(settings.iters)]
    if settings.min_time is not None:
        cmd += ["--min-time", str(settings.min_time)]
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


def copies_for(threads: int, topology: Topology) -> int:
    """How many copies of a t-thread point a homogeneous plan runs side by side: ⌊T/t⌋."""
    return topology.num_cores // threads


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
        """Ask for one run: `run` (the model alone) or `serve` (a served batch)."""
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
        """Close stdin (the copy then exits after its current run); kill it if it takes over `grace` s."""
        self.close_input()
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self._stderr.close()


def measure_loaded(settings: ProfileSettings, threads: int, batch: int, core_sets: list[list[int]],
                   timeout: float = LOADED_TIMEOUT_FLOOR_S) -> dict:
    """One copy of the point per core set, run in lockstep as a plan's instances run a batch.

    Each copy loads and warms up alone and says ready; then every round tells all copies to run
    at once and waits for all of them, so a round takes as long as the slowest copy, as a batch
    split across a homogeneous plan does (the mean over copies would miss that the slowest one
    decides). One untimed round, then --iters rounds (or rounds for --min-time s, at least 3).
    latency_ms is the mean round, copy_ms the mean of the copies' own run times. With settings.served,
    then as many rounds of served batches (one untimed first): served_ms and its spread. Each phase
    (ready, a round, stopping) may take `timeout` s; on any failure every copy is killed and
    ProfilingError names the point and the reason."""
    copies: list[_Copy] = []
    ok = False
    try:
        for cores in core_sets:
            copies.append(_Copy(*_command(settings, threads, batch, cores)))
        deadline = time.monotonic() + timeout
        ready = [json.loads(copy.expect(deadline, f"ready within {timeout:g} s",
                                        lambda line: line.startswith("ready "))[6:]) for copy in copies]
        _round(copies, timeout)  # untimed: the first lockstep run warms the hand-off
        rounds, own = [], []
        started = time.monotonic()
        while not _enough(settings, len(rounds), time.monotonic() - started):
            wall, times = _round(copies, timeout)
            rounds.append(wall)
            own += times
        served = []
        if settings.served:
            _round(copies, timeout, "serve")  # untimed, as the model's first lockstep round
            started = time.monotonic()
            while not _enough(settings, len(served), time.monotonic() - started):
                served.append(_round(copies, timeout, "serve")[0])
        ok = True
    except (_CopyFailed, ValueError) as exc:  # ValueError: a line that is not what the protocol says
        raise ProfilingError(f"measuring threads={threads} batch={batch} under load "
                             f"({len(core_sets)} copies) failed: {exc}") from None
    finally:
        for copy in copies:  # all told at once: they exit side by side, not one after another
            copy.close_input()
        for copy in copies:
            copy.stop(timeout if ok else 0)  # on failure (or Ctrl-C) no copy is left running
    return {**summarize(rounds), "copy_ms": statistics.fmean(own), "mode": ready[0]["mode"],
            "copy_cores": [r["cores"] for r in ready], **(served_summary(served) if served else {})}


def _round(copies: list[_Copy], timeout: float, command: str = "run") -> tuple[float, list[float]]:
    """Run every copy once (`command`: run the model, or serve a batch), together: the wall time in
    ms, and each copy's own time."""
    start = time.perf_counter()
    for copy in copies:
        copy.send_run(command)
    deadline = time.monotonic() + timeout
    times = [float(copy.read_line(deadline, f"done within {timeout:g} s")) for copy in copies]
    return (time.perf_counter() - start) * 1e3, times


def _enough(settings: ProfileSettings, rounds: int, elapsed_s: float) -> bool:
    if settings.iters is not None:
        return rounds >= settings.iters
    return rounds >= 3 and elapsed_s >= settings.min_time


def measure(settings: ProfileSettings, threads: int, batch: int, topology: Topology) -> dict:
    """One profile row for ⟨threads, batch⟩: with settings.contention and room for more than one
    copy, loaded by ⌊T/t⌋ copies (and alone first with isolated_too; else isolated_ms is left
    empty); otherwise alone, latency_ms and isolated_ms the same figure. With settings.served, the
    served figures beside them alike (served_ms, served_isolated_ms, served_mad_ms). A thread-kind
    runtime's copies are threads of one process, as the pool hosts them (measure_threads)."""
    copies = copies_for(threads, topology) if settings.contention else 1
    if instance_kind(settings.runtime) == "thread":
        return measure_threads(settings, threads, batch, topology, copies)
    row = {"threads": threads, "batch": batch, "copies": 1, "runtime": settings.runtime}
    timeout = LOADED_TIMEOUT_FLOOR_S
    if settings.runtime == "ios":  # searched once, alone on the point's cores, before any copy times it
        measure_point(settings, threads, batch, topology.cores_for(threads), "--prepare-only")
    if copies == 1 or settings.isolated_too:
        started = time.monotonic()
        isolated = measure_point(settings, threads, batch, topology.cores_for(threads))
        row.update(isolated, isolated_ms=isolated["latency_ms"], served_isolated_ms=isolated.get("served_ms"))
        timeout = max(timeout, LOADED_TIMEOUT_FACTOR * (time.monotonic() - started))
    if copies > 1:
        loaded = measure_loaded(settings, threads, batch, topology.assign([threads] * copies),
                                timeout if settings.isolated_too else LOADED_TIMEOUT_NO_YARDSTICK_S)
        row.update(loaded, copies=copies)
        row.setdefault("isolated_ms", None)
        row.setdefault("served_isolated_ms", None)
    return row


def measure_threads(settings: ProfileSettings, threads: int, batch: int, topology: Topology, copies: int) -> dict:
    """A thread-kind runtime's row, measured as the pool serves such instances: `copies` sessions as
    threads of one fresh process, each pinned to its cores, run together (point.measure_threads);
    with one copy (or isolated_too), one session on a pinned thread alone as well."""
    row = {"threads": threads, "batch": batch, "copies": 1, "runtime": settings.runtime}
    if copies == 1 or settings.isolated_too:
        alone = _thread_point(settings, threads, batch, [topology.cores_for(threads)])
        row.update(alone, isolated_ms=alone["latency_ms"], served_isolated_ms=alone.get("served_ms"))
    if copies > 1:
        row.update(_thread_point(settings, threads, batch, topology.assign([threads] * copies)), copies=copies)
        row.setdefault("isolated_ms", None)
        row.setdefault("served_isolated_ms", None)
    return row


def _thread_point(settings: ProfileSettings, threads: int, batch: int, core_sets: list[list[int]]) -> dict:
    """One point process with a session per core set (point --thread-copies), the process pinned to
    all of them before torch is imported: each session's thread then pins itself to its own."""
    every = sorted(core for cores in core_sets for core in cores)
    return measure_point(settings, threads, batch, every, "--thread-copies",
                         ";".join(",".join(map(str, cores)) for cores in core_sets))


def planned_ms(row: dict) -> float:
    """The figure of a measured row that plans are made on: served where measured, else the model's."""
    return row["served_ms"] if row.get("served_ms") is not None else row["latency_ms"]


def measurements(settings: ProfileSettings, threads: int, topology: Topology) -> int:
    """Timed measurements a point with `threads` takes: 2 when it is measured both alone and
    loaded (isolated_too), else 1. (The copies of a loaded measurement run at once, so they take
    about one measurement's time.)"""
    return 2 if settings.contention and settings.isolated_too and copies_for(threads, topology) > 1 else 1


def _cost(settings: ProfileSettings, threads: int, batch: int, topology: Topology) -> float:
    """A point's expected share of the run, for the progress bar: time per run grows ∝ b / t."""
    return batch / threads * measurements(settings, threads, topology)


def resumed(settings: ProfileSettings, out: Path, meta: dict[str, str], say=print
            ) -> tuple[ProfileSettings, dict[str, str]]:
    """`settings` and the head `meta` of a new profile, made to measure what `out` already holds:
    served figures of one payload, or model-only ones. A file without served figures (an older
    layout, or taken with --model-only) is resumed model-only when the payload was left to the
    default (said); asked for a payload it cannot hold, or model-only figures into a served profile,
    ProfileError."""
    if not out.exists() or out.stat().st_size == 0:
        return settings, meta
    existing = profiles.load(out)
    held = existing.metadata.get("payload")
    wanted = meta.get("payload")
    if held == wanted:
        return settings, meta
    if held is None and settings.payload is None:
        say(f"{out} holds model-only figures: its missing points are measured model-only too "
            f"(choose another --out for served figures)")
        return replace(settings, served=False), {k: v for k, v in meta.items() if k != "payload"}
    hint = f"resume it with --payload {held}" if held else "resume it with --model-only"
    raise ProfileError(f"{out}: holds a profile with {f'payload {held!r}' if held else 'model-only figures'}, "
                       f"not {f'payload {wanted!r}' if wanted else 'model-only ones'}; choose another --out "
                       f"(or {hint})")


def _existing(out: Path, meta: dict[str, str]) -> set[tuple[str, int, int]]:
    """Points (runtime, threads, batch) already measured in `out`, which must be of the same model,
    mode and latency kind."""
    if not out.exists() or out.stat().st_size == 0:
        return set()
    existing = profiles.load(out)
    found = {**existing.metadata, "latency": "loaded" if existing.loaded else "isolated"}  # older files: isolated
    for key in ("model", "mode", "latency"):
        if found.get(key, meta[key]) != meta[key]:
            hint = f" (or resume it with {_LATENCY_FLAG[found[key]]})" if key == "latency" else ""
            raise ProfileError(f"{out}: holds a profile with {key} {found[key]!r}, "
                                          f"not {meta[key]!r}; choose another --out{hint}")
    return {(runtime, t, b) for runtime, points in existing.by_runtime.items() for t, b in points}


def check_runtimes(settings: ProfileSettings, runtimes: tuple[str, ...], say=print) -> dict[str, str | None]:
    """Each runtime -> None when it can run the model (its artefact built and checked against
    eager, once per machine), else why not (said at once: the user learns before the grid runs)."""
    from packrat.models import runtimes as engines
    from packrat.models.zoo import resolve

    verdicts: dict[str, str | None] = {}
    for runtime in runtimes:
        verdicts[runtime] = None
        if runtime != DEFAULT_RUNTIME:
            try:
                engines.ensure_artefact(resolve(settings.model, settings.input_shape), runtime)
            except engines.RuntimeRefused as exc:
                verdicts[runtime] = str(exc)
        if verdicts[runtime]:
            say(f"runtime {runtime} refused: {verdicts[runtime]}")
    return verdicts


def _some_runtime(verdicts: dict[str, str | None]) -> None:
    if all(verdicts.values()):
        raise ProfilingError("no runtime asked for can run the model: " + "; ".join(verdicts.values()))


def run(settings: ProfileSettings, threads: list[int], batches: list[int], out: str | Path,
        topology: Topology | None = None, progress: bool = True, runtimes: tuple[str, ...] = (DEFAULT_RUNTIME,),
        say=print, every_runtime: bool = True) -> profiles.Profile:
    """Measure every missing ⟨t, b⟩ of the grid into `out`, under each runtime that can run the
    model; return the whole profile. Unless `every_runtime`, a runtime dominated point after point
    is measured no further (dominance.py; said, and kept in the file's metadata)."""
    out = Path(out)
    topology = topology or cpu_budget().topology
    too_many = [t for t in threads if t > topology.num_cores]
    if too_many:
        raise ValueError(f"--threads: {max(too_many)} exceeds the {topology.num_cores} cores this process may use")
    if settings.served:
        payload_kind(settings)  # a payload the model cannot take is refused before any runtime is built
    verdicts = check_runtimes(settings, runtimes, say)
    _some_runtime(verdicts)
    meta = metadata(settings, topology, verdicts)
    notes: list[str] = []
    settings, meta = resumed(settings, out, meta, notes.append)
    done = _existing(out, meta)
    usable = tuple(r for r, why in verdicts.items() if not why)
    plain = tuple(r for r in usable if r not in OPT_IN)  # the opt-in ios runtime is measured after them
    # Each ⟨t, b⟩ under every runtime back to back: the planner picks the fastest runtime per point,
    # and a machine whose speed drifts over minutes (a shared VM) would otherwise decide that pick.
    # Diagonal first: a runtime the others dominate is seen at other threads and batches early.
    grid = diagonal_first(threads, batches)
    todo = [(r, t, b) for t, b in grid for r in plain if (r, t, b) not in done]
    for note in notes if todo else ():  # said only where a point is to be measured
        say(note)
    # Progress is weighted by expected cost so the time-left estimate is useful.
    costs = {point: _cost(settings, *point[1:], topology) for point in todo}
    watch = None if every_runtime or len(plain) < 2 else DominanceWatch(plain, max(threads), max(batches))
    existing = profiles.load(out) if done else None
    known = existing.points() if existing else {}  # the file's planned-on figures, for the watch
    bar = tqdm(total=sum(costs.values()), disable=not progress or not (todo or "ios" in usable), unit="",
               bar_format="{desc} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
    with bar, profiles.ProfileWriter(out, meta) as writer:
        index, seen = 0, {}  # seen: each point's figures so far, by runtime

        def measure_one(r: str, t: int, b: int) -> tuple[float, float]:
            """The point's (planned-on ms, spread) under `r`: the file's, or measured and written."""
            nonlocal index
            if (r, t, b) in done:
                return known[t, b, r], existing.spread_ms(t, b, r)
            if (r, t, b) not in costs:  # a corner timed again (_retime_dropped): not in the bar's total yet
                costs[r, t, b] = _cost(settings, t, b, topology)
                bar.total += costs[r, t, b]
            index += 1
            named = "" if runtimes == (DEFAULT_RUNTIME,) else f"{r} "
            bar.set_description(f"point {index}/{len(costs)}: {named}threads={t} batch={b}")
            row = measure(replace(settings, runtime=r), t, b, topology)
            writer.write(row)  # columns outside the CSV are dropped
            bar.update(costs.get((r, t, b), 0.0))
            return planned_ms(row), planned_spread(row)

        for t, b in grid:
            figures = seen.setdefault((t, b), {})
            for r in watch.active if watch else plain:
                figures[r] = measure_one(r, t, b)
            for r in watch.point(t, b, figures) if watch else ():
                left = [p for p in costs if p[0] == r and (p[1], p[2]) not in seen]
                _drop_runtime(r, watch.dropped[r], len(left), sum(costs.pop(p) for p in left), bar, writer, say)
        if watch and watch.dropped:
            _retime_dropped(watch, corners(threads, batches), seen, measure_one, writer, say)
        if "ios" in usable:
            _measure_ios(settings, out, grid, plain, done, topology, writer, say, every_runtime, bar)
    return profiles.load(out)


def _measure_ios(settings: ProfileSettings, out: Path, grid: list[tuple[int, int]] | None, plain: tuple[str, ...],
                 done: set, topology: Topology, writer: profiles.ProfileWriter, say, every_runtime: bool,
                 bar=None) -> None:
    """Measure the ios runtime, after the plain runtimes, where it can gain (reach.ios_points on their
    figures at the points of `grid`, None: every point they measured); everywhere in the grid with
    `every_runtime` or without a plain runtime. Each point's schedule is searched first (measure)."""
    figures = profiles.load(out).only(plain).latency if plain and out.stat().st_size else {}
    if grid is None:
        grid = sorted(figures)
    if every_runtime or not plain:
        points = list(grid)
    else:
        points = reach.ios_points({p: figures[p] for p in grid if p in figures})
        say(f"runtime ios: measured at {len(points)} point(s), those at batch ≤ {reach.IOS_MAX_BATCH} where the "
            f"other runtimes use less than {reach.IOS_EFFICIENCY:.0%} of the threads; --every-runtime measures "
            f"it everywhere")
    todo = [(t, b) for t, b in points if ("ios", t, b) not in done]
    from packrat.ios_scheduler.cache import SEARCH_BUDGET_S  # torch: loaded by metadata() already

    if bar is not None:
        bar.total += sum(_cost(settings, t, b, topology) for t, b in todo)
    for index, (t, b) in enumerate(todo, start=1):
        if bar is not None:
            bar.set_description(f"ios point {index}/{len(todo)}: threads={t} batch={b} (its schedule searched "
                                f"first, up to {SEARCH_BUDGET_S:.0f} s, unless kept)")
        writer.write(measure(replace(settings, runtime="ios"), t, b, topology))
        if bar is not None:
            bar.update(_cost(settings, t, b, topology))


def _retime_dropped(watch: DominanceWatch, points: list[tuple[int, int]], seen: dict, measure_one,
                    writer: profiles.ProfileWriter, say) -> None:
    """Each runtime `watch` dropped, timed again at `points` (the grid's corners) where it was not
    measured before it was dropped: its figure against the fastest other one's there, said and kept
    in the profile's head. Where the choosing rule picks it the planner takes it, as at any point.
    `seen`: each point's figures by runtime (measure_one's added); measure_one(runtime, t, b):
    (ms, spread), or None where the point cannot be had."""
    for runtime in watch.dropped:
        found = {}  # point -> (its text, whether the choosing rule takes the runtime there)
        for t, b in points:
            figures = seen.setdefault((t, b), {})
            if runtime not in figures:
                figure = measure_one(runtime, t, b)
                if figure is None:  # a replayed table without the point
                    continue
                figures[runtime] = figure
            found[t, b] = _against_others(runtime, t, b, figures)
        wins = [f"⟨{t}, {b}⟩" for (t, b), (_, won) in found.items() if won]
        verdict = f"taken at {', '.join(wins)}, where the choosing rule picks it" if wins else "taken at none"
        line = f"{runtime}: {'; '.join(text for text, _ in found.values())} ({verdict})"
        say(f"runtime {runtime} timed again at the grid's corners: {line.split(': ', 1)[1]}")
        writer.note("re-timed", line)


def _against_others(runtime: str, t: int, b: int, figures: dict[str, tuple[float, float]]) -> tuple[str, bool]:
    """("⟨t, b⟩ ms against the fastest other's ms", whether the choosing rule takes `runtime` there:
    it is the fastest beyond the noise, or inductor within the noise of the fastest)."""
    ms = figures[runtime][0]
    others = {r: f for r, f in figures.items() if r != runtime}
    if not others:
        return f"⟨{t}, {b}⟩ {ms:.1f} ms, alone", True
    fastest = min(others, key=lambda r: (others[r][0], r))
    won = profiles.choose_runtime(figures) == runtime
    return f"⟨{t}, {b}⟩ {ms:.1f} ms against {fastest}'s {others[fastest][0]:.1f}", won


def planned_spread(row: dict) -> float:
    """The spread of the figure plans are made on (planned_ms): the served one's where measured."""
    key = "served_mad_ms" if row.get("served_ms") is not None else "mad_ms"
    return row.get(key) or 0.0


def _drop_runtime(runtime: str, why: str, points_left: int, cost_left: float, bar,
                  writer: profiles.ProfileWriter, say) -> None:
    """Measure `runtime` no further: said, kept in the file's head, its points (`cost_left` of the
    bar) taken off the bar."""
    say(f"runtime {runtime} measured no further ({points_left} points left out): {why}; "
        f"--every-runtime measures it everywhere")
    writer.note("dominated", f"{runtime}: {why}")
    bar.total -= cost_left
    bar.refresh()


# ---- adaptive: only the points that can change a plan ----------------------------------------

POINT_OVERHEAD_S = 5.0  # per measurement besides its timed runs: fresh process, model build, trace, warm-up


@dataclass(frozen=True)
class AdaptiveResult:
    profile: profiles.Profile
    points: int  # points in the profile (measured or looked up)
    grid: int  # points of the full grid
    measure_s: float  # estimated time measuring those points takes
    full_grid_s: float  # estimated time the full grid takes (a lower bound when not replayed)

    @property
    def saved(self) -> float:
        """The share of the full grid's estimated measuring time not spent."""
        return 1 - self.measure_s / self.full_grid_s if self.full_grid_s else 0.0

    def to_json(self, out: Path) -> dict:
        return {"points": self.points, "grid": self.grid, "fraction": round(self.points / self.grid, 4),
                "measure_s": round(self.measure_s, 1), "full_grid_s": round(self.full_grid_s, 1),
                "saved_s": round(self.full_grid_s - self.measure_s, 1),
                "saved": round(self.saved, 4),
                "out": str(out)}


def point_seconds(settings: ProfileSettings, threads: int, latency_ms: float, topology: Topology) -> float:
    """Estimated wall time of measuring one point: per measurement, start-up plus warm-up and timed runs."""
    runs_s = settings.warmup * latency_ms / 1e3
    runs_s += settings.min_time if settings.iters is None else settings.iters * latency_ms / 1e3
    if settings.served:  # as many served runs after the model's: at least as long each
        runs_s += settings.min_time if settings.iters is None else settings.iters * latency_ms / 1e3
    return measurements(settings, threads, topology) * (POINT_OVERHEAD_S + runs_s)


def _replay_row(source: profiles.Profile, threads: int, batch: int, runtime: str = DEFAULT_RUNTIME) -> dict:
    points = source.by_runtime.get(runtime, {})
    if (threads, batch) not in points:
        raise ProfilingError(f"the replayed profile has no point threads={threads} batch={batch} ({runtime})")
    latency, isolated = points[threads, batch]
    row = {"threads": threads, "batch": batch, "latency_ms": latency, "isolated_ms": isolated, "runtime": runtime}
    if (threads, batch) in source.served.get(runtime, {}):
        row["served_ms"], row["served_isolated_ms"] = source.served[runtime][threads, batch]
    return row


def _replay_metadata(source: profiles.Profile, path: Path) -> dict[str, str]:
    return {**source.metadata, "latency": "loaded" if source.loaded else "isolated", "replayed_from": str(path)}


def run_adaptive(settings: ProfileSettings, threads: list[int], batches: list[int], out: str | Path, *,
                 topology: Topology | None = None, replay: str | Path | None = None,
                 slack: float | None = None, tolerance: float = 0.0, progress: bool = True,
                 runtimes: tuple[str, ...] = (DEFAULT_RUNTIME,), say=print,
                 every_runtime: bool = True) -> AdaptiveResult:
    """Measure only the points of threads × batches that can change a plan for some T ≤ max(threads)
    and B ≤ max(batches) (packrat.profiling.adaptive), appending them to `out` (points already there are kept);
    each runtime's grid on its own (a point one runtime needs, another may not). Unless
    `every_runtime`, a runtime dominated point after point is measured no further (as run() does).

    With `replay`, points are looked up in that full profile instead of measured, and `out` is
    rewritten with just the points looked up: a check of the method against a full table."""
    from packrat.profiling import adaptive

    out = Path(out)
    topology = topology or (Topology.virtual(max(threads)) if replay else cpu_budget().topology)
    source = profiles.load(replay) if replay else None
    if source:
        settings = replace(settings, contention=source.loaded, served=source.has_served)  # for the time estimates
        meta = _replay_metadata(source, Path(replay))
        out.unlink(missing_ok=True)
        verdicts = {runtime: None for runtime in source.measured_runtimes}
    else:
        if max(threads) > topology.num_cores:
            raise ValueError(f"--threads: {max(threads)} exceeds the {topology.num_cores} cores this process may use")
        if settings.served:
            payload_kind(settings)  # refused before any runtime is built
        verdicts = check_runtimes(settings, runtimes, say)
        meta = metadata(settings, topology, verdicts)
        settings, meta = resumed(settings, out, meta, say)
    previous = profiles.load(out) if source is None and _existing(out, meta) else None
    _some_runtime(verdicts)
    grids = {}
    usable = [r for r, why in verdicts.items() if not why]
    plain = tuple(r for r in usable if r not in OPT_IN or source is not None)  # replayed: ios looked up like any
    for runtime in plain:
        grids[runtime] = adaptive.AdaptiveGrid(threads, batches, tolerance=tolerance,
                                               slack=adaptive.DEFAULT_SLACK if slack is None else slack)
        if previous is not None:
            adaptive.resume(grids[runtime], previous.runtime_items(runtime))
    # replayed too: a recorded table shows what the rule drops on it
    watch = None if every_runtime or len(grids) < 2 else DominanceWatch(tuple(grids), max(threads), max(batches))
    with profiles.ProfileWriter(out, meta) as writer:
        _adapt(grids, settings, topology, source, writer, progress, watch, say)
        if "ios" in usable and not source:
            done = {(r, t, b) for r, points in (previous.by_runtime if previous else {}).items() for t, b in points}
            with tqdm(total=0, disable=not progress, unit="",
                      bar_format="{desc} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]") as bar:
                _measure_ios(settings, out, None, plain, done, topology, writer, say, every_runtime, bar)
    result = profiles.load(out)
    parts = [_adaptive_result(replace(settings, runtime=r), grid, topology,
                              source.by_runtime[r] if source else None) for r, grid in grids.items()]
    return AdaptiveResult(result, *(sum(values) for values in zip(*parts)))


def _adapt(grids: dict, settings: ProfileSettings, topology: Topology, source: profiles.Profile | None,
           writer: profiles.ProfileWriter, progress: bool, watch: DominanceWatch | None = None, say=print) -> None:
    """Run the adaptive method on each runtime's grid, back to back (adaptive.run_together),
    measuring (or, replaying, looking up) each point asked for; a runtime `watch` drops is measured
    no further."""
    from packrat.profiling import adaptive

    figures: dict[tuple[int, int], dict[str, tuple[float, float]]] = {}  # each point's, until all measured it
    seen: dict[tuple[int, int], dict[str, tuple[float, float]]] = {}  # each point's, kept for the corners

    several = list(grids) != [DEFAULT_RUNTIME]
    bar = tqdm(total=sum(g.grid_size for g in grids.values()), initial=sum(len(g.measured) for g in grids.values()),
               disable=not progress, unit="point", bar_format="{desc}: {n_fmt}/{total_fmt} points of the grid [{elapsed}]")
    with bar:
        def measure_one(runtime: str, t: int, b: int) -> float:
            bar.set_description_str(f"adaptive{' ' + runtime if several else ''}, measuring threads={t} batch={b}")
            row = (_replay_row(source, t, b, runtime) if source
                   else measure(replace(settings, runtime=runtime), t, b, topology))
            writer.write(row)
            bar.update()
            figure = (planned_ms(row), planned_spread(row))
            figures.setdefault((t, b), {})[runtime] = seen.setdefault((t, b), {})[runtime] = figure
            return planned_ms(row)  # the figure plans are made on: the served one where measured

        def retime(runtime: str, t: int, b: int) -> tuple[float, float] | None:
            if source and (t, b) not in source.by_runtime.get(runtime, {}):
                return None
            bar.total += 1
            measure_one(runtime, t, b)
            return seen[t, b][runtime]

        def measured_all(t: int, b: int) -> list[str]:
            dropped = watch.point(t, b, figures.pop((t, b), {})) if watch else []
            for runtime in dropped:
                left = grids[runtime].grid_size - len(grids[runtime].measured)
                _drop_runtime(runtime, watch.dropped[runtime], left, left, bar, writer, say)
            return dropped

        if watch:  # a dominated runtime is seen early at points of other threads and batches
            grid = next(iter(grids.values()))
            for t, b in diagonal_first(grid.threads, grid.batches)[:DROP_AFTER]:
                for runtime in [r for r in watch.active if (t, b) not in grids[r].measured]:
                    grids[runtime].record(t, b, measure_one(runtime, t, b))
                measured_all(t, b)
        adaptive.run_together({r: g for r, g in grids.items() if r in (watch.active if watch else grids)},
                              measure_one, measured_all=measured_all)
        if watch and watch.dropped:
            grid = next(iter(grids.values()))
            _retime_dropped(watch, corners(grid.threads, grid.batches), seen, retime, writer, say)
        bar.set_description_str("adaptive, done")


def _adaptive_result(settings: ProfileSettings, grid, topology: Topology,
                     full: dict | None) -> tuple[int, int, float, float]:
    """(points measured, grid points, estimated seconds measuring them, and the full grid): measured
    points at their latency; the rest at the full table's, or at their lower bound when there is
    none (so the full grid's figure is then a lower bound)."""
    low = grid.lower_bounds()
    seconds = {}
    for i, t in enumerate(grid.threads):
        for j, b in enumerate(grid.batches):
            latency = full[t, b][0] if full else float(low[i, j])
            seconds[t, b] = point_seconds(settings, t, latency, topology)
    measured = sum(seconds[p] for p in grid.measured)
    return len(grid.measured), grid.grid_size, measured, sum(seconds.values())
