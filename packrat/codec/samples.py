"""One model's inputs: values read from a request (an image, text, numbers, raw or torch.save
bytes, named inputs) turned into input samples, and the checks every request form shares (shape,
dtype, finite numbers, token ids in the vocabulary, inputs left out filled or refused, sample
counts). Refusals are RequestErrors with a one-line reason. Finite numbers are checked on the
model's outputs, not here (codec.batch: an input is read only when its output is not finite)."""

from __future__ import annotations

import base64
import binascii
import io
import math
import zipfile

import numpy
import torch

from packrat.codec.config import CodecConfig
from packrat.codec.oip import writable
from packrat.errors import RequestError, first_line
from packrat.models.spec import InputSpec
from packrat.models.spec import describe as describe_inputs

SAMPLE_KEYS = ("data", "b64", "body", "text")  # where a JSON object keeps its one sample
NOT_FINITE = "inputs must be finite numbers: got NaN or infinity"


class Samples:
    """Reads values into samples of the model's inputs (each without a batch dimension, keyed by
    input name) and checks them into the batch tensors the model takes."""

    def __init__(self, config: CodecConfig):
        self.config, self.inputs = config, config.input_specs()
        self.first = self.inputs[0]
        self.names = [spec.name for spec in self.inputs]
        self.dtypes = {spec.name: dtype_of(spec) for spec in self.inputs}
        self.shape, self.dtype = tuple(self.first.shape), self.dtypes[self.first.name]
        self.takes_tokens = self.dtype == torch.int64 and len(self.shape) == 1
        # a raw sample of the one input is the batch's row as it is: no input to fill, no range to check
        self.raw_is_row = len(self.inputs) == 1 and (self.dtype.is_floating_point or not self.first.vocab_size)
        self.text = None
        if config.tokenizer:
            if not self.takes_tokens:
                raise ValueError(f"a tokenizer needs a model taking int64 token ids of shape (L,), "
                                 f"not {self.describe()}")
            from packrat.codec.text import TextEncoder

            self.text = TextEncoder(config.tokenizer, self.shape[0], config.task == "language-model",
                                    config.truncate_text)

    @property
    def input_kind(self) -> str:
        if self.dtype.is_floating_point and len(self.shape) == 3 and self.shape[0] == 3:
            return "image"
        return "text" if self.text is not None else "tensor"

    def describe(self, spec: InputSpec | None = None) -> str:
        if spec is None and len(self.inputs) > 1:
            return f"inputs {describe_inputs(self.inputs)}"
        spec = spec or self.first
        return f"{spec.dtype} of shape {'x'.join(map(str, spec.shape))}"

    def for_input(self, spec: InputSpec) -> str:
        """" for NAME" in a reason, where the model has several inputs to tell apart."""
        return f" for {spec.name}" if len(self.inputs) > 1 else ""

    def holds_named(self, value: dict) -> bool:
        """Whether a JSON object holds the model's inputs by name (a multi-input model's sample)."""
        return len(self.inputs) > 1 and any(name in value for name in self.names)

    # ---- one sample from a value ------------------------------------------------------------

    def sample(self, value) -> dict[str, torch.Tensor]:
        """One sample from a JSON value: base64 image or text, an object holding one, an object of
        named inputs, or numbers (the first input)."""
        if isinstance(value, str):
            return self.first_input(self.image(b64(value))) if self.input_kind == "image" else self.text_sample(value)
        if isinstance(value, dict):
            if self.holds_named(value):
                return self.named_sample(value)
            for key in SAMPLE_KEYS:
                if key in value:
                    return self.sample(value[key])
            raise RequestError(400, 'a sample object must be {"data": ...}, {"b64": ...} or {"text": ...}')
        if isinstance(value, list):
            return self.first_input(self.one(self.numbers(value)))
        raise RequestError(400, f"cannot read a sample from a JSON {type(value).__name__}")

    def named_sample(self, value: dict) -> dict[str, torch.Tensor]:
        unknown = [key for key in value if key not in self.names]
        if unknown:
            raise RequestError(400, f"unknown input {str(unknown[0])[:40]!r}: this model takes {', '.join(self.names)}")
        return {spec.name: self.one(self.numbers(value[spec.name], spec), spec)
                for spec in self.inputs if spec.name in value}

    def first_input(self, sample: torch.Tensor) -> dict[str, torch.Tensor]:
        return {self.first.name: sample}

    def image(self, data, out: torch.Tensor | None = None) -> torch.Tensor:
        """The image's sample; decoded straight into `out` (a row of the batch) when given."""
        if self.input_kind != "image":
            raise RequestError(400, f"this model takes {self.describe()}, not images")
        from packrat.codec.images import to_sample

        return to_sample(data, self.shape, self.config.max_pixels, out=out)

    def text_sample(self, text: str) -> dict[str, torch.Tensor]:
        if self.text is not None:
            row = self.text.encode(text)  # ids, and the mask and type ids of the padded row
            ids = {self.first.name: row.pop("input_ids")}
            return ids | {name: tensor for name, tensor in row.items() if name in self.dtypes}
        if self.takes_tokens:
            raise RequestError(400, "this model was archived without a tokenizer: send token ids, "
                                    "or archive with --tokenizer DIR")
        raise RequestError(400, f"this model takes {self.describe()}, not text")

    def numbers(self, value, spec: InputSpec | None = None) -> torch.Tensor:
        """Nested JSON numbers as a tensor of the input's dtype (the first input's by default)."""
        spec = spec or self.first
        dtype = self.dtypes[spec.name]
        try:
            tensor = torch.tensor(value)
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            raise RequestError(400, f"inputs must be a nested list of numbers ({first_line(exc)})") from None
        if tensor.dtype == torch.bool or tensor.is_complex():
            raise RequestError(400, f"inputs must be numbers, got {str(tensor.dtype).removeprefix('torch.')}")
        if tensor.is_floating_point() and not dtype.is_floating_point:
            raise RequestError(400, f"wrong dtype: got floating-point numbers, expected {self.describe(spec)}")
        return tensor.to(dtype)

    def raw_size(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def raw(self, body: bytes | bytearray | memoryview) -> torch.Tensor:
        """The sample, read where it lies when the buffer is writable (a request's bytearray, an
        instance's shared memory: no copy); bytes are copied, since a tensor may not alias them."""
        size = self.raw_size()
        if len(body) != size:
            also = ", or an image" if self.input_kind == "image" else ", or text" if self.text else ""
            raise RequestError(400, f"wrong size: {len(body)} bytes, expected {size} ({self.describe()}{also})")
        if not writable(body):
            body = bytearray(body)
        return torch.frombuffer(body, dtype=self.dtype).view(self.shape)

    def saved_tensor(self, body: bytes) -> torch.Tensor:
        """A torch.save tensor, read with weights_only after refusing zip bombs."""
        try:  # torch.load inflates compressed entries: refuse zip bombs before it does
            unpacked = sum(entry.file_size for entry in zipfile.ZipFile(io.BytesIO(body)).infolist())
        except (zipfile.BadZipFile, ValueError, EOFError) as exc:
            raise RequestError(400, f"undecodable body: not a torch.save tensor ({first_line(exc)})") from None
        limit = self.raw_size() + 2**20
        if unpacked > limit:
            raise RequestError(413, f"torch.save body too large: {unpacked} bytes unpacked (limit {limit})")
        try:
            value = torch.load(io.BytesIO(body), weights_only=True, map_location="cpu")
        except Exception as exc:  # weights_only refuses arbitrary pickles with UnpicklingError
            raise RequestError(400, f"undecodable body: not a torch.save tensor "
                                    f"({type(exc).__name__}: {first_line(exc)})") from None
        if not isinstance(value, torch.Tensor):
            raise RequestError(400, f"torch.save body must hold a tensor, got {type(value).__name__}")
        if value.dtype != self.dtype:
            got = str(value.dtype).removeprefix("torch.")
            raise RequestError(400, f"wrong dtype: got {got}, expected {self.describe()}")
        return value.detach()

    def one(self, value: torch.Tensor, spec: InputSpec | None = None) -> torch.Tensor:
        """A tensor of one sample; a batch of one counts as one sample."""
        spec = spec or self.first
        if tuple(value.shape) == (1, *spec.shape):
            value = value[0]
        if tuple(value.shape) != spec.shape:
            shape = "x".join(map(str, value.shape)) or "scalar"
            raise RequestError(400, f"wrong shape{self.for_input(spec)}: got {shape}, expected {self.describe(spec)}")
        return value

    # ---- the batch tensors ------------------------------------------------------------------

    def count(self, k: int) -> None:
        if k > self.config.max_samples:
            raise RequestError(413, f"too many samples: {k} (limit {self.config.max_samples})")

    def batch(self, parts: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Every input, in the model's order, after the checks every path shares: inputs left out
        filled (or refused), one sample count, finite numbers, integers in their range."""
        count = next(iter(parts.values())).shape[0]
        if count == 0:
            raise RequestError(400, "no samples in the request")
        self.count(count)
        return tuple(self._checked(spec, parts, count) for spec in self.inputs)

    def batch_of_one(self, sample: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return self.batch({name: tensor[None] for name, tensor in sample.items()})

    def _checked(self, spec: InputSpec, parts: dict[str, torch.Tensor], count: int) -> torch.Tensor:
        dtype = self.dtypes[spec.name]
        if spec.name not in parts:
            if spec.fill is None:
                raise RequestError(400, f"missing input {spec.name!r}: this model takes {self.describe()}")
            return (torch.ones if spec.fill == "ones" else torch.zeros)((count, *spec.shape), dtype=dtype)
        samples = parts[spec.name]
        if samples.shape[0] != count:
            raise RequestError(400, f"inputs disagree on the number of samples: {samples.shape[0]} for "
                                    f"{spec.name!r}, {count} for another")
        vocab = spec.vocab_size
        if vocab and not dtype.is_floating_point:
            bad = samples[(samples < 0) | (samples >= vocab)]
            if bad.numel():
                what = "token id" if spec is self.first else f"{spec.name} value"
                raise RequestError(400, f"{what} {int(bad[0])} is outside the model's "
                                        f"{'vocabulary' if spec is self.first else 'range'} [0, {vocab})")
        return samples.contiguous()


def dtype_of(spec: InputSpec) -> torch.dtype:
    dtype = getattr(torch, spec.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown input dtype {spec.dtype!r}: use a torch dtype name such as float32")
    return dtype


def stacked(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Samples (each its inputs without a batch dimension) as a batch per input; an input that
    only some samples give is refused, since filling it for the others would mix two meanings."""
    names = set(samples[0])
    if any(set(sample) != names for sample in samples):
        raise RequestError(400, "every sample of a request must give the same inputs")
    return {name: torch.stack([sample[name] for sample in samples]) for name in samples[0]}


def as_text(body: bytes | bytearray) -> str | None:
    """The body as text if it reads as UTF-8 without NULs (raw int64 token ids always have some)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


def b64(value: str) -> bytes:
    """Base64 (standard alphabet, line breaks and missing padding allowed; data: URLs too)."""
    if value.startswith("data:") and "base64," in value[:100]:
        value = value.split("base64,", 1)[1]
    value = "".join(value.split())
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(400, "undecodable body: image data is not base64") from None


def all_finite(values: torch.Tensor) -> bool:
    """No NaN or infinity among `values`, in one pass that allocates nothing the size of the input.
    The dot product of the values with themselves is finite exactly when they are, unless it
    overflows (values beyond about 1e19), which the exact test then settles: a NaN anywhere makes
    both the minimum and the maximum NaN, an infinity one of them. For a 224x224 image: the dot
    product 0.005 ms, the minimum and maximum 0.031, torch.isfinite(values).all() 0.33 (one core,
    in cache; BENCHMARKS.md, issue 41)."""
    if values.numel() == 0:
        return True
    flat = values.reshape(-1)
    if flat.dtype in (torch.float32, torch.float64) and not flat.requires_grad:
        row = flat.numpy()  # numpy's dot of a batch's outputs: a fifth of torch's call (issue 63)
        if numpy.isfinite(numpy.dot(row, row)):
            return True
    low, high = torch.aminmax(values)
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))
