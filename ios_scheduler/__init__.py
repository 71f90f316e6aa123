"""IOS for CPU: inter-operator scheduling of a model's graph into stages whose groups run
concurrently on disjoint cores.

    schedule = ios_scheduler.optimize(module, example_inputs, threads=2)
    fast = ios_scheduler.compile(module, schedule)      # callable like module
    text = schedule.to_json(); Schedule.from_json(text)
"""

from ios_scheduler.api import compile, optimize  # noqa: A004 - the documented name
from ios_scheduler.graph import GraphCaptureError, capture
from ios_scheduler.schedule import Schedule, StagePlan

__all__ = ["optimize", "compile", "capture", "Schedule", "StagePlan", "GraphCaptureError"]
