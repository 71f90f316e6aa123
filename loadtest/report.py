"""Text table and PNG plots of load-test results."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure  # no pyplot: no global backend or figure state
from matplotlib.ticker import LogFormatter

from .runner import HistoryRow, LoadResult

COLUMNS = ("name", "requests", "failures", "p50 ms", "p95 ms", "p99 ms", "req/s")


def load_cells(r: LoadResult) -> list[str]:
    """requests, failures, p50, p95, p99, req/s as table cells ("-" for NaN)."""
    def num(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.1f}"

    return [str(r.requests), str(r.failures), num(r.p50_ms), num(r.p95_ms), num(r.p99_ms), num(r.throughput_rps)]


def align(lines: Sequence[Sequence[str]]) -> str:
    """Text table from rows of cells (the first row is the header): the first column left-aligned,
    the others right-aligned."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
        for line in lines
    )


def format_table(rows: Mapping[str, LoadResult]) -> str:
    """Aligned table, one line per configuration: names left-aligned, numbers right-aligned."""
    return align([list(COLUMNS)] + [[name] + load_cells(r) for name, r in rows.items()])


def _cdf(histogram: Mapping[float, int]) -> tuple[np.ndarray, np.ndarray]:
    latencies, counts = np.array(sorted(histogram.items()), dtype=float).T
    return latencies, np.cumsum(counts) / counts.sum()


def plot_latency_distributions(rows: Mapping[str, LoadResult], path: Path) -> Path:
    """Latency CDF per configuration (log-x), from the exact histograms."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for name, r in rows.items():
        positive = {k: v for k, v in r.response_times.items() if k > 0 and v > 0}  # log axis
        if positive:
            x, y = _cdf(positive)
            ax.step(x, y, where="post", label=f"{name} (p99 {r.p99_ms:.1f} ms)")
    for q in (0.5, 0.99):
        ax.axhline(q, color="grey", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(LogFormatter())  # "20", not "2x10^1"
    ax.xaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of requests at or below")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)


def plot_timeline(history_rows: list[HistoryRow], path: Path,
                  markers: Iterable[tuple[float, str]] = ()) -> Path:
    """Latency percentiles and throughput per second; markers are (unix time, label) lines.

    The x axis counts seconds from the first row.
    """
    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    t0 = history_rows[0].timestamp if history_rows else 0.0
    t = [row.timestamp - t0 for row in history_rows]
    for attr, label in (("p50_ms", "p50"), ("p95_ms", "p95"), ("p99_ms", "p99")):
        ax.plot(t, [getattr(row, attr) for row in history_rows], label=label)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("latency (ms)")
    ax.grid(True, alpha=0.3)
    rps_ax = ax.twinx()
    rps_ax.plot(t, [row.rps for row in history_rows], color="black", ls="--", lw=1, label="throughput")
    rps_ax.set_ylabel("throughput (req/s)")
    rps_ax.set_ylim(bottom=0)
    for when, label in markers:
        ax.axvline(when - t0, color="red", lw=0.8, alpha=0.7)
        ax.annotate(label, (when - t0, 1), xycoords=("data", "axes fraction"), rotation=90,
                    va="top", ha="right", fontsize=8, color="red")
    handles = ax.get_legend_handles_labels()[0] + rps_ax.get_legend_handles_labels()[0]
    # Above the axes, so it hides neither the curves nor the marker labels.
    ax.legend(handles, [h.get_label() for h in handles], loc="lower left", bbox_to_anchor=(0, 1.0),
              ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)
