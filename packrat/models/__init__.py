"""Model zoo: the networks packrat serves and benchmarks, plus user-supplied models.

Every network is plain ``torch.nn`` with random weights from a fixed seed, so
latency experiments need no downloads and are reproducible bit for bit.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch

from packrat.models.inception import inception_v3
from packrat.models.nasnet import nasnet
from packrat.models.randwire import randwire
from packrat.models.resnet import resnet50
from packrat.models.squeezenet import squeezenet
from packrat.models.tiny import TINY_TEXT_LENGTH, TINY_TEXT_VOCAB, tiny, tiny_text
from packrat.models.transformer import BERT_VOCAB, GPT2_VOCAB, bert_base, gpt2

__all__ = ["ModelSpec", "ZOO", "DEFAULT_MODEL", "resolve", "prepare"]

SEED = 0
SCRIPT_SUFFIXES = (".pt", ".pth", ".ts")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[[], torch.nn.Module]  # fresh module, seeded random weights, in eval mode
    input_shape: tuple[int, ...]  # one sample, without the batch dimension
    input_dtype: torch.dtype
    scriptable: bool  # trace + freeze + optimize_for_inference is expected to work
    task: str  # "classification" | "embedding" | "language-model"
    description: str = ""
    vocab_size: int | None = None  # upper bound (exclusive) for integer token ids
    # The module defines example_input(batch) itself (user factories); use it instead of random data.
    own_example: bool = False

    def example_input(self, batch: int) -> torch.Tensor:
        """Deterministic input of shape (batch, *input_shape); sample i is the same for any batch."""
        if self.own_example:
            # Costs a build; prepare() avoids it by asking the module it already built.
            return self.build().example_input(batch)
        gen = torch.Generator().manual_seed(SEED)
        # One draw per sample: a single big randn fills large tensors in a size-dependent
        # order, which would make sample 0 differ between batch sizes.
        if self.input_dtype.is_floating_point:
            samples = [torch.randn(self.input_shape, generator=gen, dtype=self.input_dtype)
                       for _ in range(batch)]
        else:
            high = self.vocab_size or 2  # token ids must stay inside the embedding table
            samples = [torch.randint(0, high, self.input_shape, generator=gen, dtype=self.input_dtype)
                       for _ in range(batch)]
        return torch.stack(samples)


def _seeded(factory: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    """Wrap a factory so every call gives the same weights and an eval-mode module."""

    def build() -> torch.nn.Module:
        torch.manual_seed(SEED)
        return factory().eval()

    return build


ZOO: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("tiny", _seeded(tiny), (3, 32, 32), torch.float32, True, "classification",
                  "small 3-conv CNN, 10 classes; fast enough for tests"),
        ModelSpec("tiny_text", _seeded(tiny_text), (TINY_TEXT_LENGTH,), torch.int64, True, "embedding",
                  "16 tokens -> 32-dim embedding; the text path's test model", vocab_size=TINY_TEXT_VOCAB),
        ModelSpec("resnet50", _seeded(resnet50), (3, 224, 224), torch.float32, True, "classification",
                  "ResNet-50 (bottleneck [3,4,6,3]), 1000 classes"),
        ModelSpec("inception_v3", _seeded(inception_v3), (3, 299, 299), torch.float32, True,
                  "classification", "Inception-v3, 1000 classes, multi-branch blocks"),
        ModelSpec("bert_base", _seeded(bert_base), (128,), torch.int64, True, "embedding",
                  "BERT-base encoder, 128 tokens, pooled CLS output (768)", vocab_size=BERT_VOCAB),
        ModelSpec("gpt2", _seeded(gpt2), (128,), torch.int64, True, "language-model",
                  "GPT-2 small, 128-token prompt, next-token logits", vocab_size=GPT2_VOCAB),
        # The IOS paper's networks: many small parallel operators per block.
        ModelSpec("squeezenet", _seeded(squeezenet), (3, 224, 224), torch.float32, True, "classification",
                  "SqueezeNet 1.1, 1000 classes, fire modules with two expand branches"),
        ModelSpec("randwire", _seeded(randwire), (3, 224, 224), torch.float32, True, "classification",
                  "RandWire-WS small regime (C=78, 3 random 32-node graphs), 1000 classes"),
        ModelSpec("nasnet", _seeded(nasnet), (3, 224, 224), torch.float32, True, "classification",
                  "NASNet-A Mobile 4@1056, 1000 classes, cells of parallel separable convs"),
    )
}
DEFAULT_MODEL = "resnet50"


def _unknown(spec: str) -> ValueError:
    names = ", ".join(ZOO)
    return ValueError(
        f"unknown model {spec!r}: choose one of {names}, a TorchScript file "
        f"({'/'.join(SCRIPT_SUFFIXES)}), or package.module:factory"
    )


@contextmanager
def _quiet_jit():
    """Hide TorchScript's deprecation notices: graph mode is a deliberate choice here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
        yield


def _from_file(path: str, input_shape: tuple[int, ...] | None) -> ModelSpec:
    if not os.path.isfile(path):
        raise ValueError(f"model file not found: {path}")
    if input_shape is None:
        raise ValueError(f"TorchScript model {path} needs an input shape (one sample, e.g. 3,224,224)")

    def build() -> torch.nn.Module:
        with _quiet_jit():
            return torch.jit.load(path, map_location="cpu").eval()

    name = os.path.splitext(os.path.basename(path))[0]
    return ModelSpec(name, build, tuple(input_shape), torch.float32, True, "classification",
                     f"TorchScript file {path}")


def _from_factory(spec: str, input_shape: tuple[int, ...] | None) -> ModelSpec:
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"cannot load model factory {spec!r}: {exc}") from None
    if not callable(factory):
        raise ValueError(f"model factory {spec!r} is not callable")
    build = _seeded(factory)

    dtype, own_example = torch.float32, False
    if input_shape is None:
        # Only a module that knows its own input can go without an explicit shape.
        probe = build()
        if not callable(getattr(probe, "example_input", None)):
            raise ValueError(f"model factory {spec!r} needs an input shape: its module has no example_input(batch)")
        sample = probe.example_input(1)
        input_shape, dtype, own_example = tuple(sample.shape[1:]), sample.dtype, True
    # Scriptability is unknown up front: prepare() tries and falls back to eager.
    return ModelSpec(attr, build, tuple(input_shape), dtype, True, "classification",
                     f"factory {spec}", own_example=own_example)


def resolve(spec: str, input_shape: tuple[int, ...] | None = None) -> ModelSpec:
    """Turn a zoo name, a TorchScript file path or "package.module:factory" into a ModelSpec.

    For zoo models, input_shape (if given) overrides the default, e.g. another sequence length.
    Files and factories given an input_shape take float32 input; a factory's module may
    instead define example_input(batch), which then sets shape and dtype.
    """
    if spec in ZOO:
        found = ZOO[spec]
        if input_shape is not None and tuple(input_shape) != found.input_shape:
            found = dataclasses.replace(found, input_shape=tuple(input_shape))
        return found
    if spec.lower().endswith(SCRIPT_SUFFIXES) or os.sep in spec:
        return _from_file(spec, input_shape)
    if ":" in spec:
        return _from_factory(spec, input_shape)
    raise _unknown(spec)


def _to_graph(module: torch.nn.Module, example: torch.Tensor) -> torch.jit.ScriptModule:
    with torch.no_grad(), _quiet_jit():
        if isinstance(module, torch.jit.ScriptModule):
            graph = module  # already TorchScript (loaded from a file)
        else:
            graph = torch.jit.trace(module, example, check_trace=False)
        graph = torch.jit.optimize_for_inference(torch.jit.freeze(graph.eval()))
        graph(example)  # fail here, not in the serving path, if an optimization broke something
    return graph


def prepare(spec: ModelSpec, batch: int, graph_mode: bool = True
            ) -> tuple[torch.nn.Module | torch.jit.ScriptModule, torch.Tensor, str]:
    """Build the model and its example input; in graph mode, trace + freeze + optimize it.

    Returns (module, example_input, mode) with mode "script" or "eager".
    """
    module = spec.build()
    example = module.example_input(batch) if spec.own_example else spec.example_input(batch)
    if graph_mode and spec.scriptable:
        try:
            return _to_graph(module, example), example, "script"
        except Exception as exc:  # any tracing/freezing failure: serving eager still works
            first_line = (str(exc).splitlines() or [""])[0]
            warnings.warn(f"graph mode failed for model {spec.name!r}, running eager: "
                          f"{type(exc).__name__}: {first_line}", stacklevel=2)
    mode = "script" if isinstance(module, torch.jit.ScriptModule) else "eager"
    return module, example, mode
