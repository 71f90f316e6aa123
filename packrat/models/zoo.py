"""Model zoo: the networks packrat serves and benchmarks, plus user-supplied models.

Every network is plain ``torch.nn`` with random weights from a fixed seed, so
latency experiments need no downloads and are reproducible bit for bit.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from pathlib import Path
from typing import Callable

import torch

from packrat.models.inception import inception_v3
from packrat.models.modes import mode_name, quiet_jit, to_mode
from packrat.models.nasnet import nasnet
from packrat.models.randwire import randwire
from packrat.models.resnet import resnet50
from packrat.models.spec import (
    SEED,
    InputSpec,
    ModelSpec,
    as_tuple,
    reshaped,
    token_inputs,
)
from packrat.models.squeezenet import squeezenet
from packrat.models.tiny import TINY_TEXT_LENGTH, TINY_TEXT_VOCAB, tiny, tiny_text
from packrat.models.transformer import BERT_VOCAB, GPT2_VOCAB, bert_base, gpt2
from packrat.models.trivial import trivial

__all__ = ["ZOO", "DEFAULT_MODEL", "resolve", "prepare"]

SCRIPT_SUFFIXES = (".pt", ".pth", ".ts")
EXPORT_SUFFIX = ".pt2"  # torch.export.save
HF_PREFIX = "hf:"  # a Hugging Face save_pretrained directory


def _zoo(name: str, factory: Callable[[], torch.nn.Module], inputs: tuple[InputSpec, ...], scriptable: bool,
         task: str, description: str) -> ModelSpec:
    return ModelSpec(name, _seeded(factory), inputs, scriptable, task, description, sources=_sources(factory))


def _image(shape: tuple[int, ...]) -> tuple[InputSpec, ...]:
    return (InputSpec("input", shape, "float32"),)


def _sources(factory: Callable) -> tuple[str, ...]:
    """The file that defines a factory's module: its code, and with the seed its weights."""
    path = inspect.getsourcefile(factory)
    return (path,) if path else ()


def _seeded(factory: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    """Wrap a factory so every call gives the same weights and an eval-mode module."""

    def build() -> torch.nn.Module:
        torch.manual_seed(SEED)
        return factory().eval()

    return build


ZOO: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        _zoo("tiny", tiny, _image((3, 32, 32)), True, "classification",
                  "small 3-conv CNN, 10 classes; fast enough for tests"),
        _zoo("tiny_text", tiny_text, token_inputs(TINY_TEXT_LENGTH, TINY_TEXT_VOCAB), True,
                  "embedding", "16 tokens and their mask -> 32-dim embedding; the text path's test model"),
        _zoo("trivial", trivial, _image((3, 32, 32)), True, "classification",
                  "tiny's input, 10 logits from its channel means: next to no cost (the front end's ceiling)"),
        _zoo("resnet50", resnet50, _image((3, 224, 224)), True, "classification",
                  "ResNet-50 (bottleneck [3,4,6,3]), 1000 classes"),
        _zoo("inception_v3", inception_v3, _image((3, 299, 299)), True,
                  "classification", "Inception-v3, 1000 classes, multi-branch blocks"),
        _zoo("bert_base", bert_base, token_inputs(128, BERT_VOCAB, token_types=True), True,
                  "embedding", "BERT-base encoder, 128 tokens with mask and type ids, pooled CLS output (768)"),
        _zoo("gpt2", gpt2, token_inputs(128, GPT2_VOCAB), True, "language-model",
                  "GPT-2 small, 128-token prompt with its mask (left-padded), next-token logits"),
        # The IOS paper's networks: many small parallel operators per block.
        _zoo("squeezenet", squeezenet, _image((3, 224, 224)), True, "classification",
                  "SqueezeNet 1.1, 1000 classes, fire modules with two expand branches"),
        _zoo("randwire", randwire, _image((3, 224, 224)), True, "classification",
                  "RandWire-WS small regime (C=78, 3 random 32-node graphs), 1000 classes"),
        _zoo("nasnet", nasnet, _image((3, 224, 224)), True, "classification",
                  "NASNet-A Mobile 4@1056, 1000 classes, cells of parallel separable convs"),
    )
}
DEFAULT_MODEL = "resnet50"


def _unknown(spec: str) -> ValueError:
    names = ", ".join(ZOO)
    return ValueError(
        f"unknown model {spec!r}: choose one of {names}, a TorchScript file "
        f"({'/'.join(SCRIPT_SUFFIXES)}), a torch.export program ({EXPORT_SUFFIX}), "
        f"{HF_PREFIX}DIR (a Hugging Face save_pretrained directory), or package.module:factory"
    )


def _from_file(path: str, input_shape: tuple[int, ...] | None) -> ModelSpec:
    if not os.path.isfile(path):
        raise ValueError(f"model file not found: {path}")
    if input_shape is None:
        raise ValueError(f"TorchScript model {path} needs an input shape (one sample, e.g. 3,224,224)")

    def build() -> torch.nn.Module:
        with quiet_jit():
            return torch.jit.load(path, map_location="cpu").eval()

    name = os.path.splitext(os.path.basename(path))[0]
    return ModelSpec(name, build, _image(tuple(input_shape)), True, "classification", f"TorchScript file {path}",
                     sources=(path,))


def _from_factory(spec: str, input_shape: tuple[int, ...] | None) -> ModelSpec:
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"cannot load model factory {spec!r}: {exc}") from None
    if not callable(factory):
        raise ValueError(f"model factory {spec!r} is not callable")
    build = _seeded(factory)

    if input_shape is not None:
        inputs, own_example = _image(tuple(input_shape)), False
    else:
        # Only a module that knows its own input can go without an explicit shape.
        probe = build()
        if not callable(getattr(probe, "example_input", None)):
            raise ValueError(f"model factory {spec!r} needs an input shape: its module has no example_input(batch)")
        samples = as_tuple(probe.example_input(1))
        inputs = tuple(InputSpec(f"input{i}" if len(samples) > 1 else "input", tuple(x.shape[1:]),
                                 str(x.dtype).removeprefix("torch.")) for i, x in enumerate(samples))
        own_example = True
    # Scriptability is unknown up front: prepare() tries and falls back to eager.
    return ModelSpec(attr, build, inputs, True, "classification", f"factory {spec}", own_example=own_example,
                     sources=_sources(factory))


def resolve(spec: str, input_shape: tuple[int, ...] | None = None) -> ModelSpec:
    """Turn a zoo name, a TorchScript file path or "package.module:factory" into a ModelSpec.

    For zoo models, input_shape (if given) overrides the default, e.g. another sequence length.
    Files and factories given an input_shape take float32 input; a factory's module may
    instead define example_input(batch), which then sets shape and dtype.
    """
    if spec in ZOO:
        found = ZOO[spec]
        if input_shape is not None and tuple(input_shape) != found.input_shape:
            found = dataclasses.replace(found, inputs=reshaped(found.inputs, tuple(input_shape)))
        return found
    if spec.startswith(HF_PREFIX):
        from packrat.models.hf import (
            from_pretrained_dir,  # needs the optional transformers
        )

        return from_pretrained_dir(spec[len(HF_PREFIX):], input_shape)
    if spec.lower().endswith(EXPORT_SUFFIX):
        from packrat.models.exported import from_program

        return from_program(spec, input_shape)
    if spec.lower().endswith(SCRIPT_SUFFIXES) or os.sep in spec:
        return _from_file(spec, input_shape)
    if ":" in spec:
        return _from_factory(spec, input_shape)
    raise _unknown(spec)


def prepare(spec: ModelSpec, batch: int, graph_mode: str | bool | None = None, compile_cache: str | None = None,
            ladder: bool = True) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], str]:
    """Build the model and its example inputs, and put it in its graph mode (packrat.models.modes;
    None or True: the default, compile; False: eager). Compile mode loads the packages it finds
    in `compile_cache` (an archive's), else those of this machine's cache
    (packrat.models.compiled.default_cache_dir()), where it builds the missing ones: for the
    batch's halving ladder, or (not `ladder`: a profile point) for `batch` alone.

    Returns (module, example inputs, mode actually used). Call it as module(*inputs).
    """
    mode = mode_name(graph_mode)
    module = spec.build()
    examples = as_tuple(module.example_input(batch)) if spec.own_example else spec.example_inputs(batch)
    if not spec.scriptable and mode != "eager":
        return module, examples, "script" if isinstance(module, torch.jit.ScriptModule) else "eager"
    package_for = (lambda size: compiled_package(spec, size, compile_cache)) if mode == "compile" else None
    runnable, used = to_mode(module, examples, mode, spec.name, package_for, ladder)
    return runnable, examples, used


def compiled_package(spec: ModelSpec, batch: int, shipped: str | None = None, threads: int | None = None) -> Path:
    """The model's compiled package for `batch` at `threads` (default: this process's torch
    threads; see packrat.models.compiled): in `shipped` if it is there, else in this machine's cache
    (where it is built if missing). An archive's directory vanishes when TorchServe stops, so what
    an instance builds goes to the machine's cache."""
    from packrat.models import compiled

    threads = threads or torch.get_num_threads()
    key = compiled.package_key(f"{spec.name}:{SEED}", spec.sources, spec.inputs)
    if shipped is not None and compiled.package_path(shipped, spec.name, key, threads, batch).exists():
        return compiled.package_path(shipped, spec.name, key, threads, batch)
    return compiled.package_path(compiled.default_cache_dir(), spec.name, key, threads, batch)


def compiled_packages(spec: ModelSpec, largest_batch: int) -> list[Path]:
    """The model's packages in this machine's cache, any thread count, batch sizes up to `largest_batch`."""
    pattern = compiled_package(spec, 1, threads=1).name.replace("-t1-b1", "-t*-b*")
    found = compiled_package(spec, 1, threads=1).parent.glob(pattern)
    return sorted(path for path in found if int(path.name.split("-b")[-1].split(".")[0]) <= largest_batch)
