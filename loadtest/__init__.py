"""Load tests for packrat-served models: locust users, a step load shape, results and plots."""
from .histogram import percentile
from .report import (
           align,
           format_table,
           load_cells,
           plot_latency_distributions,
           plot_timeline,
)
from .runner import HistoryRow, LoadResult, run_locust

__all__ = ["run_locust", "LoadResult", "HistoryRow", "percentile", "format_table", "align", "load_cells",
           "plot_latency_distributions", "plot_timeline"]
