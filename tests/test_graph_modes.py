"""benchmarks/graph_modes.py's summary and table, from made-up runs (no processes)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "graph_modes.py"
_SPEC = importlib.util.spec_from_file_location("benchmarks_graph_modes", _PATH)
graph_modes = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(graph_modes)


def run(start_s: float, b1: float, b2: float, diff: float = 1e-6) -> dict:
    return {"start_s": start_s, "latency_ms": {"1": b1, "2": b2}, "max_abs_diff": diff}


def test_medians_over_rounds_and_the_first_start_apart():
    results = {"script": [run(2.0, 10.0, 20.0), run(1.0, 12.0, 18.0), run(1.2, 11.0, 30.0)],
               "compile": [run(30.0, 8.0, 16.0), run(5.0, 9.0, 15.0, 2e-6), {"error": "exit 1: boom"}]}
    summary = graph_modes.summarise(results, [1, 2])
    assert summary["script"] == {"first_start_s": 2.0, "later_start_s": 1.1, "latency_ms": {1: 11.0, 2: 20.0},
                                 "max_abs_diff": 1e-6}
    assert summary["compile"]["first_start_s"] == 30.0 and summary["compile"]["later_start_s"] == 5.0
    assert summary["compile"]["latency_ms"] == {1: 8.5, 2: 15.5} and summary["compile"]["max_abs_diff"] == 2e-6
    table = graph_modes.markdown(summary, [1, 2])
    assert "| compile | 30.0 | 5.0 | 8.5 | 15.5 | 0.77× | 0.78× | 2.0e-06 |" in table


def test_a_mode_that_never_ran_shows_its_error():
    summary = graph_modes.summarise({"torch-compile": [{"error": "exit 1: no compiler"}]}, [1])
    assert summary == {"torch-compile": {"error": "exit 1: no compiler"}}
    assert "| torch-compile | exit 1: no compiler |" in graph_modes.markdown(summary, [1])
