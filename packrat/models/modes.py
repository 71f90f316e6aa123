"""Graph modes: how an instance runs its model.

- ``compile`` (the default): torch's inductor compiler with frozen weights (conv+BN folded,
  constant layouts), ahead of time: AOTInductor packages per model and batch size, built once
  and loaded by every instance (packrat/models/compiled.py), so a respawn or a reconfiguration does not
  wait for them.
- ``script``: TorchScript, trace + freeze + ``optimize_for_inference``: the path before torch
  deprecated TorchScript, kept for old profiles and for users' own TorchScript files.
- ``eager``: the module as it is.

A mode that fails on a model falls back to eager with a warning; the mode actually used is
returned, so the caller can tell its profile's mode from the instance's.
"""

from __future__ import annotations

# torch is imported where it is used: CLIs read MODES without paying for it.
import contextlib
import warnings

MODES = ("compile", "script", "eager")
DEFAULT_MODE = "compile"


def served(profile_mode: str | None) -> str:
    """The graph mode instances run in for a profile taken in `profile_mode` (its plan rests on
    those latencies): that mode, or the default for a profile of IOS instances or none."""
    return profile_mode if profile_mode in MODES else DEFAULT_MODE


def mode_name(mode: str | bool | None) -> str:
    """A mode from a setting: True/None mean the default, False eager, a name itself."""
    if mode is None or mode is True:
        return DEFAULT_MODE
    if mode is False:
        return "eager"
    if mode not in MODES:
        raise ValueError(f"unknown graph mode {mode!r}: choose one of {', '.join(MODES)}")
    return mode


@contextlib.contextmanager
def quiet_jit():
    """Hide TorchScript's deprecation notice where the TorchScript is the user's own (a file they
    serve); our own tracing in script mode lets it show."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
        yield


def to_mode(module, examples: tuple, mode: str, name: str = "model", package_for=None, ladder: bool = True):
    """(runnable, mode used): the module in `mode`, already run once on `examples` so a failure
    shows here, not on a live request. Falls back to eager (with a warning) when `mode` fails.
    `package_for(batch)`: where compile mode keeps the package for a batch size, built there if
    missing (None: built in a scratch directory for this process alone); not `ladder`, compile mode
    loads the examples' batch size alone, not its halving ladder (compiled.ladder)."""
    import torch

    if isinstance(module, torch.jit.ScriptModule) and mode != "eager":
        mode = "script"  # a user's TorchScript file runs as TorchScript: inductor cannot compile it
    elif mode == "eager":
        return module, "eager"
    try:
        runnable = _script(module, examples) if mode == "script" else _compile(module, examples, package_for, ladder)
    except Exception as exc:  # any tracing/compiling failure: serving eager still works
        first = (str(exc).splitlines() or [""])[0]
        warnings.warn(f"{mode} mode failed for model {name!r}, running eager: {type(exc).__name__}: {first}",
                      stacklevel=2)
        return module, "eager"
    return runnable, mode


def _script(module, examples: tuple):
    """Trace (our module: torch's deprecation warning shows, TorchScript is a choice to revisit)
    or take the user's TorchScript as it is, then freeze and optimise it."""
    import torch

    users = isinstance(module, torch.jit.ScriptModule)
    with torch.no_grad():
        graph = module if users else torch.jit.trace(module, examples, check_trace=False)
        with quiet_jit() if users else contextlib.nullcontext():
            graph = torch.jit.optimize_for_inference(torch.jit.freeze(graph.eval()))
        graph(*examples)
    return graph


def _compile(module, examples: tuple, package_for, ladder: bool = True):
    """The packages of the examples' batch size and (`ladder`) its halving ladder, as one callable."""
    import tempfile
    from pathlib import Path

    import torch

    from packrat.models import compiled

    with tempfile.TemporaryDirectory(prefix="packrat-compiled-") as scratch:  # the loader unpacks what it loads
        where = package_for or (lambda size: Path(scratch) / f"model-b{size}{compiled.SUFFIX}")
        runnable = compiled.Ladder({size: compiled.load_or_build(module, tuple(x[:size] for x in examples), where(size))
                                    for size in compiled.ladder(examples[0].shape[0], ladder)})
    with torch.no_grad():
        runnable(*examples)
    return runnable
