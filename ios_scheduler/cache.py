"""IOS-compiled models for the profiler and the pool: one schedule per model, thread count
and batch size, searched once and kept as JSON in a cache directory. Each search also keeps
its stage costs (in `costs/`, not packed into archives), and a later search of the same model
and thread count at another batch size is bounded by the nearest batch size's costs. A search
takes about SEARCH_BUDGET_S at most (optimize's budget_s), plus its end-to-end check."""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from .api import compile, optimize  # noqa: A004
from .schedule import Schedule
from .timing import CostTable

SEARCH_BUDGET_S = 60.0  # issue 49's bound on a search at 16 threads: a profile point, or an instance's start


def schedule_path(cache_dir: str | Path, model: str, threads: int, batch: int) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model)
    return Path(cache_dir) / f"{safe}-t{threads}-b{batch}.json"


def costs_path(cache_dir: str | Path, model: str, threads: int, batch: int) -> Path:
    return Path(cache_dir) / "costs" / schedule_path(cache_dir, model, threads, batch).name


def nearest_costs(cache_dir: str | Path, model: str, threads: int, batch: int) -> CostTable | None:
    """The kept stage costs of `model` on `threads` at the batch size nearest `batch` (by ratio)."""
    pattern = costs_path(cache_dir, model, threads, 0).name.replace("-b0.json", "-b*.json")
    tables = []
    for path in (Path(cache_dir) / "costs").glob(pattern):
        try:
            table = CostTable.load(path)
        except (OSError, ValueError):  # a damaged table only costs the bounds it would have given
            continue
        if (table.model, table.threads) == (model, threads) and table.batch != batch:
            tables.append(table)
    return min(tables, key=lambda t: abs(math.log(t.batch / batch)), default=None)


def cached_schedule(module: torch.nn.Module, examples: tuple[torch.Tensor, ...], model: str, threads: int,
                    cache_dir: str | Path, again: bool = False) -> Schedule:
    """The cached schedule for (model, threads, batch), searching and saving it if missing (or
    with `again`)."""
    batch = examples[0].shape[0]
    path = schedule_path(cache_dir, model, threads, batch)
    if path.exists() and not again:
        return Schedule.from_json(path.read_text())
    bounds = nearest_costs(cache_dir, model, threads, batch)
    schedule = optimize(module, examples, threads=threads, progress=False, name=model, bounds=bounds,
                        budget_s=SEARCH_BUDGET_S)
    costs = costs_path(cache_dir, model, threads, batch)
    costs.parent.mkdir(parents=True, exist_ok=True)
    costs.write_text(schedule.costs.to_json())
    path.write_text(schedule.to_json())
    return schedule


def prepare_ios(spec, batch: int, threads: int, cache_dir: str | Path):
    """Like packrat.models.zoo.prepare, with the model run by its IOS schedule: (module, examples, "ios")."""
    module = spec.build()
    examples = spec.example_inputs(batch)
    schedule = cached_schedule(module, examples, spec.name, threads, cache_dir)
    try:
        return compile(module, schedule), examples, "ios"
    except ValueError:  # kept by an older packrat, whose graph had other nodes (issue 49 folded batch norms)
        return compile(module, cached_schedule(module, examples, spec.name, threads, cache_dir, again=True)), examples, "ios"
