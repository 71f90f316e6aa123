"""Every plot packrat writes keeps its text inside the picture: titles, axis labels, tick labels,
legends and notes (the demo's plan-vs-fat plot once cut its x-axis label off at the right edge)."""

from __future__ import annotations

import math

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from packrat.loadtest import plot_latency_distributions, plot_timeline
from packrat.loadtest.runner import HistoryRow, LoadResult
from packrat.profiling import plots, profiles

TOLERANCE_PX = 1.0


def outside(fig: Figure) -> list[str]:
    """What of the drawn figure lies outside it: its tight bounding box (all it draws, as
    bbox_inches="tight" would save it) against the figure, and the texts that stick out."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    box, width, height = fig.get_tightbbox(renderer), fig.get_figwidth(), fig.get_figheight()
    inch = TOLERANCE_PX / fig.dpi
    if box.x0 >= -inch and box.y0 >= -inch and box.x1 <= width + inch and box.y1 <= height + inch:
        return []
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text() and t.figure is fig]
    return [f"drawn over {box.bounds} of a {width:.2f}×{height:.2f} in figure"] + [
        repr(t.get_text()) for t in texts
        if (e := t.get_window_extent(renderer)).x0 < -TOLERANCE_PX or e.y0 < -TOLERANCE_PX
        or e.x1 > fig.bbox.width + TOLERANCE_PX or e.y1 > fig.bbox.height + TOLERANCE_PX]


@pytest.fixture
def saved(monkeypatch) -> list[list[str]]:
    """What lies outside each figure saved while the test runs, one list per figure."""
    found = []
    save = Figure.savefig

    def checked(fig, *args, **kwargs):
        save(fig, *args, **kwargs)
        found.append(outside(fig))

    monkeypatch.setattr(Figure, "savefig", checked)
    return found


def profile(tmp_path, rows: str, model: str = "bert_base", loaded: bool = False):
    path = tmp_path / "profile.csv"
    kind = "# latency: loaded\n" if loaded else ""
    path.write_text(f"# model: {model}\n# mode: eager\n{kind}{','.join(profiles.COLUMNS)}\n{rows}")
    return profiles.load(path)


def rows(points: dict[tuple[int, int], float], runtime: str = "inductor", slowdown: float | None = None) -> str:
    """Profile rows; with `slowdown`, loaded figures that much slower than the isolated ones."""
    return "".join(f"{t},{b},{ms * (slowdown or 1)},{ms},{2 // t if slowdown else ''},,,,,{runtime}\n"
                   for (t, b), ms in points.items())


# The demo's: BERT-base on 2 cores, batches 1-8; the plan splits the cores at B=2 and 4.
DEMO = {(1, 1): 290, (2, 1): 156.2, (1, 2): 272, (2, 2): 274, (1, 4): 513.2, (2, 4): 529.1, (1, 8): 1026, (2, 8): 1022}
# 16 cores, batches 1-64: wide grids, plans of several kinds of instance.
WIDE = {(t, b): b * 30 / t ** 0.7 + 5 * t for t in (1, 2, 3, 4, 6, 8, 12, 16) for b in (1, 2, 4, 8, 16, 32, 64)}


@pytest.mark.parametrize("case", ["demo", "runtimes", "loaded-long-name", "wide"])
def test_profile_plots_fit(case, tmp_path, saved):
    threads = 2
    if case == "demo":
        p = profile(tmp_path, rows(DEMO))
    elif case == "runtimes":
        p = profile(tmp_path, rows(DEMO) + rows({k: v * 0.9 for k, v in DEMO.items() if k[1] > 1}, "openvino")
                    + rows({(1, 8): 900}, "onnxruntime"))
    elif case == "wide":
        p, threads = profile(tmp_path, rows(WIDE)), 16
    else:  # two panels, a title longer than the figure is wide
        p = profile(tmp_path, rows(DEMO, slowdown=1.2), loaded=True,
                    model="hf:/home/someone/models/bert-base-uncased-finetuned-on-product-reviews/")
        assert p.figures == ("loaded", "isolated")
    written = plots.write_all(p, threads, tmp_path / "plots")
    assert len(written) == len(saved) == 2 and all(path.parent == tmp_path / "plots" for path in written)
    assert saved == [[], []]


def test_load_test_plots_fit(tmp_path, saved):
    result = LoadResult(requests=1200, failures=3, p50_ms=540.0, p95_ms=569.0, p99_ms=954.0, mean_ms=560.0,
                        throughput_rps=7.2, duration_s=36.0,
                        response_times={500.0: 600, 540.0: 400, 600.0: 180, 950.0: 20})
    plot_latency_distributions({name: result for name in ("stock", "packrat-fat", "packrat-plan 2×⟨1,2⟩")},
                               tmp_path / "latency.png")
    history = [HistoryRow(1000.0 + i, 1 + i // 5, 10.0 + i, 5.0 + i, 8.0 + i, 9.0 + i, 0.0) for i in range(60)]
    history[0] = HistoryRow(1000.0, 1, 0.0, math.nan, math.nan, math.nan, 0.0)
    plot_timeline(history, tmp_path / "timeline.png",
                  markers=[(1000.0, "1 user"), (1015.0, "8 users → plan for B=8"), (1059.0, "back to 1")])
    assert saved == [[], []]


def test_text_off_the_edge_is_caught():
    fig = Figure(figsize=(3, 2))
    fig.add_subplot().set_xlabel("a label far wider than a figure three inches across can hold")
    fig.tight_layout()
    assert "'a label far wider than a figure three inches across can hold'" in outside(fig)
