"""PNG plots of a profile: the L(t, b) heat-map and planned vs fat latency per batch.

A contention profile holds two figures per point, loaded and isolated; each plot then
has one panel per figure, loaded first, so the two predictions can be compared. The figures are
those the profile plans on (Profile.basis): served ones where it has them, which the titles say.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402

from packrat.errors import NoPlanError  # noqa: E402
from packrat.planning.planner import Plan, Planner  # noqa: E402
from packrat.profiling.profiles import Profile  # noqa: E402

SHORT_RUNTIMES = {"inductor": "", "openvino": "OV", "onnxruntime": "ORT", "torch-compile": "TC", "ios": "IOS"}  # labels: the default unnamed
PANEL_TITLES = {"loaded": "loaded: ⌊T/t⌋ copies side by side", "isolated": "isolated: one instance alone"}
PLAN_AXIS = "batch size B, and the plan: count×⟨threads, batch⟩"
RUNTIME_KEY = "\n⟨threads, batch, runtime⟩: OV OpenVINO, ORT ONNX Runtime"


def plans_per_batch(profile: Profile, threads: int, latency: str | None = None) -> list[Plan]:
    """The optimal plan at T=threads for every profiled batch size that can be covered, planned
    with the given figure (default: the profile's primary one)."""
    planner = Planner(profile.items(latency), threads, max(profile.batches), profile.runtimes)
    plans = []
    for batch in profile.batches:
        try:
            plans.append(planner.plan(threads, batch))
        except NoPlanError:
            continue
    return plans


def _panels(count: int, width: float, height: float, sharey: bool = False):
    """A figure with `count` side-by-side axes; constrained layout leaves room for a shared colour bar."""
    fig, axes = plt.subplots(1, count, figsize=(width * count, height), squeeze=False, sharey=sharey,
                             layout="constrained")
    return fig, list(axes[0])


def _save(fig, path: Path, title: str) -> Path:
    fig.suptitle(textwrap.fill(title, max(20, int(9 * fig.get_figwidth()))))  # ~9 characters an inch at 12 pt
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _grid(profile: Profile, latency: str) -> np.ndarray:
    threads, batches = profile.threads, profile.batches
    grid = np.full((len(threads), len(batches)), np.nan)
    for t, b, ms in profile.items(latency):
        grid[threads.index(t), batches.index(b)] = ms
    return grid


def heatmap(profile: Profile, path: Path, title: str) -> Path:
    threads, batches = profile.threads, profile.batches
    grids = [_grid(profile, latency) for latency in profile.figures]
    # One colour scale for both panels, so equal colours mean equal latencies.
    norm = LogNorm(vmin=min(np.nanmin(g) for g in grids), vmax=max(np.nanmax(g) for g in grids))
    fig, axes = _panels(len(grids), 1.0 + 0.8 * len(batches), 1.5 + 0.45 * len(threads))
    for ax, grid, latency in zip(axes, grids, profile.figures):
        image = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis", norm=norm)
        ax.set_xticks(range(len(batches)), [str(b) for b in batches])
        ax.set_yticks(range(len(threads)), [str(t) for t in threads])
        ax.set_xlabel("batch size b")
        ax.set_ylabel("threads t")
        if len(grids) > 1:
            ax.set_title(PANEL_TITLES[latency], fontsize=10)
        if grid.size <= 400:  # numbers stay legible on small grids only
            for i, j in zip(*np.nonzero(~np.isnan(grid))):
                ax.text(j, i, f"{grid[i, j]:.3g}{_runtime_mark(profile, threads[i], batches[j])}", ha="center",
                        va="center", fontsize=7, color="white")
    fig.colorbar(image, ax=axes, label="latency (ms, log scale)")
    return _save(fig, path, title)


def _runtime_mark(profile: Profile, threads: int, batch: int) -> str:
    """A cell's fastest runtime, where the profile measured several: '\nOV', '\nORT', or nothing."""
    if len(profile.by_runtime) < 2:
        return ""
    short = SHORT_RUNTIMES.get(profile.runtimes.get((threads, batch), ""), "")
    return f"\n{short or 'torch'}"


def _instance_label(count: int, threads: int, batch: int, runtime: str) -> str:
    short = SHORT_RUNTIMES.get(runtime, runtime)
    return f"{count}×⟨{threads},{batch}{',' + short if short else ''}⟩"


def _plan_vs_fat_panel(ax, plans: list[Plan]) -> None:
    labels = [f"{p.batch}\n" + "\n".join(_instance_label(*group) for group in p.groups()) for p in plans]
    runtimes_named = any(SHORT_RUNTIMES.get(group[3], group[3]) for p in plans for group in p.groups())
    x = np.arange(len(plans))
    fat = [p.fat_latency_ms or np.nan for p in plans]
    planned = [p.expected_latency_ms for p in plans]
    ax.bar(x - 0.2, fat, 0.4, label="fat: 1 instance, all threads")
    ax.bar(x + 0.2, planned, 0.4, label="packrat plan")
    for i, plan in enumerate(plans):
        note = f"{plan.speedup:.2f}×" if plan.speedup else "fat n/a"
        ax.annotate(note, (x[i] + 0.2, planned[i]), ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(x, labels)
    ax.set_xlabel(PLAN_AXIS + (RUNTIME_KEY if runtimes_named else ""))
    ax.set_ylabel("latency (ms, log scale)")
    ax.legend()


def plan_vs_fat(plans: dict[str, list[Plan]], path: Path, title: str) -> Path:
    """Per batch, the fat latency beside the planned one: one panel per figure in `plans`
    ({'loaded': [...], 'isolated': [...]}, or one of them), each planned with its own figure."""
    widest = max(len(p) for p in plans.values())
    fig, axes = _panels(len(plans), max(6.0, 1.1 * widest), 4.8, sharey=True)  # one scale: panels compare
    for ax, (latency, panel) in zip(axes, plans.items()):
        _plan_vs_fat_panel(ax, panel)
        if len(plans) > 1:
            ax.set_title(PANEL_TITLES[latency], fontsize=10)
    return _save(fig, path, title)


def write_all(profile: Profile, threads: int, out_dir: str | Path) -> list[Path]:
    """Both plots for `profile` at T=threads into out_dir; returns the files written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = profile.metadata.get("model", "model")
    # A model given as a path (hf:DIR, a file, package.module:factory) is named by its last part.
    stem = re.sub(r"[^\w.-]", "_", Path(name.rstrip("/")).name) or "model"
    basis = (f", served from {profile.metadata.get('payload', '?')} bodies (decode + model + encode)"
             if profile.basis == "served" else ", the model alone")
    paths = [heatmap(profile, out_dir / f"{stem}-latency-heatmap.png", f"{name}: L(t, b) in ms{basis}")]
    plans = {latency: plans_per_batch(profile, threads, latency) for latency in profile.figures}
    plans = {latency: panel for latency, panel in plans.items() if panel}
    if plans:
        paths.append(plan_vs_fat(plans, out_dir / f"{stem}-plan-vs-fat-T{threads}.png",
                                 f"{name}: planned vs fat latency at T={threads}{basis}"))
    return paths
