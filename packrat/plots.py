"""PNG plots of a profile: the L(t, b) heat-map and planned vs fat latency per batch."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402

from .planner import NoPlanError, Plan, Planner  # noqa: E402
from .profile import Profile  # noqa: E402


def plans_per_batch(profile: Profile, threads: int) -> list[Plan]:
    """The optimal plan at T=threads for every profiled batch size that can be covered."""
    planner = Planner(profile.items(), threads, max(profile.batches))
    plans = []
    for batch in profile.batches:
        try:
            plans.append(planner.plan(threads, batch))
        except NoPlanError:
            continue
    return plans


def heatmap(profile: Profile, path: Path, title: str) -> Path:
    threads, batches = profile.threads, profile.batches
    grid = np.full((len(threads), len(batches)), np.nan)
    for (t, b), latency in profile.latency.items():
        grid[threads.index(t), batches.index(b)] = latency
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * len(batches), 1.2 + 0.45 * len(threads)))
    image = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis", norm=LogNorm())
    ax.set_xticks(range(len(batches)), [str(b) for b in batches])
    ax.set_yticks(range(len(threads)), [str(t) for t in threads])
    ax.set_xlabel("batch size b")
    ax.set_ylabel("threads t")
    ax.set_title(title)
    if grid.size <= 400:  # numbers stay legible on small grids only
        for i, j in zip(*np.nonzero(~np.isnan(grid))):
            ax.text(j, i, f"{grid[i, j]:.3g}", ha="center", va="center", fontsize=7, color="white")
    fig.colorbar(image, ax=ax, label="latency (ms, log scale)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plan_vs_fat(plans: list[Plan], path: Path, title: str) -> Path:
    labels = [f"{p.batch}\n" + "\n".join(f"{n}×⟨{t},{b}⟩" for n, t, b in p.groups()) for p in plans]
    x = np.arange(len(plans))
    fat = [p.fat_latency_ms or np.nan for p in plans]
    planned = [p.expected_latency_ms for p in plans]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(plans)), 4.5))
    ax.bar(x - 0.2, fat, 0.4, label="fat: 1 instance, all threads")
    ax.bar(x + 0.2, planned, 0.4, label="packrat plan")
    for i, plan in enumerate(plans):
        note = f"{plan.speedup:.2f}×" if plan.speedup else "fat n/a"
        ax.annotate(note, (x[i] + 0.2, planned[i]), ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(x, labels)
    ax.set_xlabel("batch size B, and the plan: count×⟨threads, batch⟩")
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(profile: Profile, threads: int, out_dir: str | Path) -> list[Path]:
    """Both plots for `profile` at T=threads into out_dir; returns the files written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = profile.metadata.get("model", "model")
    paths = [heatmap(profile, out_dir / f"{name}-latency-heatmap.png", f"{name}: L(t, b) in ms")]
    plans = plans_per_batch(profile, threads)
    if plans:
        paths.append(plan_vs_fat(plans, out_dir / f"{name}-plan-vs-fat-T{threads}.png",
                                 f"{name}: planned vs fat latency at T={threads}"))
    return paths
