"""IOS for CPU: inter-operator scheduling of a model's graph into stages whose groups run
concurrently on disjoint cores.

    schedule = ios_scheduler.optimize(module, example_inputs, threads=2)
    fast = ios_scheduler.compile(module, schedule)      # callable like module
    text = schedule.to_json(); Schedule.from_json(text)
"""

from .api import compile, optimize  # noqa: A004 - the documented name
from .graph import GraphCaptureError, capture
from .schedule import Schedule, StagePlan

__all__ = ["optimize", "compile", "capture", "Schedule", "StagePlan", "GraphCaptureError"]
