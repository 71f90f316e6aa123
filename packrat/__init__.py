"""packrat: latency-optimal CPU inference serving for PyTorch models on TorchServe.

The public API, loaded on first use (so `import packrat` and the CLI start without torch):

    packrat.plan(items, threads, batch)       the optimal instances ⟨t, b⟩ for T threads and batch B
    packrat.load_profile(path)                a profile file: L(t, b) and its metadata
    packrat.profile(settings, threads, batches, out)   measure L(t, b) into a profile file
    packrat.ProfileSettings                    what `profile` measures (model, graph mode, runs)
    packrat.Settings                           the settings a model is served with (packrat/settings.py)
    packrat.Engine                             one model served on this machine (what front ends wrap)

The Ray Serve application builder is `packrat.ray_serve:app` (its own module: it needs Ray).
"""

from importlib import import_module

__version__ = "0.1.0"

_API = {
    "plan": ("packrat.planning.planner", "plan"),
    "Plan": ("packrat.planning.planner", "Plan"),
    "Planner": ("packrat.planning.planner", "Planner"),
    "load_profile": ("packrat.profiling.profiles", "load"),
    "profile": ("packrat.profiling.profiler", "run"),
    "ProfileSettings": ("packrat.profiling.profiler", "ProfileSettings"),
    "Settings": ("packrat.settings", "Settings"),
    "Engine": ("packrat.serving.engine", "Engine"),
}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'packrat' has no attribute {name!r}")
    module, attribute = _API[name]
    return getattr(import_module(module), attribute)
