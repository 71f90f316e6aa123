"""The profile a command serves with when none is given: profiles/MODEL.csv, measured when missing."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from packrat.machine.budget import cpu_budget
from packrat.machine.topology import Topology
from packrat.models.modes import DEFAULT_MODE
from packrat.profiling import profiler
from packrat.profiling.profiles import default_path as default_profile_path, load

DEMO_BATCHES = (1, 2, 4, 8)


DEMO_MIN_TIME_S = 2.0


DEMO_WARMUP = 3


POINT_OVERHEAD_S = profiler.POINT_OVERHEAD_S


def about(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def measure_profile(model: str, path: Path, batches, *, min_time: float = DEMO_MIN_TIME_S,
                    input_shape: tuple[int, ...] | None = None, progress: bool = True,
                    graph_mode: str = DEFAULT_MODE):
    """Profile the demo's grid into `path`: threads 1..the local cores, `batches`, `min_time` s of
    timed runs per point after 3 warm-up runs in `graph_mode`, loaded or isolated as
    profiler.DEFAULT_CONTENTION says, under every runtime installed (as `packrat profile` does: a
    runtime dominated point after point is measured no further), with the profiler's progress bar.

    Points already in an existing file are kept (only missing ones are measured, in the kind the
    file holds: an older cache stays isolated). A new file is measured as PATH.partial.csv and
    renamed when complete, so an interrupted run never leaves half a profile where it would be
    used; the same command resumes it."""
    settings = profiler.ProfileSettings(model=model, warmup=DEMO_WARMUP, iters=None, min_time=min_time,
                                        input_shape=input_shape, graph_mode=graph_mode)
    from packrat.models.runtimes import installed_runtimes

    threads = list(range(1, cpu_budget().cores + 1))
    batches = sorted(set(batches))
    every = {"progress": progress, "runtimes": installed_runtimes(), "every_runtime": False}
    if path.exists():
        return profiler.run(_same_kind(settings, path), threads, batches, path, **every)
    partial = path.with_name(path.stem + ".partial.csv")
    profiler.run(_same_kind(settings, partial), threads, batches, partial, **every)
    partial.replace(path)
    return load(path)


def _same_kind(settings: profiler.ProfileSettings, path: Path) -> profiler.ProfileSettings:
    """`settings` measuring what the profile at `path` holds (loaded or isolated), if it holds any."""
    if not path.exists() or path.stat().st_size == 0:
        return settings
    return dataclasses.replace(settings, contention=load(path).loaded)


def resolve_profile(model: str, given: Path | None, *, batch_sizes=(),
                    input_shape: tuple[int, ...] | None = None) -> Path:
    """The profile serve, archive and bench use: `given` (which must exist), else profiles/MODEL.csv,
    measured first (measure_profile on batches 1, 2, 4, 8 and `batch_sizes`) when it is missing."""
    if given is not None:
        if not given.exists():
            raise ValueError(f"no profile at {given} (--profile): run `packrat profile --model {model} "
                             f"--out {given}` first, or leave --profile out to use {default_profile_path(model)}")
        return given
    path = default_profile_path(model)
    if path.exists():
        return path
    batches = sorted(set(DEMO_BATCHES) | set(batch_sizes))
    cores = cpu_budget().cores
    points = cores * len(batches)
    # Measurements, not points: a point measured both alone and loaded (isolated_too) takes two.
    runs = len(batches) * sum(profiler.measurements(profiler.ProfileSettings(model), t, Topology.virtual(cores))
                              for t in range(1, cores + 1))
    print(f"no profile at {path}: measuring one now ({points} points, about "
          f"{about(runs * (DEMO_MIN_TIME_S + POINT_OVERHEAD_S))}); next time it is reused", file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    measure_profile(model, path, batches, input_shape=input_shape)
    return path
