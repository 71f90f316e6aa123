"""A model's inputs: a list of named tensors, each one sample's shape (no batch dimension) and
dtype. Text models take token ids with an attention mask (and, for BERT-style models, token type
ids); image models take one float tensor. Plain data, shared by the model zoo, the codec, the
profiler's examples and the KServe v2 answers, so it imports no torch."""

from __future__ import annotations

from dataclasses import dataclass, replace

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
