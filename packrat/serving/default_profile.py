"""The profile a command serves with when none is given: profiles/MODEL.csv, measured when missing."""

from __future__ import annotations

import sys
from pathlib import Path

from packrat.machine.budget import cpu_budget
from packrat.models.modes import DEFAULT_MODE
from packrat.profiling import profiler, profiles
from packrat.profiling.profiles import default_path as default_profile_path, load

DEMO_BATCHES = (1, 2, 4, 8)
DEMO_MIN_TIME_S = 2.0
DEMO_WARMUP = 3


def about(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def measure_profile(model: str, path: Path, batches, *, min_time: float = DEMO_MIN_TIME_S,
                    input_shape: tuple[int, ...] | None = None, progress: bool = True,
                    graph_mode: str = DEFAULT_MODE):
    """Profile `model` into `path` as `packrat profile` does by default (the search, within its budget,
    under every default runtime): threads 1..the local cores, `batches`, `min_time` s of timed runs per
    point after 3 warm-up runs in `graph_mode`, loaded or isolated as profiler.DEFAULT_CONTENTION says,
    and the path around each instance kind (serving/paths.py).

    Points already in an existing file are kept (only missing ones are measured, in the kind the
    file holds: an older cache stays isolated). A new file is measured as PATH.partial.csv and
    renamed when complete, so an interrupted run never leaves half a profile where it would be
    used; the same command resumes it."""
    partial = path if path.exists() else path.with_name(path.stem + ".partial.csv")
    held = profiles.held(partial)  # loaded or isolated, as the file holds, if it holds any point
    settings = profiler.ProfileSettings(model=model, warmup=DEMO_WARMUP, iters=None, min_time=min_time,
                                        input_shape=input_shape, graph_mode=graph_mode,
                                        **({"contention": held.loaded} if held else {}))
    from packrat.serving.paths import measure_paths  # the pool: not at import (the CLI's parser starts without it)

    every = {"progress": progress, "runtimes": profiler.default_runtimes(), "say": print, "path_probe": measure_paths}
    profiler.search_profile(settings, list(range(1, cpu_budget().cores + 1)), sorted(set(batches)), partial, **every)
    partial.replace(path)
    return load(path)


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
    print(f"no profile at {path}: measuring one now (about {about(profiler.default_budget_s(cpu_budget().cores))}); next time it is reused",
          file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    measure_profile(model, path, batches, input_shape=input_shape)
    return path
