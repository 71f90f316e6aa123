"""Graph modes: how an instance runs its model.

- ``compile`` (the default): ``torch.compile`` with inductor and freezing (weights folded into
  the generated code), one static graph per batch size. Inductor keeps what it compiled in its
  on-disk caches (``TORCHINDUCTOR_CACHE_DIR``, which ``compile_cache_dir`` sets), so an instance
  that starts again on the same machine, or from an archive that ships the cache, loads the
  generated code instead of compiling it again.
- ``script``: TorchScript, trace + freeze + ``optimize_for_inference``: the path before torch
  deprecated TorchScript, kept for old profiles and for users' own TorchScript files.
- ``eager``: the module as it is.

A mode that fails on a model falls back to eager with a warning; the mode actually used is
returned, so the caller can tell its profile's mode from the instance's.
"""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager

import torch

MODES = ("compile", "script", "eager")
DEFAULT_MODE = "compile"
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def mode_name(mode: str | bool | None) -> str:
    """A mode from a setting: True/None mean the default, False eager, a name itself."""
    if mode is None or mode is True:
        return DEFAULT_MODE
    if mode is False:
        return "eager"
    if mode not in MODES:
        raise ValueError(f"unknown graph mode {mode!r}: choose one of {', '.join(MODES)}")
    return mode


def compile_cache_dir(path: str | os.PathLike | None) -> None:
    """Keep inductor's generated code under `path` (created if needed): set before the first
    compile of the process; None leaves torch's default (a per-user directory in /tmp)."""
    if path is not None:
        os.makedirs(path, exist_ok=True)
        os.environ[CACHE_ENV] = str(path)


@contextmanager
def quiet_jit():
    """Hide TorchScript's deprecation notice where the user chose TorchScript: their own file,
    or `--graph-mode script`. The default path no longer goes through TorchScript."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
        yield


def to_mode(module: torch.nn.Module, examples: tuple[torch.Tensor, ...], mode: str, name: str = "model"):
    """(runnable, mode used): the module in `mode`, already run once on `examples` so a failure
    shows here, not on a live request. Falls back to eager (with a warning) when `mode` fails."""
    if mode == "eager" or (mode == "compile" and isinstance(module, torch.jit.ScriptModule)):
        # a user's TorchScript file runs as TorchScript: inductor cannot compile it
        return module, "script" if isinstance(module, torch.jit.ScriptModule) else "eager"
    try:
        runnable = _script(module, examples) if mode == "script" else _compile(module, examples)
    except Exception as exc:  # any tracing/compiling failure: serving eager still works
        first = (str(exc).splitlines() or [""])[0]
        warnings.warn(f"{mode} mode failed for model {name!r}, running eager: {type(exc).__name__}: {first}",
                      stacklevel=2)
        return module, "eager"
    return runnable, mode


def _script(module: torch.nn.Module, examples: tuple[torch.Tensor, ...]) -> torch.jit.ScriptModule:
    with torch.no_grad(), quiet_jit():
        if isinstance(module, torch.jit.ScriptModule):
            graph = module  # already TorchScript (loaded from a file)
        else:
            graph = torch.jit.trace(module, examples, check_trace=False)
        graph = torch.jit.optimize_for_inference(torch.jit.freeze(graph.eval()))
        graph(*examples)
    return graph


def _compile(module: torch.nn.Module, examples: tuple[torch.Tensor, ...]):
    import torch._inductor.config as inductor_config

    # Freezing folds the weights into the graph (conv+BN, constant layouts): what made TorchScript
    # fast, and measured faster than default compile here (ResNet-50: 104 vs 152 ms at batch 1).
    inductor_config.freezing = True
    compiled = torch.compile(module, dynamic=False)
    with torch.no_grad():
        compiled(*examples)
    return compiled
