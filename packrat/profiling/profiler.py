"""Offline profiler: `packrat profile` measures L(t, b) into a profile file (docs/profiling.md).

search_profile measures the points the search (search.py) asks for, after each runtime's artefact
is checked (check_runtimes) and the packages they need are built (builds.py), on workers kept per
(runtime, threads) (_WorkerPool, measuring.Workers); points are appended as they finish, so the
same command resumes. The opt-in ios runtime is measured last, where it can gain (reach.py).
"""

from __future__ import annotations

import contextlib
import datetime
import math
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from packrat.errors import ProfileError, ProfilingError
from packrat.machine.budget import cpu_budget
from packrat.machine.topology import Topology, cpu_model
from packrat.models.runtimes import DEFAULT_RUNTIME, OPT_IN
from packrat.profiling import profiles, reach
from packrat.profiling.measuring import (  # noqa: F401  (DEFAULT_*: re-exported for profiler.X)
    DEFAULT_CONTENTION, DEFAULT_MIN_TIME_S, DEFAULT_WARMUP, ProfileSettings, Workers, copies_for,
    measure, planned_ms)

_LATENCY_FLAG = {"loaded": "--contention", "isolated": "--isolated"}  # `packrat profile`'s flags, for hints


def metadata(settings: ProfileSettings, topology: Topology, runtimes: dict[str, str | None] | None = None
             ) -> dict[str, str]:
    """A new profile's head; `runtimes`: each runtime asked for -> None, or why it was refused."""
    import torch

    from packrat.models.zoo import resolve

    spec = resolve(settings.model, settings.input_shape)
    runtimes = runtimes or {DEFAULT_RUNTIME: None}
    refused = "; ".join(why for why in runtimes.values() if why)
    served = {"payload": payload_kind(settings, spec)} if settings.served else {}
    return {"model": settings.model, "mode": settings.graph_mode if spec.scriptable else "eager",
            "torch": torch.__version__, "cpu": cpu_model(), "latency": "loaded" if settings.contention else "isolated",
            "cores": str(topology.num_cores), "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "runtimes": ",".join(r for r, why in runtimes.items() if not why),
            **({"refused": refused} if refused else {}), **served}


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


def resumed(settings: ProfileSettings, out: Path, meta: dict[str, str], say=print
            ) -> tuple[ProfileSettings, dict[str, str]]:
    """`settings` and the head `meta` of a new profile, made to measure what `out` already holds: a
    model-only file is resumed model-only where no payload was asked for (said); any other mismatch
    of payload, model, mode or latency kind is a ProfileError."""
    existing = profiles.held(out)
    if existing is None:
        return settings, meta
    held, wanted = existing.metadata.get("payload"), meta.get("payload")
    if held is None and wanted is not None and settings.payload is None:
        say(f"{out} holds model-only figures: its missing points are measured model-only too "
            f"(choose another --out for served figures)")
        settings, meta = replace(settings, served=False), {k: v for k, v in meta.items() if k != "payload"}
    elif held != wanted:
        hint = f"resume it with --payload {held}" if held else "resume it with --model-only"
        raise ProfileError(f"{out}: holds a profile with {f'payload {held!r}' if held else 'model-only figures'}, "
                           f"not {f'payload {wanted!r}' if wanted else 'model-only ones'}; choose another --out "
                           f"(or {hint})")
    found = {**existing.metadata, "latency": "loaded" if existing.loaded else "isolated"}  # older files: isolated
    for key in ("model", "mode", "latency"):
        if found.get(key, meta[key]) != meta[key]:
            hint = f" (or resume it with {_LATENCY_FLAG[found[key]]})" if key == "latency" else ""
            raise ProfileError(f"{out}: holds a profile with {key} {found[key]!r}, not {meta[key]!r}; choose "
                               f"another --out{hint}")
    return settings, meta


def check_runtimes(settings: ProfileSettings, runtimes: tuple[str, ...], say=print,
                   account: "Account | None" = None) -> dict[str, str | None]:
    """Each runtime -> None when it can run the model (its artefact built and checked against eager
    once per machine, side by side, a process each; the time to `account`), else why not (said)."""
    missing = _missing_artefacts(settings, runtimes)
    found, started = {}, time.monotonic()
    if len(missing) > 1 and cpu_budget().cores > 1:
        import concurrent.futures
        import multiprocessing

        with concurrent.futures.ProcessPoolExecutor(min(len(missing), cpu_budget().cores),
                                                    mp_context=multiprocessing.get_context("spawn")) as pool:
            found = dict(zip(missing, pool.map(_verdict, [(settings.model, settings.input_shape, r) for r in missing])))
    verdicts: dict[str, str | None] = {}
    wall = time.monotonic() - started  # side by side, each runtime takes its share of the wall time
    for runtime in runtimes:
        verdicts[runtime], seconds = found.get(runtime) or _verdict((settings.model, settings.input_shape, runtime))
        if account is not None:
            share = seconds / sum(s for _, s in found.values()) * wall if runtime in found else seconds
            account.add(runtime, "build", share)
        if verdicts[runtime]:
            say(f"runtime {runtime} refused: {verdicts[runtime]}")
    return verdicts


def _missing_artefacts(settings: ProfileSettings, runtimes: tuple[str, ...]) -> list[str]:
    """The runtimes whose artefact is neither built nor refused here yet: a conversion each."""
    from packrat.models import runtimes as engines
    from packrat.models.zoo import resolve

    spec = resolve(settings.model, settings.input_shape)
    artefacts = {engines.base_runtime(r): r for r in reversed(runtimes)  # both kinds of a runtime share one
                 if engines.base_runtime(r) in {*engines.SUFFIXES, *engines.CHECKED} and engines.installed(r)}
    paths = {r: engines.artefact_path(spec, r) for r in artefacts.values()}  # kept: built, or refused, here before
    return [r for r, path in paths.items() if not (path.exists() or engines.refusal(path).exists())]


def _verdict(job: tuple) -> tuple[str | None, float]:
    """(None, or why `runtime` cannot run the model; seconds it took): its artefact built if missing."""
    from packrat.models import runtimes as engines
    from packrat.models.zoo import resolve

    model, input_shape, runtime = job
    started = time.monotonic()
    try:
        if runtime != DEFAULT_RUNTIME:
            engines.ensure_artefact(resolve(model, input_shape), runtime)
        return None, time.monotonic() - started
    except engines.RuntimeRefused as exc:
        return str(exc), time.monotonic() - started


# ---- measuring what the search asks for -----------------------------------------------------------

# The runtimes `packrat profile` leaves out unless --runtimes names them, and why.
NOT_BY_DEFAULT = {"torch-compile": "it compiles in every copy of every point and in every instance (65 s of "
                                   "set-up at B = 16 on 16 cores), unfit for a many-core default; --runtimes "
                                   "takes it"}
SCALED = "scaled"  # search_profile's budget_s: default_budget_s of the machine's cores
BUDGET_BASE_S, BUDGET_PER_DOUBLING_S = 30.0, 30.0
LIVE_COPIES_PER_CORE = 4  # measuring copies kept started between rounds, per core: each holds a model in memory
PARTS = ("build", "load", "measure")


def default_budget_s(cores: int) -> float:
    """When the search starts no more points by default: a time that grows with the grid of threads."""
    return BUDGET_BASE_S + BUDGET_PER_DOUBLING_S * math.log2(max(1, cores))


def default_runtimes(say=print) -> tuple[str, ...]:
    """Every installed runtime but those NOT_BY_DEFAULT (each said, with why)."""
    from packrat.models.runtimes import installed_runtimes

    for runtime in set(installed_runtimes()) & set(NOT_BY_DEFAULT):
        say(f"runtime {runtime} left out: {NOT_BY_DEFAULT[runtime]}")
    return tuple(r for r in installed_runtimes() if r not in NOT_BY_DEFAULT)


@dataclass
class Account:
    """Where a profile's wall time went, per runtime and PARTS; the rest is unaccounted. A replay's
    clock is simulated (replay.SimulatedClock)."""
    clock: Callable[[], float] = time.monotonic
    simulated: bool = False
    seconds: dict[tuple[str, str], float] = field(default_factory=dict)  # (runtime, part) -> s
    points: dict[str, int] = field(default_factory=dict)
    path_s: float = 0.0  # measuring the path around the instances (serving/paths.py)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def add(self, runtime: str, part: str, seconds: float) -> None:
        self.seconds[runtime, part] = self.seconds.get((runtime, part), 0.0) + seconds

    def wall(self) -> float:
        return self.clock() - self.started

    @contextlib.contextmanager
    def overlapping(self):
        """Parts timed side by side within the block: scaled so that together they take its wall time."""
        before, started = dict(self.seconds), time.monotonic()
        yield
        added = {key: seconds - before.get(key, 0.0) for key, seconds in self.seconds.items()}
        scale = min(1.0, (time.monotonic() - started) / (sum(added.values()) or 1.0))
        for key, seconds in added.items():
            self.seconds[key] = before.get(key, 0.0) + seconds * scale

    def to_json(self) -> dict:
        runtimes = sorted({r for r, _ in self.seconds} | set(self.points))
        wall = self.wall()
        return {"wall_s": round(wall, 1), "simulated": self.simulated, "path_s": round(self.path_s, 1),
                "unaccounted_s": round(wall - sum(self.seconds.values()) - self.path_s, 1),
                "runtimes": {r: {**{f"{part}_s": round(self.seconds.get((r, part), 0.0), 1) for part in PARTS},
                                 "points": self.points.get(r, 0)} for r in runtimes}}

    def lines(self) -> list[str]:
        found = self.to_json()
        rows = [f"  {r}: building {f['build_s']:.0f} s, loading {f['load_s']:.0f} s, measuring {f['measure_s']:.0f} s, "
                f"{f['points']} point(s)" for r, f in found["runtimes"].items()]
        if self.path_s:
            rows.append(f"  the path around the instances: {self.path_s:.0f} s")
        share = found["unaccounted_s"] / found["wall_s"] if found["wall_s"] else 0.0
        clock = " (simulated: what measuring would cost on the recorded machine)" if self.simulated else ""
        return [f"time: {found['wall_s']:.0f} s{clock}", *rows, f"  unaccounted: {found['unaccounted_s']:.0f} s ({share:.0%})"]


@dataclass(frozen=True)
class SearchResult:
    profile: profiles.Profile | None  # None: no point measured (a budget that ended first)
    points: int  # points measured (or looked up) in the file
    grid: int  # points of the grid under the runtimes searched
    budget_s: float | None
    stopped: str  # why the search ended
    misses: tuple[float, ...]  # log(measured / predicted) of each point measured after the fit
    account: Account
    within: float = math.inf  # how far the plans may be from the grid's best, by the fit (Search.within)

    def fit_error(self) -> dict:
        """How far the fit missed the points measured after it, relative: their count, median and worst."""
        errors = [abs(math.expm1(m)) for m in self.misses]
        return {"points": len(errors), "median": statistics.median(errors) if errors else None,
                "worst": max(errors, default=None)}

    def fit_line(self) -> str:
        found = self.fit_error()
        return (f"the fit missed the {found['points']} point(s) measured after it by {found['median']:.1%} (median), "
                f"{found['worst']:.1%} at worst" if found["points"] else "no point was measured after the fit")

    def to_json(self, out: Path) -> dict:
        return {"points": self.points, "grid": self.grid, "fraction": round(self.points / self.grid, 4),
                "budget_s": self.budget_s, "stopped": self.stopped, "fit_error": self.fit_error(), "out": str(out),
                "within": round(self.within, 4) if math.isfinite(self.within) else None,
                **self.account.to_json()}


def search_profile(settings: ProfileSettings, threads: list[int], batches: list[int], out: str | Path, *,
                   topology: Topology | None = None, replay: str | Path | None = None,
                   budget_s: float | None | str = SCALED, progress: bool = True,
                   runtimes: tuple[str, ...] = (DEFAULT_RUNTIME,), say=print, full_grid: bool = False,
                   every_runtime: bool = False, noise: float = 0.0, seed: int = 0,
                   costs: dict | None = None, path_probe=None) -> SearchResult:
    """Measure into `out` the points of threads × batches the search asks for (`full_grid`: every
    one) until it asks for none or `budget_s` has passed (None: no budget; SCALED: default_budget_s);
    points already in `out` are kept. With `replay`, points are looked up in that profile on a
    simulated clock (replay.py: `noise`, `seed`, `costs` overriding costs.Costs' fixed costs).
    `path_probe`: what measures the path around the instances at the end, by instance kind
    (serving/paths.py's measure_paths, passed by the commands above this stage; None: not measured)."""
    from packrat.profiling.builds import needs_build
    from packrat.profiling.replay import Replay, SimulatedClock
    from packrat.profiling.search import FullGrid, Search

    out, notes, built_lines = Path(out), [], []  # notes: said once a point is to be measured
    topology = topology or (Topology.virtual(max(threads)) if replay else cpu_budget().topology)
    budget_s = default_budget_s(topology.num_cores) if budget_s == SCALED else budget_s
    source = profiles.load(replay) if replay else None
    if source:
        settings = replace(settings, contention=source.loaded, served=source.has_served)
        clock = SimulatedClock()
        simulated = Replay(source, clock, replace(settings.costs, **(costs or {})), noise, seed)
        account = Account(clock=clock, simulated=True)
        meta = {**source.metadata, "latency": "loaded" if source.loaded else "isolated", "replayed_from": str(replay)}
        out.unlink(missing_ok=True)
        verdicts = {runtime: None for runtime in source.measured_runtimes}
    else:
        account, simulated = Account(), None
        if max(threads) > topology.num_cores:
            raise ValueError(f"--threads: {max(threads)} exceeds the {topology.num_cores} cores this process may use")
        if settings.served:
            payload_kind(settings)  # a payload the model cannot take is refused before any runtime is built
        with account.overlapping():  # inductor's first packages beside the other runtimes' artefacts
            early = _early_builds(settings, threads, batches, runtimes, topology, account, say)
            verdicts = check_runtimes(settings, runtimes, say, account)
            built_lines = early()
        meta = metadata(settings, topology, verdicts)
        settings, meta = resumed(settings, out, meta, notes.append)
    if all(verdicts.values()):
        raise ProfilingError("no runtime asked for can run the model: " + "; ".join(verdicts.values()))
    usable = [r for r, why in verdicts.items() if not why]
    plain = tuple(r for r in usable if r not in OPT_IN or source is not None)  # replayed: ios looked up like any
    costly = tuple(r for r in plain if (_replayed_needs_build(source, r) if source else needs_build(settings, r)))
    search = (FullGrid if full_grid else Search)(threads, batches, plain, cores=topology.num_cores, costly=costly)
    held = None if source else profiles.held(out)
    search.measured.update({(r, t, b): ms for (t, b, r), ms in (held.points() if held else {}).items()
                            if r in plain and t in search.threads and b in search.batches})
    bar = tqdm(total=search.grid_size, initial=len(search.measured), disable=not progress, unit="point",
               bar_format="{desc}: {n_fmt} of the grid's {total_fmt} points measured [{elapsed}]")
    failures: list[str] = []  # why each runtime that failed at a point was measured no further, in order
    start = simulated.workers if simulated else Workers
    with bar, profiles.ProfileWriter(out, meta) as writer, _WorkerPool(settings, topology, account, start) as pool:
        def measure_one(runtime: str, t: int, b: int) -> float:
            while notes:
                say(notes.pop(0))
            bar.set_description_str(f"{runtime}, threads={t} batch={b}")
            try:
                row = pool.measure(runtime, t, b)
            except ProfilingError as exc:
                failures.append(f"{runtime}: {exc}")
                raise
            writer.write(row)
            bar.update()
            account.points[runtime] = account.points.get(runtime, 0) + 1
            return planned_ms(row)

        builder = _Builder(settings, topology, account, say, writer, costly, simulated)
        for line in built_lines:
            writer.note("built", line)
        stopped = _walk(search, measure_one, builder, budget_s, account, pool, say)
        within = search.within()
        writer.note("search", f"{len(search.measured)} of the grid's {search.grid_size} points measured "
                              f"({len(search.measured) / search.grid_size:.0%}); {stopped}; {within_text(within)}"
                              + (f" ({', '.join(search.unmeasured())} not measured: the budget left no time for "
                                 f"its first points)" if search.unmeasured() else "")
                              + (f"; simulated: {account.wall():.0f} s on the recorded machine" if simulated else ""))
        if "ios" in usable and not source:
            _measure_ios(settings, out, plain, topology, writer, say, every_runtime, bar)
        bar.set_description_str("done")
    if failures and not search.measured:  # every runtime failed: no profile, and a rerun would fail alike
        raise ProfilingError(f"no point measured: every runtime failed; the first, {failures[0]}")
    if path_probe is not None and not source:
        _note_paths(settings, out, meta, topology, account, path_probe, say)
    result = SearchResult(profiles.held(out), len(search.measured), search.grid_size, budget_s, stopped,
                          tuple(search.errors.values()), account, within)
    if result.misses:
        with profiles.ProfileWriter(out, meta) as writer:
            writer.note("fit", result.fit_line())
    return result


def _note_paths(settings: ProfileSettings, out: Path, meta: dict, topology: Topology, account: Account,
                path_probe, say) -> None:
    """The path around each instance kind's served figure (`path_probe`: serving/paths.py's
    measure_paths), measured and noted in the profile where this run measured points or the file has
    no path yet; a probe that fails leaves the profile as it is (planned without the path), said."""
    held = profiles.held(out)
    if held is None or not held.has_served or ("path_ms" in held.metadata and not account.points):
        return
    began, found = time.monotonic(), {}
    try:
        found = path_probe(held, settings.model, settings.input_shape, topology, say)
    except Exception as exc:  # the points stand without it
        say(f"the path around the instances is not measured: {type(exc).__name__}: {exc}")
    account.path_s += time.monotonic() - began
    if found:
        with profiles.ProfileWriter(out, meta) as writer:
            writer.note("path_ms", profiles.path_text(found))


def within_text(within: float) -> str:
    """How far the plans may be from the grid's best, by the fit, in words."""
    return f"plans within {within:.0%} of the grid's best by the fit" if math.isfinite(within) else \
        "plans not bounded: a runtime's design points are not all measured"


def _replayed_needs_build(source: profiles.Profile, runtime: str) -> bool:
    """builds.needs_build on the recorded machine, from the replayed profile's head."""
    return runtime == DEFAULT_RUNTIME and source.metadata.get("mode") == "compile"


def _walk(search, measure_one, builder: "_Builder", budget_s: float | None, account: Account, pool, say) -> str:
    """Measure what the search asks for, a point at a time, the most value per second first among
    those the budget left affords; once it has passed, only what gives every batch a plan. A runtime
    failing at a point is measured no further."""
    from packrat.profiling.search import FullGrid

    forced = False

    def spent() -> bool:
        return forced or budget_s is not None and account.wall() >= budget_s

    while wanted := search.wanted(cover_only=spent()):
        covering = spent()
        ranked = _ranked(search, wanted, pool, builder)
        if not covering and budget_s is not None:
            ranked = [(key, cost) for key, cost in ranked if cost <= budget_s - account.wall()]
            if not ranked:
                forced = True
                continue
        key = ranked[0][0]
        if builder.needs(key):  # a wave: the most valuable packages wanted, one a core
            builder.build([k for k, _ in ranked if builder.needs(k)][:search.cores])
        try:
            search.record(*key, measure_one(*key))
        except ProfilingError as exc:
            say(f"runtime {key[0]} measured no further: {exc}")
            search.runtimes = tuple(r for r in search.runtimes if r != key[0])
    left = len(search.wanted())
    if isinstance(search, FullGrid):
        return "the whole grid measured"
    if left:
        return f"the budget of {budget_s:.0f} s ended (or affords no point) with {left} point(s) still asked for"
    return f"no unmeasured point can change a plan by more than {search.tolerance:.0%}"


def _ranked(search, wanted: dict, pool: "_WorkerPool", builder: "_Builder") -> list[tuple[tuple, float]]:
    """The points wanted with their predicted cost in seconds (costs.Costs), the most value per
    second first, ties cheapest first; before any fit a point's ms is guessed as b / t."""
    costs = pool.settings.costs
    predicted = search.predicted_ms(wanted)
    ranked = []
    for key, value in wanted.items():
        runtime, t, b = key
        live = (runtime, t) in pool.live
        ms = predicted[key] or b / t
        cost = (0.0 if live else costs.load_s) + costs.point_s(ms, first=not live, copies=pool.copies(t)) \
            + (costs.build_s if builder.needs(key) else 0.0)
        ranked.append((-value / cost if math.isfinite(value) else -math.inf, cost, key))
    return [(key, cost) for _, cost, key in sorted(ranked)]


class _Builder:
    """Builds what costly points need before they are measured (builds.py), or in a replay charges the
    simulated clock for them; the lines of what was built go to the profile's head."""

    def __init__(self, settings, topology, account, say, writer, costly, simulated=None):
        self.settings, self.topology, self.account, self.say = settings, topology, account, say
        self.writer, self.costly, self.simulated, self.done = writer, costly, simulated, set()

    def needs(self, key) -> bool:
        from packrat.profiling.builds import built

        runtime, t, b = key
        return runtime in self.costly and key not in self.done and (
            self.simulated is not None or not built(self.settings, t, b))

    def build(self, points) -> None:
        if self.simulated is not None:
            seconds = self.simulated.build(len(points), self.topology.num_cores)
            self.account.add(points[0][0], "build", seconds)
        else:
            for line in _build(self.settings, points, self.topology, self.account, self.say):
                self.writer.note("built", line)
        self.done.update(points)


def _build(settings: ProfileSettings, points, topology: Topology, account: Account, say) -> list[str]:
    """Every artefact `points` need, built before they are measured (builds.py): what was built, said
    and returned as lines for the profile's head."""
    from packrat.profiling.builds import build_all

    lines = []
    for runtime, done in build_all(settings, points, topology, say).items():
        account.add(runtime, "build", done["seconds"])
        if done["built"]:
            lines.append(f"{runtime}: {done['built']} built in {done['seconds']:.0f} s, {done['reused']} reused")
            say(f"built {lines[-1]}")
    return lines


def _early_builds(settings: ProfileSettings, threads, batches, runtimes, topology: Topology, account: Account, say):
    """Inductor's first packages (search.costly_design), built on the cores the other runtimes'
    conversions leave idle (none spare: the search builds them where worth it). The function
    returned waits for them and gives their lines."""
    import threading

    from packrat.profiling.builds import needs_build
    from packrat.profiling.search import costly_design

    lines: list[str] = []
    spare = topology.num_cores - len(conversions := _missing_artefacts(settings, runtimes))
    if DEFAULT_RUNTIME not in runtimes or len(runtimes) < 2 or not needs_build(settings, DEFAULT_RUNTIME) \
            or not conversions or spare < 1:
        return lambda: lines
    points = [(DEFAULT_RUNTIME, t, b) for t, b in costly_design(threads, batches)][:spare]
    worker = threading.Thread(target=lambda: lines.extend(_build(settings, points, topology.limited(spare), account,
                                                                 say)), name="packrat-early-builds", daemon=True)
    worker.start()
    return lambda: worker.join() or lines


class _WorkerPool:
    """Measuring workers by (runtime, threads), kept started between rounds (LIVE_COPIES_PER_CORE
    copies a core at most, the least recently used stopped first), their time to the account."""

    def __init__(self, settings: ProfileSettings, topology: Topology, account: Account, start=Workers):
        self.settings, self.topology, self.account, self.start = settings, topology, account, start
        self.live: dict[tuple[str, int], Workers] = {}

    def copies(self, threads: int) -> int:
        return copies_for(self.settings, threads, self.topology)

    def measure(self, runtime: str, threads: int, batch: int) -> dict:
        key = (runtime, threads)
        workers = self.live.pop(key, None)
        if workers is None:
            while self.live and sum(copies_for(self.settings, t, self.topology) for t in (threads, *(
                    t for _, t in self.live))) > LIVE_COPIES_PER_CORE * self.topology.num_cores:
                self._stop(*next(iter(self.live.items())))
            workers = self.start(replace(self.settings, runtime=runtime), threads, self.topology)
        self.live[key] = workers  # the last used last
        try:
            return workers.measure(batch)
        except ProfilingError:
            self._stop(key, self.live[key])
            raise

    def _stop(self, key: tuple[str, int], workers: Workers) -> None:
        self.live.pop(key, None)
        workers.close()
        self.account.add(key[0], "load", workers.load_s)
        self.account.add(key[0], "measure", workers.measure_s)

    def __enter__(self) -> "_WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        for key, workers in list(self.live.items()):
            self._stop(key, workers)


def run(settings: ProfileSettings, threads: list[int], batches: list[int], out: str | Path,
        topology: Topology | None = None, progress: bool = True, runtimes: tuple[str, ...] = (DEFAULT_RUNTIME,),
        say=print, every_runtime: bool = True) -> profiles.Profile:
    """Every missing point of the grid measured into `out` under each runtime that can run the model
    (search_profile with the full grid); the whole profile."""
    return search_profile(settings, threads, batches, out, topology=topology, budget_s=None, progress=progress,
                          runtimes=runtimes, say=say, full_grid=True, every_runtime=every_runtime).profile


def _measure_ios(settings: ProfileSettings, out: Path, plain: tuple[str, ...], topology: Topology,
                 writer: profiles.ProfileWriter, say, every_runtime: bool, bar) -> None:
    """Measure the ios runtime where it can gain (reach.ios_points on the plain runtimes' points; all
    of them with `every_runtime`), not again where `out` holds it."""
    held = profiles.held(out)
    figures = held.only(plain).latency if plain and held else {}
    if every_runtime or not plain:
        points = sorted(figures)
    else:
        points = reach.ios_points(figures)
        say(f"runtime ios: measured at {len(points)} point(s), those at batch ≤ {reach.IOS_MAX_BATCH} where the "
            f"other runtimes use less than {reach.IOS_EFFICIENCY:.0%} of the threads; --every-runtime measures "
            f"it everywhere")
    todo = [(t, b) for t, b in points if (t, b) not in (held.by_runtime.get("ios", {}) if held else {})]
    from packrat.ios_scheduler.cache import SEARCH_BUDGET_S  # torch: loaded by metadata() already

    bar.total += len(todo)
    for index, (t, b) in enumerate(todo, start=1):
        bar.set_description_str(f"ios point {index}/{len(todo)}: threads={t} batch={b} (its schedule searched "
                                f"first, up to {SEARCH_BUDGET_S:.0f} s, unless kept)")
        writer.write(measure(replace(settings, runtime="ios"), t, b, topology))
        bar.update()
