"""IOS-compiled models for the profiler and the pool: one schedule per model, thread count
and batch size, searched once and kept as JSON in a cache directory."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from .api import compile, optimize  # noqa: A004
from .schedule import Schedule


def schedule_path(cache_dir: str | Path, model: str, threads: int, batch: int) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model)
    return Path(cache_dir) / f"{safe}-t{threads}-b{batch}.json"


def cached_schedule(module: torch.nn.Module, example: torch.Tensor, model: str, threads: int,
                    cache_dir: str | Path) -> Schedule:
    """The cached schedule for (model, threads, batch), searching and saving it if missing."""
    path = schedule_path(cache_dir, model, threads, example.shape[0])
    if path.exists():
        return Schedule.from_json(path.read_text())
    schedule = optimize(module, (example,), threads=threads, progress=False, name=model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(schedule.to_json())
    return schedule


def prepare_ios(spec, batch: int, threads: int, cache_dir: str | Path):
    """Like packrat.models.prepare, with the model run by its IOS schedule: (module, example, "ios")."""
    module = spec.build()
    example = spec.example_input(batch)
    schedule = cached_schedule(module, example, spec.name, threads, cache_dir)
    return compile(module, schedule), example, "ios"
