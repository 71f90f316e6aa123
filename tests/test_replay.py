"""Replays on a simulated clock (packrat/profiling/replay.py, costs.py): the default search, budget
included, on 16- and 64-core tables with 4 % run-to-run noise plans within 3 % of the full grid's
plan at every batch of the grid, in at most 180 s (16 cores) and 300 s (64 cores) of what measuring
would cost. The published tables where at hand, synthetic ones of the same kind always."""

from __future__ import annotations

import csv
import math

import pytest

from packrat.profiling import profiler
from packrat.profiling.costs import Costs, enough_runs
from packrat.profiling.measuring import ProfileSettings
from packrat.profiling.search import design
from test_search import BATCHES, MODELS, SHARED, needs_tables, published, served_ratios, stretched

SETTINGS = ProfileSettings(model="replayed", warmup=3, iters=None, min_time=1.0)  # `packrat profile`'s defaults
NOISE = 0.04  # what a real machine gives run to run
LIMIT_S = {16: 180.0, 64: 300.0}


def synthetic() -> dict[str, dict[tuple[int, int], float]]:
    """Three runtimes of a 16-core model with diminishing returns: one ahead on few threads, one on
    many (they cross near 4), one twice as slow; odd thread counts 11 and 13 split the work badly."""
    def base(t: int, b: int) -> float:
        return 2 + 60 * b / t ** 0.85 + 0.8 * b + 0.3 * t

    shapes = {"few": lambda t: 1 + 0.025 * math.log2(t), "many": lambda t: 1.15 - 0.04 * math.log2(t),
              "slow": lambda t: 1.9}
    return {runtime: {(t, b): base(t, b) * shape(t) * (1.1 if t in (11, 13) else 1.0)
                      for t in range(1, 17) for b in BATCHES} for runtime, shape in shapes.items()}


def write_table(tables: dict, path) -> None:
    with open(path, "w", newline="") as handle:
        handle.write("# model: replayed\n# mode: script\n# latency: loaded\n# payload: raw\n")
        writer = csv.writer(handle)  # served figures as the model's: a default profile measures both, twice the runs
        writer.writerow(["threads", "batch", "latency_ms", "isolated_ms", "copies", "runtime", "served_ms",
                         "served_isolated_ms"])
        for runtime, table in tables.items():
            writer.writerows([t, b, ms, ms, 1, runtime, ms, ms] for (t, b), ms in sorted(table.items()))


def replayed(tables: dict, cores: int, tmp_path, **kwargs) -> profiler.SearchResult:
    """The default search replayed on `tables` with NOISE (budget_s: the default, scaled by cores)."""
    full = tmp_path / f"full-{cores}.csv"
    write_table(tables, full)
    return profiler.search_profile(SETTINGS, list(range(1, cores + 1)), list(BATCHES), tmp_path / f"out-{cores}.csv",
                                   replay=full, progress=False, say=lambda line: None, noise=NOISE, **kwargs)


def measured_of(done: profiler.SearchResult) -> dict:
    return {(r, t, b): ms for r, points in done.profile.by_runtime.items() for (t, b), (ms, _) in points.items()}


def check_default_search(tables: dict, cores: int, tmp_path, seed: int = 0) -> None:
    done = replayed(tables, cores, tmp_path, seed=seed)
    assert done.account.simulated and done.account.wall() <= LIMIT_S[cores]
    assert max(served_ratios(tables, measured_of(done), cores)) <= 1.03
    assert "simulated" in done.profile.metadata["search"] and "plans within" in done.profile.metadata["search"]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_default_search_on_a_synthetic_16_core_table_plans_within_3_percent_in_3_minutes(tmp_path, seed):
    check_default_search(synthetic(), 16, tmp_path, seed)


@pytest.mark.slow
def test_the_default_search_on_a_synthetic_64_core_table_plans_within_3_percent_in_5_minutes(tmp_path):
    check_default_search({r: stretched(table, 4) for r, table in synthetic().items()}, 64, tmp_path)


@needs_tables
@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_the_default_search_on_the_published_tables_plans_within_3_percent(tmp_path, model):
    tables = published(model)
    check_default_search(tables, 16, tmp_path)
    check_default_search({r: stretched(table, 4) for r, table in tables.items()}, 64, tmp_path)


def test_the_check_fails_plans_made_from_the_synthetic_design_points_alone():
    tables = synthetic()
    designed = {(r, t, b): tables[r][t, b] for r in tables for t, b in design(list(range(1, 17)), list(BATCHES))}
    assert max(served_ratios(tables, designed, 16)) > 1.03


def test_a_budget_too_small_is_replayed_and_still_plans_every_batch(tmp_path):
    done = replayed(synthetic(), 16, tmp_path, budget_s=20.0)
    assert "budget of 20 s ended" in done.stopped
    assert done.account.wall() < 60  # what was under way, then only what covers the grid's batches
    assert all(math.isfinite(r) for r in served_ratios(synthetic(), measured_of(done), 16))


def test_the_simulated_clock_charges_a_point_as_the_cost_model_says(tmp_path):
    """One point, no noise: its worker's load, 3 warm-up runs and the timed runs the rules take, then
    the served figure's 2 warm-up runs and as many timed."""
    tables = {"only": {(1, 1): 250.0}}
    done = profiler.search_profile(SETTINGS, [1], [1], tmp_path / "one.csv", replay=_written(tables, tmp_path),
                                   progress=False, say=lambda line: None)
    costs = Costs()
    assert costs.expected_runs(250.0, noise=0.0) == 4  # the min-time of 1 s passes before 5 precise runs
    expected = costs.load_s + 250.0 * (3 + 4) / 1e3 + 250.0 * (2 + 4) / 1e3
    assert done.account.wall() == pytest.approx(expected)
    assert done.profile.latency[1, 1] == pytest.approx(250.0)


def _written(tables: dict, tmp_path):
    path = tmp_path / "table.csv"
    write_table(tables, path)
    return path


def test_runs_stop_once_the_mean_is_known_as_well_as_the_plans_need():
    assert not enough_runs([100.0, 100.1], 0.0, 10.0, 30)  # never fewer than 3
    assert not enough_runs([100.0, 100.1, 99.9], 0.0, 10.0, 30)  # 3 close runs may be close by chance
    assert enough_runs([100.0, 100.1, 99.9, 100.0, 100.1], 0.0, 10.0, 30)  # 5 within 0.1 %: known
    assert not enough_runs([100.0, 108.0, 93.0, 104.0, 97.0], 0.0, 10.0, 30)  # ±5 %: not yet
    assert enough_runs([100.0, 108.0, 93.0], 1.0, 1.0, 30)  # the min-time passed
    assert enough_runs([100.0, 108.0, 93.0] * 10, 0.5, 1.0, 30)  # the most runs done
    assert not enough_runs([100.0, 100.0, 100.0, 100.0, 100.0], 0.0, 10.0, 30, precision=None)


def report(seeds: int = 5) -> None:
    """The figures docs/profiling.md quotes: `python tests/test_replay.py` (published tables if at hand)."""
    import tempfile
    from pathlib import Path

    sources = {**({model: published(model) for model in MODELS} if SHARED.exists() else {}), "synthetic": synthetic()}
    print("| tables | T | points (of grid) | simulated s, worst | plan / full grid's, worst |\n|---|---:|---:|---:|---:|")
    for name, tables in sources.items():
        for cores in (16, 32, 64):
            scaled = {r: stretched(table, cores // 16) for r, table in tables.items()} if cores > 16 else tables
            runs = [replayed(scaled, cores, Path(tempfile.mkdtemp()), seed=seed) for seed in range(seeds)]
            worst = max(max(served_ratios(scaled, measured_of(done), cores)) for done in runs)
            points = sorted(done.points for done in runs)
            print(f"| {name} | {cores} | {points[0]}–{points[-1]} (of {runs[0].grid}) | "
                  f"{max(done.account.wall() for done in runs):.0f} | {worst:.3f} |")


if __name__ == "__main__":
    report()
