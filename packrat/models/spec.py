"""What a model is: a ModelSpec (how to build it, its inputs, its task) and its inputs.

A model's inputs: a list of named tensors, each one sample's shape (no batch dimension) and
dtype. Text models take token ids with an attention mask (and, for BERT-style models, token type
ids); image models take one float tensor. Plain data, shared by the model zoo, the codec, the
profiler's examples and the KServe v2 answers, so this module imports torch only to make examples."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # annotations only: importing the spec costs no torch
    import torch

FILLS = ("ones", "zeros")  # how a request may leave an input out: the mask of an unpadded text, one segment
MASK, TOKEN_TYPES = "attention_mask", "token_type_ids"


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]  # one sample, without the batch dimension
    dtype: str = "float32"  # torch dtype name without "torch."
    vocab_size: int | None = None  # integer inputs: values must lie in [0, vocab_size)
    fill: str | None = None  # "ones" | "zeros": what a request that leaves this input out means

    def __post_init__(self) -> None:
        if self.fill is not None and self.fill not in FILLS:
            raise ValueError(f"input {self.name!r}: fill must be one of {', '.join(FILLS)}, not {self.fill!r}")

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith(("float", "bfloat"))

    def describe(self) -> str:
        return f"{self.name}: {self.dtype} of shape {'x'.join(map(str, self.shape)) or 'scalar'}"


def token_inputs(length: int, vocab_size: int, token_types: bool = False) -> tuple[InputSpec, ...]:
    """A text model's inputs: ids, the mask (ones: no padding) and, if it takes them, type ids."""
    inputs = [InputSpec("input_ids", (length,), "int64", vocab_size),
              InputSpec(MASK, (length,), "int64", 2, fill="ones")]
    if token_types:
        inputs.append(InputSpec(TOKEN_TYPES, (length,), "int64", 2, fill="zeros"))
    return tuple(inputs)


def reshaped(inputs: tuple[InputSpec, ...], shape: tuple[int, ...]) -> tuple[InputSpec, ...]:
    """The inputs with the first one's shape set to `shape`, and every input that shared its
    shape too (another sequence length changes the ids, the mask and the type ids alike)."""
    old = inputs[0].shape
    return tuple(replace(spec, shape=tuple(shape)) if spec.shape == old else spec for spec in inputs)


def describe(inputs: tuple[InputSpec, ...]) -> str:
    return ", ".join(spec.describe() for spec in inputs)


SEED = 0


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[[], torch.nn.Module]  # fresh module, seeded random weights, in eval mode
    inputs: tuple[InputSpec, ...]  # the module's positional arguments, in order
    scriptable: bool  # a graph mode (compile, trace) is expected to work
    task: str  # "classification" | "embedding" | "language-model"
    description: str = ""
    # The module defines example_input(batch) itself (user factories); use it instead of random data.
    own_example: bool = False
    labels: str | None = None  # index_to_name.json that comes with the model (a Hugging Face config's id2label)
    tokenizer: str | None = None  # tokenizer.json that comes with the model (a save_pretrained directory)
    sources: tuple[str, ...] = ()  # files (or directories) whose contents define the model: code and weights

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The first input's shape: the image, or the token ids."""
        return self.inputs[0].shape

    @property
    def input_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.inputs[0].dtype)

    @property
    def vocab_size(self) -> int | None:
        return self.inputs[0].vocab_size

    def example_inputs(self, batch: int) -> tuple[torch.Tensor, ...]:
        """Deterministic inputs, each of shape (batch, *shape); sample i is the same for any batch."""
        if self.own_example:
            # Costs a build; prepare() avoids it by asking the module it already built.
            return as_tuple(self.build().example_input(batch))
        import torch

        gen = torch.Generator().manual_seed(SEED)
        return tuple(_example(spec, batch, gen) for spec in self.inputs)

    def example_input(self, batch: int) -> torch.Tensor:
        """The one input of a single-input model (images, tensors)."""
        if len(self.inputs) != 1:
            raise ValueError(f"model {self.name!r} takes {len(self.inputs)} inputs ({describe(self.inputs)}): "
                             f"use example_inputs")
        return self.example_inputs(batch)[0]


def _example(spec: InputSpec, batch: int, gen: torch.Generator) -> torch.Tensor:
    import torch

    dtype = getattr(torch, spec.dtype)
    if spec.fill is not None:  # a mask of no padding, one segment: what a real request mostly is
        return (torch.ones if spec.fill == "ones" else torch.zeros)((batch, *spec.shape), dtype=dtype)
    # One draw per sample: a single big randn fills large tensors in a size-dependent
    # order, which would make sample 0 differ between batch sizes.
    if spec.is_float:
        samples = [torch.randn(spec.shape, generator=gen, dtype=dtype) for _ in range(batch)]
    else:
        high = spec.vocab_size or 2  # token ids must stay inside the embedding table
        samples = [torch.randint(0, high, spec.shape, generator=gen, dtype=dtype) for _ in range(batch)]
    return torch.stack(samples)


def as_tuple(value) -> tuple[torch.Tensor, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)
