"""IOS-compiled models for the profiler and the pool: one schedule per model, thread count
and batch size, searched once and kept as JSON in a cache directory. Each search also keeps
its stage costs (in `costs/`, not packed into archives), and a later search of the same model
and thread count at another batch size is bounded by the nearest batch size's costs. A search
takes about SEARCH_BUDGET_S (optimize's budget_s, checked between parts: a part under way at the
budget finishes), plus its end-to-end check. A schedule whose search was cut short says so
(Schedule.complete); the profiler searches it again, and archives ship only complete ones."""

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
                    cache_dir: str | Path, again: bool = False, finish: bool = False) -> Schedule:
    """The cached schedule for (model, threads, batch), searching and saving it if missing (or
    with `again`; or with `finish`, where time allows, if the kept one is partial: parts were left
    unsearched at the budget). A new search replaces the kept one unless it left more parts."""
    batch = examples[0].shape[0]
    path = schedule_path(cache_dir, model, threads, batch)
    kept = Schedule.from_json(path.read_text()) if path.exists() and not again else None
    if kept is not None and (kept.complete or not finish):
        return kept
    bounds = nearest_costs(cache_dir, model, threads, batch)
    schedule = optimize(module, examples, threads=threads, progress=False, name=model, bounds=bounds,
                        budget_s=SEARCH_BUDGET_S)
    if kept is not None and _unsearched(schedule) > _unsearched(kept):
        return kept
    costs = costs_path(cache_dir, model, threads, batch)
    costs.parent.mkdir(parents=True, exist_ok=True)
    costs.write_text(schedule.costs.to_json())
    path.write_text(schedule.to_json())
    return schedule


def _unsearched(schedule: Schedule) -> int:
    return 0 if schedule.complete else schedule.search.get("unsearched_parts", 0)


def complete_schedules(paths: list[Path]) -> list[Path]:
    """The schedules among `paths` whose every part was searched: what an archive ships as final."""
    found = []
    for path in paths:
        try:
            if Schedule.from_json(path.read_text()).complete:
                found.append(path)
        except (OSError, ValueError):  # damaged: the pool searches the schedule again
            continue
    return found


def prepare_ios(spec, batch: int, threads: int, cache_dir: str | Path, finish: bool = False):
    """Like packrat.models.zoo.prepare, with the model run by its IOS schedule: (module, examples, "ios").
    `finish`: a kept schedule whose search was cut short is searched again (cached_schedule)."""
    module = spec.build()
    examples = spec.example_inputs(batch)
    schedule = cached_schedule(module, examples, spec.name, threads, cache_dir, finish=finish)
    try:
        return compile(module, schedule), examples, "ios"
    except ValueError:  # kept by an older packrat, whose graph had other nodes (issue 49 folded batch norms)
        return compile(module, cached_schedule(module, examples, spec.name, threads, cache_dir, again=True)), examples, "ios"
