"""Profile files: L(t, b), the latency of one instance with t threads at batch b.

Columns and keys: docs/reference/profile-format.md. A loaded profile (``# latency: loaded``) holds
the figure measured beside ``copies`` copies of the point and, where measured, the lone one
(``isolated_ms``); an isolated one (no such key: older files, the published layout) the lone one only.
A point may be held under several runtimes; its figure is the one choose_runtime picks. A profile
whose every point has served figures plans on them (``basis``); model_points() are the model-only
ones, which the pool's served corrections compare with. A profile's ``path_ms`` line (serving/paths.py
measures it) holds what a pool's batch costs around its served figure, per instance kind and batch;
load() adds it to the served figures, so they are what a pool serves, its hop included.
"""

from __future__ import annotations

import csv
import re
import math
from dataclasses import dataclass, field
from pathlib import Path

from packrat.errors import ProfileError
from packrat.models.runtimes import RUNTIMES, base_runtime, instance_kind
from packrat.settings import RUNTIME_MARGIN

REQUIRED = ("threads", "batch", "latency_ms")
COLUMNS = ("threads", "batch", "latency_ms", "isolated_ms", "copies", "p50_ms", "p99_ms", "std_ms", "iterations",
           "runtime", "mad_ms", "served_ms", "served_isolated_ms", "served_mad_ms")
# Older layouts, still appended to (model-only figures; without runtimes: inductor's points only).
NO_SERVED_COLUMNS = COLUMNS[:-3]
NO_MAD_COLUMNS = NO_SERVED_COLUMNS[:-1]
NO_RUNTIME_COLUMNS = NO_SERVED_COLUMNS[:-2]
LEGACY_COLUMNS = ("threads", "batch", "latency_ms", "p50_ms", "p99_ms", "std_ms", "iterations")
DEFAULT_RUNTIME = "inductor"  # a row without a runtime: packrat.models.runtimes.DEFAULT_RUNTIME
LATENCIES = ("loaded", "isolated")  # values of the `latency` metadata key and of items(latency=...)
BASES = ("served", "model")  # what a profile's planned figures time (Profile.basis, Profile.on)
DEFAULT_FOLDER = Path("profiles")
_PUBLISHED = {"threads": "intraop_threads", "batch": "batch_size", "latency_ms": "latency(avg)"}


def default_path(model: str, prefix: str = "") -> Path:
    """Where a model's profile is kept when none is named: profiles/[prefix]MODEL.csv, MODEL being
    the zoo name or the stem of the model's file, a colon made an underscore (hf:DIR → hf_DIR)."""
    return DEFAULT_FOLDER / f"{prefix}{Path(model).stem.replace(':', '_')}.csv"


Point = tuple[int, int]  # (threads, batch)
Figures = tuple[float, float | None]  # (primary, isolated: None where only the loaded one was measured)


@dataclass
class Profile:
    latency: dict[tuple[int, int], float]  # (threads, batch) -> mean latency in ms: the primary figure planned with
    metadata: dict[str, str] = field(default_factory=dict)
    rows: list[dict[str, str]] = field(default_factory=list)
    isolated: dict[tuple[int, int], float] = field(default_factory=dict)  # measured alone; == latency if isolated
    runtimes: dict[tuple[int, int], str] = field(default_factory=dict)  # the runtime whose figures those are
    # every runtime's model-only figures: runtime -> (threads, batch) -> (primary, isolated)
    by_runtime: dict[str, dict[tuple[int, int], tuple[float, float]]] = field(default_factory=dict)
    spread: dict[str, dict[tuple[int, int], float]] = field(default_factory=dict)  # runtime -> point -> spread ms
    # every runtime's served figures (decode + model + encode), where measured, and their spreads
    served: dict[str, dict[Point, Figures]] = field(default_factory=dict)
    served_spread: dict[str, dict[Point, float]] = field(default_factory=dict)
    basis: str = "model"  # BASES: which figures latency, isolated and runtimes hold (load() says served when it can)

    @property
    def measured_runtimes(self) -> list[str]:
        """The runtimes this profile holds points of, inductor first."""
        return sorted(self.by_runtime, key=lambda r: (r != DEFAULT_RUNTIME, r)) or [DEFAULT_RUNTIME]

    def add(self, runtime: str, threads: int, batch: int, latency: float, isolated: float | None,
            spread: float = 0.0, served: tuple[float, float | None, float] | None = None) -> None:
        """One runtime's point (`isolated` None: only loaded; `served`: primary, isolated or None,
        spread); ⟨t, b⟩'s figure is then the one runtime_for chooses."""
        self.by_runtime.setdefault(runtime, {})[threads, batch] = (latency, isolated)
        self.spread.setdefault(runtime, {})[threads, batch] = spread
        if served is not None:
            self.served.setdefault(runtime, {})[threads, batch] = served[:2]
            self.served_spread.setdefault(runtime, {})[threads, batch] = served[2]
        else:
            self.served.get(runtime, {}).pop((threads, batch), None)
        self._choose(threads, batch)

    def _tables(self) -> tuple[dict[str, dict[Point, Figures]], dict[str, dict[Point, float]]]:
        """The figures planned with, and their spreads: the served ones or the model-only ones."""
        if self.basis == "served":
            return self.served, self.served_spread
        return self.by_runtime, self.spread

    def _choose(self, threads: int, batch: int) -> None:
        """⟨t, b⟩'s planned figures: those of the runtime runtime_for chooses."""
        chosen = self.runtime_for(threads, batch)
        self.latency[threads, batch], isolated = self._tables()[0][chosen][threads, batch]
        self.runtimes[threads, batch] = chosen
        if isolated is None:
            self.isolated.pop((threads, batch), None)
        else:
            self.isolated[threads, batch] = isolated

    def runtime_for(self, threads: int, batch: int) -> str:
        """The runtime whose figure ⟨t, b⟩ takes (choose_runtime), chosen on the figures planned
        with (the served ones where the profile plans on them: the runtime that serves fastest)."""
        tables, spreads = self._tables()
        return choose_runtime({r: (points[threads, batch][0], spreads[r][threads, batch])
                               for r, points in tables.items() if (threads, batch) in points})

    @property
    def has_served(self) -> bool:
        """Whether every point, under every runtime, has its served figure (so it can be planned on)."""
        return bool(self.by_runtime) and all(
            set(points) == set(self.served.get(runtime, {})) for runtime, points in self.by_runtime.items())

    @property
    def payload(self) -> str | None:
        """The payload the served figures were measured from (jpeg, text, raw), None without them."""
        return self.metadata.get("payload") if self.has_served else None

    def on(self, basis: str) -> "Profile":
        """This profile planning on `basis`: "served" (ProfileError without served figures for every
        point) or "model" (the model-only figures, which every profile has)."""
        if basis not in BASES:
            raise ValueError(f"basis must be one of {', '.join(BASES)}, not {basis!r}")
        if basis == "served" and not self.has_served:
            raise ProfileError(f"{self.metadata.get('model', 'this')} profile has no served figures for every point: "
                               f"re-run `packrat profile` without --model-only into another --out")
        return self if basis == self.basis else self._rebuilt(basis=basis)

    def _rebuilt(self, runtimes=None, model_ms: dict | None = None, basis: str | None = None) -> "Profile":
        """A copy of the points of `runtimes` (None: all), model-only figures replaced by `model_ms`
        (served ones moved by as much), planning on `basis` (None: this one's)."""
        kept = Profile(latency={}, metadata=dict(self.metadata), rows=list(self.rows), basis=basis or self.basis)
        for runtime in self.by_runtime if runtimes is None else runtimes:
            for (t, b), (latency, isolated) in self.by_runtime.get(runtime, {}).items():
                new = (model_ms or {}).get((t, b, runtime), latency)
                served = None
                if (t, b) in self.served.get(runtime, {}):
                    served_ms, served_isolated = self.served[runtime][t, b]
                    if new != latency:  # corrected: the batch as served takes at least its model stage
                        served_ms = max(served_ms + new - latency, new)
                    served = (served_ms, served_isolated, self.served_spread[runtime][t, b])
                kept.add(runtime, t, b, new, isolated, self.spread[runtime][t, b], served)
        return kept

    def fallbacks(self) -> dict[tuple[int, int], tuple[str, ...]]:
        """Each point's runtimes, fastest first (on the planned figures): what an instance runs
        instead when the chosen one fails on the serving machine."""
        points: dict[tuple[int, int], list[tuple[float, str]]] = {}
        for runtime, figures in self._tables()[0].items():
            for point, (latency, _) in figures.items():
                points.setdefault(point, []).append((latency, runtime))
        return {point: tuple(r for _, r in sorted(found)) for point, found in points.items()}

    def points(self) -> dict[tuple[int, int, str], float]:
        """Every runtime's primary figure as planned with (served where the profile plans on served
        figures), keyed (threads, batch, runtime)."""
        return _keyed(self._tables()[0])

    def spread_ms(self, threads: int, batch: int, runtime: str) -> float:
        """The noise of a point's figure as planned with (its iterations' spread; 0 where unknown)."""
        return self._tables()[1].get(runtime, {}).get((threads, batch), 0.0)

    def model_points(self) -> dict[tuple[int, int, str], float]:
        """Every runtime's model-only primary figure, keyed (threads, batch, runtime): what a pool
        instance's model stage (the run alone) is compared with."""
        return _keyed(self.by_runtime)

    def corrected(self, figures) -> "Profile":
        """This profile with some (threads, batch, runtime) model-only figures replaced by what the
        instances' model stage served (served figures moved by as much), runtimes chosen again."""
        return self._rebuilt(model_ms=figures)

    def only(self, runtimes) -> "Profile":
        """This profile with the points of `runtimes` alone (say, those installed where it is served)."""
        return self._rebuilt(runtimes=list(runtimes))

    @property
    def loaded(self) -> bool:
        """Whether `latency` holds loaded figures (a contention profile)."""
        return _kind(self.metadata) == "loaded"

    @property
    def figures(self) -> tuple[str, ...]:
        """The figures this profile holds for every point, primary first: ('loaded', 'isolated'),
        ('loaded',) (isolated figures only where one copy fits) or ('isolated',)."""
        if not self.loaded:
            return ("isolated",)
        return LATENCIES if set(self.isolated) == set(self.latency) else ("loaded",)

    @property
    def bound(self) -> str | None:
        """How far its plans may be from the grid's best by the search's fit, as its `# search:` line
        says ("plans within 2% of the grid's best by the fit"); None for a profile without one."""
        found = re.search(r"plans (?:within \S+ of the grid's best|not bounded)[^;]*", self.metadata.get("search", ""))
        return found.group(0) if found else None

    def describe(self) -> str:
        """What its figures are, in a line (logged when a server plans with it)."""
        return self._figures() + (f"; the search: {self.bound}" if self.bound else "")

    def _figures(self) -> str:
        if self.basis == "served":
            path = ", with the path around it measured through a pool" if self.metadata.get("path_ms") else ""
            what = (f"served figures (each sub-batch answered from {self.metadata.get('payload', '?')} bodies: "
                    f"decode, model, encode, as an instance does{path}); ")
        elif self.has_served:
            what = "model-only figures (asked for; the profile has served ones too); "
        else:
            what = "model-only figures (the model alone on example tensors, without decoding the requests); "
        if self.loaded:
            alone = "" if "isolated" in self.figures else "; alone only where no second copy fits"
            return f"{what}loaded: each point measured while ⌊T/t⌋ copies of it ran side by side{alone}"
        return (f"{what}isolated: each point measured alone on an idle machine (the default before issue 32); "
                "plans of several instances may serve slower than predicted: re-profile to measure them loaded")

    @property
    def threads(self) -> list[int]:
        return sorted({t for t, _ in self.latency})

    @property
    def batches(self) -> list[int]:
        return sorted({b for _, b in self.latency})

    def items(self, latency: str | None = None) -> list[tuple[int, int, float]]:
        """The profiled points as (threads, batch, ms), sorted: the primary figure (None), or the
        'loaded' or 'isolated' one."""
        if latency not in (None, *LATENCIES):
            raise ValueError(f"latency must be one of {', '.join(LATENCIES)}, not {latency!r}")
        if latency == "loaded" and not self.loaded:
            raise ProfileError(f"{self.metadata.get('model', 'this')} profile has no loaded latencies: it was "
                               f"measured in isolation; re-run `packrat profile --contention`")
        if latency == "isolated" and "isolated" not in self.figures:
            raise ProfileError(f"{self.metadata.get('model', 'this')} profile has isolated latencies only for the "
                               f"points served alone: re-run `packrat profile --contention --isolated-too`")
        table = self.isolated if latency == "isolated" else self.latency
        return [(t, b, table[t, b]) for t, b in sorted(table)]


def _keyed(tables: dict[str, dict[Point, Figures]]) -> dict[tuple[int, int, str], float]:
    """Each runtime's primary figures keyed (threads, batch, runtime)."""
    return {(t, b, runtime): latency for runtime, figures in tables.items() for (t, b), (latency, _) in figures.items()}


def gains(profile: Profile, instances, runtime: str = "ios") -> list[dict]:
    """What `runtime` gained where a plan runs it: for each distinct ⟨t, b⟩ of `instances` (a plan's:
    threads, batch, runtime) that runs it, its planned figure against the fastest other runtime's at
    that point ("against" None where no other runtime was measured there)."""
    points = profile.points()
    found = []
    for t, b in sorted({(i.threads, i.batch) for i in instances if i.runtime == runtime}):
        others = {r: ms for (pt, pb, r), ms in points.items() if (pt, pb) == (t, b) and r != runtime}
        other = min(others, key=others.get, default=None)
        found.append({"threads": t, "batch": b, "runtime": runtime, "ms": points.get((t, b, runtime)),
                      "against": other, "against_ms": others.get(other)})
    return found


def choose_runtime(figures: dict[str, tuple[float, float]]) -> str:
    """The runtime a point's figure is taken from, given each runtime's (ms, spread): the first
    (_preference) until another beats it by more than either spread and RUNTIME_MARGIN (issue 63)."""
    chosen = min(figures, key=_preference)
    while True:
        latency, spread = figures[chosen]
        beating = [r for r, (ms, noise) in figures.items()
                   if ms < latency - max(spread, noise, RUNTIME_MARGIN * latency)]
        if not beating:
            return chosen
        chosen = min(beating, key=_preference)


def _preference(runtime: str) -> tuple[int, bool, str]:
    """Inductor first, then RUNTIMES' order; of one runtime's kinds the thread kind first: its path
    around the model is the shorter (in a point's served figure only where the profile's `path_ms`
    line measured it)."""
    base = base_runtime(runtime)
    return (RUNTIMES.index(base) if base in RUNTIMES else len(RUNTIMES), instance_kind(runtime) != "thread", runtime)


def _parse_number(text: str, kind: type, what: str) -> float:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise ValueError(f"{what} is not {'an integer' if kind is int else 'a number'}: {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise ValueError(f"{what} is not finite: {text!r}")
    return value


def _read_lines(path: Path) -> tuple[dict[str, str], list[tuple[int, str]]]:
    """Metadata from '# key: value' lines (leading ones; and notes among the rows, such as a runtime
    the profiler dropped, whose values join a key's earlier ones with '; '), and the rest with
    1-based line numbers."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    metadata: dict[str, str] = {}
    body: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("#"):
            key, sep, value = line[1:].partition(":")
            if sep and body and key.strip() in metadata:
                metadata[key.strip()] += "; " + value.strip()
            elif sep:
                metadata[key.strip()] = value.strip()
        elif line.strip():
            body.append((number, line))
    return metadata, body


def load(path: str | Path) -> Profile:
    """Read and validate a profile; raise ProfileError naming the file, row and problem."""
    path = Path(path)
    metadata, body = _read_lines(path)
    if not body:
        raise ProfileError(f"{path}: empty profile (no header)")
    numbers = [n for n, _ in body]
    reader = csv.DictReader([line for _, line in body])
    header = [h.strip() for h in (reader.fieldnames or [])]
    reader.fieldnames = header
    columns = {name: name for name in REQUIRED}
    published = all(c in header for c in _PUBLISHED.values()) and "benchmark" in header
    if published and not all(c in header for c in REQUIRED):
        columns = _PUBLISHED
    missing = [name for name in REQUIRED if columns[name] not in header]
    if missing:
        raise ProfileError(f"{path}: missing column {missing[0]!r} (header is: {','.join(header)})")
    loaded = _is_loaded(path, metadata, header)
    try:
        paths = parse_paths(metadata.get("path_ms", ""))
    except ValueError as exc:
        raise ProfileError(f"{path}: metadata 'path_ms': {exc}") from None

    profile = Profile(latency={}, metadata=metadata)
    # a profile taken whole with IOS instances (`# mode: ios`, before IOS became a runtime) holds the ios runtime's points
    default_runtime = "ios" if metadata.get("mode") == "ios" else DEFAULT_RUNTIME
    for number, row in zip(numbers[1:], reader):
        if columns is _PUBLISHED and not (row.get("benchmark", "").endswith("_manual_script")
                                          and row.get("topology", "sequential") == "sequential"):
            continue
        where = f"{path}: row {number}"
        runtime = (row.get("runtime") or "").strip() or default_runtime
        try:
            threads = _parse_number(row[columns["threads"]], int, "threads")
            batch = _parse_number(row[columns["batch"]], int, "batch")
            latency = _parse_latency(row[columns["latency_ms"]], "latency_ms")
            isolated = latency if not loaded else _isolated(row)
            spread = _spread(row)
            served = _with_path(_served(row, loaded), path_at(paths, instance_kind(runtime), batch))
        except ValueError as exc:
            raise ProfileError(f"{where}: {exc}") from None
        if threads < 1 or batch < 1:
            raise ProfileError(f"{where}: threads and batch must be >= 1, got threads={threads} batch={batch}")
        if (threads, batch) in profile.by_runtime.get(runtime, {}):
            raise ProfileError(f"{where}: duplicate point threads={threads} batch={batch} runtime={runtime}")
        profile.add(runtime, threads, batch, latency, isolated, spread, served)
        profile.rows.append({k: v for k, v in row.items() if k is not None})
    if not profile.latency:
        raise ProfileError(f"{path}: no data rows")
    if profile.has_served:  # a point's figure is what is served: planned on, wherever every point has it
        profile = profile.on("served")
    profile.metadata.setdefault("mode", "script")  # files from before compile were TorchScript (or say eager)
    if columns is _PUBLISHED:
        profile.metadata.setdefault("model", profile.rows[0]["benchmark"].removesuffix("_manual_script"))
        profile.metadata.setdefault("source", "published Packrat measurements (TorchScript, sequential pinning)")
    return profile


Paths = dict[str, dict[int, float]]  # instance kind -> batch -> ms a batch costs around its served figure


def parse_paths(text: str) -> Paths:
    """A `path_ms` line, e.g. "process 1:0.41 8:0.53; thread 1:0.30 8:0.38" (a kind named again, in
    a resumed file's later note, takes the later figures)."""
    paths: Paths = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        kind, *points = part.split()
        if kind not in ("process", "thread") or not points:
            raise ValueError(f"{part!r} is not 'process|thread BATCH:MS ...'")
        figures = {}
        for point in points:
            batch, sep, ms = point.partition(":")
            if not sep:
                raise ValueError(f"{point!r} is not BATCH:MS")
            figures[_parse_number(batch, int, "batch")] = _parse_number(ms, float, "path ms")
        if min(figures) < 1 or min(figures.values()) < 0:
            raise ValueError(f"{part!r}: batches from 1, figures from 0")
        paths[kind] = figures
    return paths


def path_text(paths: Paths) -> str:
    """The `path_ms` line of `paths` (parse_paths reads it back)."""
    return "; ".join(f"{kind} " + " ".join(f"{b}:{ms:.4f}" for b, ms in sorted(figures.items()))
                     for kind, figures in sorted(paths.items()))


def path_at(paths: Paths, kind: str, batch: int) -> float:
    """The path's ms for a batch of `batch` in an instance of `kind`: straight between the measured
    batches, and beyond them along the nearest two (the bodies copied and answers sent grow with the
    batch), never below 0; 0 for a kind not measured."""
    figures = sorted(paths.get(kind, {}).items())
    if len(figures) < 2:
        return figures[0][1] if figures else 0.0
    index = next((i for i, (b, _) in enumerate(figures[1:-1], start=1) if batch <= b), len(figures) - 1)
    (b0, ms0), (b1, ms1) = figures[index - 1], figures[index]
    return max(0.0, ms0 + (ms1 - ms0) * (batch - b0) / (b1 - b0))


def _with_path(served: tuple[float, float | None, float] | None, path_ms: float):
    """A row's served figures (_served) with the path around them added."""
    if served is None or not path_ms:
        return served
    figure, isolated, spread = served
    return figure + path_ms, None if isolated is None else isolated + path_ms, spread


def held(path: str | Path) -> Profile | None:
    """The profile at `path`; None for no file, an empty one, or one cut before its first row (resumed)."""
    path = Path(path)
    if not path.exists() or len(_read_lines(path)[1]) <= 1:
        return None
    return load(path)


def _parse_latency(text: str, what: str) -> float:
    value = _parse_number(text, float, what)
    if value <= 0:
        raise ValueError(f"{what} must be > 0, got {value}")
    return value


def _isolated(row: dict[str, str], column: str = "isolated_ms") -> float | None:
    """A loaded row's lone figure: None where not measured, which only a point with copies may lack."""
    copies = (row.get("copies") or "").strip()
    if not (row.get(column) or "").strip() and copies and _parse_number(copies, int, "copies") > 1:
        return None
    return _parse_latency(row.get(column), column)


def _served(row: dict[str, str], loaded: bool) -> tuple[float, float | None, float] | None:
    """A row's served figures (primary, isolated or None, spread); None where it has none."""
    if not (row.get("served_ms") or "").strip():
        return None
    served = _parse_latency(row["served_ms"], "served_ms")
    isolated = _isolated(row, "served_isolated_ms") if loaded else served
    spread = row.get("served_mad_ms") or ""
    return served, isolated, _parse_number(spread, float, "served_mad_ms") if spread.strip() else 0.0


def _kind(metadata: dict[str, str]) -> str:
    """'loaded' or 'isolated', from the `latency` key; files from before contention profiles lack it."""
    return metadata.get("latency", "isolated")


def _is_loaded(path: Path, metadata: dict[str, str], header: list[str]) -> bool:
    kind = _kind(metadata)
    if kind not in LATENCIES:
        raise ProfileError(f"{path}: metadata 'latency: {kind}' is neither {' nor '.join(LATENCIES)}")
    if kind == "loaded" and "isolated_ms" not in header:
        raise ProfileError(f"{path}: a loaded profile ('# latency: loaded') needs an isolated_ms column "
                           f"(header is: {','.join(header)})")
    return kind == "loaded"


class ProfileWriter:
    """Appends points to a profile file, one flushed line each: an interrupted run leaves a valid
    file. `metadata` heads a new file; appending a kind (`latency` key) to a file of the other is
    refused; an older layout is appended to as it is (`served`: whether it holds served figures)."""

    def __init__(self, path: str | Path, metadata: dict[str, str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        columns = COLUMNS if new else _appendable_columns(self.path, _kind(metadata))
        if not new:
            _add_runtimes(self.path, metadata.get("runtimes", ""))
        self._file = self.path.open("a", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=columns, extrasaction="ignore")
        self.served = "served_ms" in columns
        if new:
            for key, value in metadata.items():
                self._file.write(f"# {key}: {value}\n")
            self._csv.writeheader()
            self._file.flush()

    def write(self, point: dict[str, float | int | str]) -> None:
        runtime = point.get("runtime") or DEFAULT_RUNTIME
        if "runtime" not in self._csv.fieldnames and runtime != DEFAULT_RUNTIME:
            raise ProfileError(f"{self.path}: its layout has no runtime column, so it can hold inductor's points "
                               f"only, not {runtime}'s: choose another --out")
        point = {**point, "runtime": runtime}
        self._csv.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in point.items()})
        self._file.flush()

    def note(self, key: str, value: str) -> None:
        """A '# key: value' line among the rows: read into the metadata (joined to the key's values)."""
        self._file.write(f"# {key}: {value}\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "ProfileWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _add_runtimes(path: Path, runtimes: str) -> None:
    """A resumed file's `# runtimes:` line names the runtimes a later run adds too (the file
    rewritten whole, then renamed: never half written)."""
    lines = path.read_text().splitlines(keepends=True)
    for index, line in enumerate(lines):
        if not line.startswith("#"):
            return
        if line.startswith("# runtimes:"):
            held = [r for r in line.partition(":")[2].strip().split(",") if r]
            more = [r for r in runtimes.split(",") if r and r not in held]
            if more:
                lines[index] = f"# runtimes: {','.join(held + more)}\n"
                partial = path.with_name(path.name + ".tmp")
                partial.write_text("".join(lines))
                partial.replace(path)
            return


def _spread(row: dict) -> float:
    """A point's noise, as runtime_for weighs it: mad_ms, else std_ms (older profiles), else 0."""
    for column in ("mad_ms", "std_ms"):
        if (row.get(column) or "").strip():
            return _parse_number(row[column], float, column)
    return 0.0


def _appendable_columns(path: Path, kind: str) -> tuple[str, ...]:
    """The columns to append to `path` with: only our layouts, holding the same kind, take more."""
    metadata, body = _read_lines(path)
    header = tuple(body[0][1].strip().split(",")) if body else ()
    if header not in (COLUMNS, NO_SERVED_COLUMNS, NO_MAD_COLUMNS, NO_RUNTIME_COLUMNS, LEGACY_COLUMNS):
        raise ProfileError(f"{path}: cannot append: header is {','.join(header)!r}, expected {','.join(COLUMNS)!r}")
    existing = _kind(metadata)
    if existing != kind:
        raise ProfileError(f"{path}: cannot append {kind} measurements to a profile of {existing} ones")
    return header


def choose(metadatas: list[dict], cpu_model: str | None, cores: int) -> tuple[int, str]:
    """Which of an archive's profiles to plan with on `cpu_model` with `cores` cores budgeted (its
    index, and why), by the rule docs/profiling.md ("One profile per machine type") gives."""
    if not metadatas:
        raise ValueError("no profile to choose from")
    index, rule = _choice(metadatas, cpu_model, cores)
    return index, (f"taken on {_machine(metadatas[index])}; this machine: {cpu_model or 'unknown CPU'}, "
                   f"{cores} cores budgeted; {rule}")


def chosen(paths: list[Path], cores: int) -> tuple[Profile, int, str]:
    """The profile among `paths` a server on this machine, with `cores` cores budgeted, plans with:
    the profile, its index and why (every one is loaded, so a bad one is refused)."""
    from packrat.machine.topology import cpu_model

    profiles = [load(path) for path in paths]
    index, why = choose([p.metadata for p in profiles], cpu_model(), cores)
    return profiles[index], index, why


def _choice(metadatas: list[dict], cpu_model: str | None, cores: int) -> tuple[int, str]:
    if len(metadatas) == 1:
        return 0, "the only profile"
    count = [_cores(m) for m in metadatas]
    same = [i for i, m in enumerate(metadatas) if cpu_model and (m.get("cpu") or "").strip() == cpu_model.strip()]
    enough = [i for i in same if (count[i] or 0) >= cores]
    if enough:
        return min(enough, key=lambda i: count[i]), "same CPU, the fewest cores of those with enough"
    if same:
        return max(same, key=lambda i: count[i] or 0), "same CPU, the most cores (none has enough)"
    known = [i for i in range(len(metadatas)) if count[i] is not None] or list(range(len(metadatas)))
    nearest = min(known, key=lambda i: (abs((count[i] or 0) - cores), -(count[i] or 0)))
    return nearest, f"no profile of {len(metadatas)} was taken on this CPU: the nearest core count"


def _cores(metadata: dict) -> int | None:
    try:
        return int(metadata["cores"])
    except (KeyError, TypeError, ValueError):
        return None


def _machine(metadata: dict) -> str:
    """"CPU MODEL, N cores" from a profile's metadata, naming what it lacks."""
    cores = _cores(metadata)
    return f"{metadata.get('cpu') or 'unknown CPU'}, {cores if cores is not None else '?'} cores"
