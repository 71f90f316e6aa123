"""IOS for CPU: inter-operator scheduling of a model's graph into stages whose groups run
concurrently on disjoint cores.

    schedule = ios_scheduler.optimize(module, example_inputs, threads=2)
    fast = ios_scheduler.compile(module, schedule)      # callable like module
    text = schedule.to_json(); Schedule.from_json(text)

The names below load their modules (and torch) when first used, so that importing a light module
of the package (`openmp`, `schedule`) does not load torch.
"""

import importlib

_MODULES = {"optimize": "api", "compile": "api", "capture": "graph", "Schedule": "schedule",
            "StagePlan": "schedule", "GraphCaptureError": "graph"}
__all__ = list(_MODULES)


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULES[name]}", __name__), name)
