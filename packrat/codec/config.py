"""What the codec is configured with, and what it hands back: a decoded request, an encoded answer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from packrat.models.spec import InputSpec
from packrat.settings import MAX_BODY_BYTES, MAX_PIXELS, MAX_SAMPLES

TASKS = ("classification", "embedding", "language-model")
V2_OUTPUT = "output0"  # the name of a KServe v2 answer's one output


@dataclass(frozen=True)
class CodecConfig:
    input_shape: tuple[int, ...]  # one sample of the model's (first) input
    input_dtype: str  # torch dtype name without "torch."
    task: str  # "classification" | "embedding" | "language-model"
    model_name: str = "model"  # for KServe v2 answers
    vocab_size: int | None = None  # token ids must be in [0, vocab_size)
    tokenizer: str | None = None  # a Hugging Face tokenizer.json (text models)
    labels: str | None = None  # TorchServe's index_to_name.json
    max_body_bytes: int = MAX_BODY_BYTES
    max_pixels: int = MAX_PIXELS  # decompression bombs: checked from the header, before decoding
    max_samples: int = MAX_SAMPLES  # samples one (KServe) request may carry
    truncate_text: bool = False  # text longer than the model takes: truncated instead of 413
    inputs: tuple[InputSpec, ...] | None = None  # every named input; None: one, of the shape above

    def input_specs(self) -> tuple[InputSpec, ...]:
        if self.inputs:
            return tuple(self.inputs)
        return (InputSpec("input", tuple(self.input_shape), self.input_dtype, self.vocab_size),)

    @classmethod
    def for_model(cls, spec, **overrides) -> CodecConfig:
        """From a packrat.models.spec.ModelSpec (with the tokenizer and labels it comes with);
        overrides win, but a tokenizer or labels of None keep the model's own."""
        first = spec.inputs[0]
        fields = dict(input_shape=tuple(first.shape), input_dtype=first.dtype, task=spec.task, model_name=spec.name,
                      vocab_size=first.vocab_size, inputs=tuple(spec.inputs),
                      tokenizer=getattr(spec, "tokenizer", None), labels=getattr(spec, "labels", None))
        overrides = {k: v for k, v in overrides.items() if v is not None or k not in ("tokenizer", "labels")}
        return cls(**{**fields, **overrides})


@dataclass
class Decoded:
    samples: tuple[torch.Tensor, ...]  # one per model input, each (k, *its shape), k >= 1
    form: str  # "plain" | "kserve-v1" | "kserve-v2": how to answer
    request_id: str | None = None  # KServe v2 "id", echoed back
    binary_output: bool = False  # KServe v2: answer with the binary tensor extension


@dataclass(frozen=True)
class Encoded:
    body: bytes
    content_type: str = "application/json"
    header_length: int | None = None  # binary KServe v2 answers: the JSON header's length (packrat.codec.oip)
