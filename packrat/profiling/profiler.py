"""Offline profiler: `packrat profile` measures L(t, b) into a profile file (profiles.py).

The search (search.py) picks the points of threads × batches that a plan on this machine's cores
depends on, round after round, until it asks for none or the budget has passed (search_profile;
run: the full grid). Each runtime asked for has its artefact built and checked against eager once
(check_runtimes: refused with the reason, kept in the profile's metadata, if it cannot run the
model or its outputs differ); a round's packages are built side by side before its points
(builds.py); each (runtime, threads) then walks its batches on workers started once (_WorkerPool,
measuring.Workers: loaded by copies of the point by default, served figures beside the model's).
Points are appended as they finish, so Ctrl-C leaves a valid file that the same command resumes;
a file of an older layout, or one taken model-only, is resumed model-only (said). The opt-in ios
runtime is measured after the others, where they leave threads idle (reach.py).
"""

from __future__ import annotations

import contextlib
import datetime
import math
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

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
    """`settings` and the head `meta` of a new profile, made to measure what `out` already holds:
    served figures of one payload, or model-only ones. A file without served figures (an older
    layout, or taken with --model-only) is resumed model-only when the payload was left to the
    default (said); asked for a payload it cannot hold, model-only figures into a served profile, or
    another model, mode or latency kind than it holds, ProfileError."""
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
    """Each runtime -> None when it can run the model (its artefact built and checked against
    eager, once per machine; the time it took to `account`), else why not (said at once: the user
    learns before any point is measured). Artefacts not built yet are built side by side, a process
    each, when there are several and cores for them."""
    from packrat.models import runtimes as engines
    from packrat.models.zoo import resolve

    spec = resolve(settings.model, settings.input_shape)
    artefacts = {engines.base_runtime(r): r for r in reversed(runtimes)  # both kinds of a runtime share one
                 if engines.base_runtime(r) in {*engines.SUFFIXES, *engines.CHECKED} and engines.installed(r)}
    paths = {r: engines.artefact_path(spec, r) for r in artefacts.values()}  # kept: built, or refused, here before
    missing = [r for r, path in paths.items() if not (path.exists() or engines.refusal(path).exists())]
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
# When the search starts no more points: with the builds before it and the points under way, a 16-core
# profile within 3 minutes (docs/profiling.md gives the account it rests on).
DEFAULT_BUDGET_S = 120.0
LIVE_COPIES_PER_CORE = 4  # measuring copies kept started between rounds, per core: each holds a model in memory
PARTS = ("build", "load", "measure")


def default_runtimes(say=print) -> tuple[str, ...]:
    """Every installed runtime but those NOT_BY_DEFAULT (each said, with why)."""
    from packrat.models.runtimes import installed_runtimes

    for runtime in set(installed_runtimes()) & set(NOT_BY_DEFAULT):
        say(f"runtime {runtime} left out: {NOT_BY_DEFAULT[runtime]}")
    return tuple(r for r in installed_runtimes() if r not in NOT_BY_DEFAULT)


@dataclass
class Account:
    """Where a profile's wall time went, per runtime: building (artefacts and packages), starting and
    loading measuring workers, measuring; what none of those covers is unaccounted."""
    started: float = field(default_factory=time.monotonic)
    seconds: dict[tuple[str, str], float] = field(default_factory=dict)  # (runtime, part) -> s
    points: dict[str, int] = field(default_factory=dict)
    wave_s: float = 0.0  # the longest a wave of builds (one a core, side by side) has taken

    def add(self, runtime: str, part: str, seconds: float) -> None:
        self.seconds[runtime, part] = self.seconds.get((runtime, part), 0.0) + seconds

    def wall(self) -> float:
        return time.monotonic() - self.started

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
        return {"wall_s": round(wall, 1), "unaccounted_s": round(wall - sum(self.seconds.values()), 1),
                "runtimes": {r: {**{f"{part}_s": round(self.seconds.get((r, part), 0.0), 1) for part in PARTS},
                                 "points": self.points.get(r, 0)} for r in runtimes}}

    def lines(self) -> list[str]:
        found = self.to_json()
        rows = [f"  {r}: building {f['build_s']:.0f} s, loading {f['load_s']:.0f} s, measuring {f['measure_s']:.0f} s, "
                f"{f['points']} point(s)" for r, f in found["runtimes"].items()]
        share = found["unaccounted_s"] / found["wall_s"] if found["wall_s"] else 0.0
        return [f"time: {found['wall_s']:.0f} s", *rows, f"  unaccounted: {found['unaccounted_s']:.0f} s ({share:.0%})"]


@dataclass(frozen=True)
class SearchResult:
    profile: profiles.Profile | None  # None: no point measured (a budget that ended first)
    points: int  # points measured (or looked up) in the file
    grid: int  # points of the grid under the runtimes searched
    budget_s: float | None
    stopped: str  # why the search ended
    misses: tuple[float, ...]  # log(measured / predicted) of each point measured after the fit
    account: Account

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
                **self.account.to_json()}


def search_profile(settings: ProfileSettings, threads: list[int], batches: list[int], out: str | Path, *,
                   topology: Topology | None = None, replay: str | Path | None = None,
                   budget_s: float | None = DEFAULT_BUDGET_S, progress: bool = True,
                   runtimes: tuple[str, ...] = (DEFAULT_RUNTIME,), say=print, full_grid: bool = False,
                   every_runtime: bool = False) -> SearchResult:
    """Measure into `out` the points of threads × batches a plan on this machine's cores depends on
    (search.Search; with `full_grid`, every point), under each runtime that can run the model, until
    the search asks for none or `budget_s` has passed (None: no budget); points already in `out` are
    kept. Each round's artefacts are built first (builds.py), then each (runtime, threads) walks its
    batches on workers started once (measuring.Workers). With `replay`, points are looked up in that
    profile instead, and `out` rewritten with them: a check of the search on a recorded table."""
    from packrat.profiling.builds import needs_build
    from packrat.profiling.search import FullGrid, Search

    out, account, notes, built_lines = Path(out), Account(), [], []  # notes: said once a point is to be measured
    topology = topology or (Topology.virtual(max(threads)) if replay else cpu_budget().topology)
    source = profiles.load(replay) if replay else None
    if source:
        settings = replace(settings, contention=source.loaded, served=source.has_served)
        meta = {**source.metadata, "latency": "loaded" if source.loaded else "isolated", "replayed_from": str(replay)}
        out.unlink(missing_ok=True)
        verdicts = {runtime: None for runtime in source.measured_runtimes}
    else:
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
    costly = () if source else tuple(r for r in plain if needs_build(settings, r))
    search = (FullGrid if full_grid else Search)(threads, batches, plain, cores=topology.num_cores, costly=costly)
    held = None if source else profiles.held(out)
    search.measured.update({(r, t, b): ms for (t, b, r), ms in (held.points() if held else {}).items()
                            if r in plain and t in search.threads and b in search.batches})
    bar = tqdm(total=search.grid_size, initial=len(search.measured), disable=not progress, unit="point",
               bar_format="{desc}: {n_fmt} of the grid's {total_fmt} points measured [{elapsed}]")
    failures: list[str] = []  # why each runtime that failed at a point was measured no further, in order
    with bar, profiles.ProfileWriter(out, meta) as writer, _WorkerPool(settings, topology, account) as pool:
        def measure_one(runtime: str, t: int, b: int) -> float:
            while notes:
                say(notes.pop(0))
            bar.set_description_str(f"{runtime}, threads={t} batch={b}")
            try:
                row = _replay_row(source, t, b, runtime) if source else pool.measure(runtime, t, b)
            except ProfilingError as exc:
                failures.append(f"{runtime}: {exc}")
                raise
            writer.write(row)
            bar.update()
            account.points[runtime] = account.points.get(runtime, 0) + 1
            return planned_ms(row)

        for line in built_lines:
            writer.note("built", line)

        def build(points, afford: int) -> list:
            """The points ready to measure: those built already, and at most `afford` built now."""
            from packrat.profiling.builds import built

            ready = [p for p in points if p[0] not in costly or built(settings, p[1], p[2])]
            todo = [p for p in points if p not in ready][:afford]
            for line in _build(settings, todo, topology, account, say) if todo else ():
                writer.note("built", line)
            return ready + todo

        stopped = _walk(search, measure_one, None if source else build, budget_s, account, say)
        writer.note("search", f"{len(search.measured)} of the grid's {search.grid_size} points measured "
                              f"({len(search.measured) / search.grid_size:.0%}); {stopped}")
        if "ios" in usable and not source:
            _measure_ios(settings, out, plain, topology, writer, say, every_runtime, bar)
        bar.set_description_str("done")
    if failures and not search.measured:  # every runtime failed: no profile, and a rerun would fail alike
        raise ProfilingError(f"no point measured: every runtime failed; the first, {failures[0]}")
    result = SearchResult(profiles.held(out), len(search.measured), search.grid_size, budget_s, stopped,
                          tuple(search.errors.values()), account)
    if result.misses:
        with profiles.ProfileWriter(out, meta) as writer:
            writer.note("fit", result.fit_line())
    return result


def _walk(search, measure_one, build, budget_s: float | None, account: Account, say) -> str:
    """Measure what the search asks for, round after round, until it asks for nothing; why it ended.
    A round measures the points with nothing (left) to build first, each (runtime, threads) group
    cheapest first, then builds what the budget affords of the rest and measures it. Once `budget_s` has passed, the search asks only
    for what gives every batch of the grid a plan, with no build where another runtime can give it:
    a profile that ends at its budget still plans. A runtime failing at a point is measured no further."""
    from packrat.profiling.search import FullGrid

    def spent() -> bool:
        return budget_s is not None and account.wall() >= budget_s

    while points := search.next_points(cover_only=spent()):
        before, covering = len(search.measured), spent()
        ready = build(points, 0) if build else points  # built already (or needing nothing): measured first
        later = sorted((p for p in points if p not in ready), key=lambda p: (p[2] / p[1], p))
        for part in (ready, later):
            if part is later and part:
                part = build(part, _affordable(account, budget_s, search.cores) if budget_s is not None else len(part))
            _measure_groups(search, part, measure_one, say, (lambda: False) if covering else spent)
        if len(search.measured) == before:  # what is left needs a build the budget no longer has
            break
    left = len(search.next_points())
    if isinstance(search, FullGrid):
        return "the whole grid measured"
    if left:
        return f"the budget of {budget_s:.0f} s ended (or affords no build) with {left} point(s) still asked for"
    return f"no unmeasured point can change a plan by more than {search.tolerance:.0%}"


def _affordable(account: Account, budget_s: float, cores: int) -> int:
    """Builds the budget left affords, their points measured after them: a wave of builds, one a core,
    as long as the longest so far, its points half as long again (no wave yet: one, while any is left)."""
    left = budget_s - account.wall()
    if left <= 0:
        return 0
    return cores * int(left // (1.5 * account.wave_s)) if account.wave_s else cores


def _measure_groups(search, points, measure_one, say, spent) -> None:
    """`points` measured by (runtime, threads), the groups cheapest first (Σ b / t), each walking its
    batches upwards, until spent(); a runtime failing at a point is measured no further."""
    groups: dict[tuple[str, int], list[int]] = {}
    for runtime, t, b in points:
        groups.setdefault((runtime, t), []).append(b)
    for (runtime, t), sizes in sorted(groups.items(), key=lambda g: (sum(g[1]) / g[0][1], g[0])):
        for b in sorted(sizes):
            if runtime not in search.runtimes or spent():
                break
            try:
                search.record(runtime, t, b, measure_one(runtime, t, b))
            except ProfilingError as exc:
                say(f"runtime {runtime} measured no further: {exc}")
                search.runtimes = tuple(r for r in search.runtimes if r != runtime)


def _build(settings: ProfileSettings, points, topology: Topology, account: Account, say) -> list[str]:
    """Every artefact `points` need, built before they are measured (builds.py): what was built, said
    and returned as lines for the profile's head."""
    from packrat.profiling.builds import build_all

    lines = []
    for runtime, done in build_all(settings, points, topology, say).items():
        account.add(runtime, "build", done["seconds"])
        waves = -(-done["built"] // topology.num_cores)
        account.wave_s = max(account.wave_s, done["seconds"] / waves if waves else 0.0)
        if done["built"]:
            lines.append(f"{runtime}: {done['built']} built in {done['seconds']:.0f} s, {done['reused']} reused")
            say(f"built {lines[-1]}")
    return lines


def _early_builds(settings: ProfileSettings, threads, batches, runtimes, topology: Topology, account: Account, say):
    """Inductor's first packages (search.costly_design), built beside the other runtimes' artefacts
    being converted; the function returned waits for them and gives their lines."""
    import threading

    from packrat.profiling.builds import needs_build
    from packrat.profiling.search import costly_design

    lines: list[str] = []
    if DEFAULT_RUNTIME not in runtimes or len(runtimes) < 2 or not needs_build(settings, DEFAULT_RUNTIME):
        return lambda: lines
    points = [(DEFAULT_RUNTIME, t, b) for t, b in costly_design(threads, batches)]
    worker = threading.Thread(target=lambda: lines.extend(_build(settings, points, topology, account, say)),
                              name="packrat-early-builds", daemon=True)
    worker.start()
    return lambda: worker.join() or lines


class _WorkerPool:
    """Measuring workers by (runtime, threads), kept started between rounds (LIVE_COPIES_PER_CORE
    copies a core at most: the least recently used are stopped first); their start and their runs go
    to the account."""

    def __init__(self, settings: ProfileSettings, topology: Topology, account: Account):
        self.settings, self.topology, self.account = settings, topology, account
        self.live: dict[tuple[str, int], Workers] = {}

    def measure(self, runtime: str, threads: int, batch: int) -> dict:
        key = (runtime, threads)
        workers = self.live.pop(key, None)
        if workers is None:
            while self.live and sum(copies_for(self.settings, t, self.topology) for t in (threads, *(
                    t for _, t in self.live))) > LIVE_COPIES_PER_CORE * self.topology.num_cores:
                self._stop(*next(iter(self.live.items())))
            workers = Workers(replace(self.settings, runtime=runtime), threads, self.topology)
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
    """Measure the ios runtime, after the plain runtimes, where it can gain (reach.ios_points on the
    points they measured); at each of those points with `every_runtime` or without a plain runtime;
    not again where `out` holds it. Each point's schedule is searched first (measuring.Workers)."""
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


def _replay_row(source: profiles.Profile, threads: int, batch: int, runtime: str = DEFAULT_RUNTIME) -> dict:
    points = source.by_runtime.get(runtime, {})
    if (threads, batch) not in points:
        raise ProfilingError(f"the replayed profile has no point threads={threads} batch={batch} ({runtime})")
    row = {"threads": threads, "batch": batch, "runtime": runtime}
    row["latency_ms"], row["isolated_ms"] = points[threads, batch]
    if (threads, batch) in source.served.get(runtime, {}):
        row["served_ms"], row["served_isolated_ms"] = source.served[runtime][threads, batch]
    return row
