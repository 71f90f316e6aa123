"""One model's request bodies to input samples, and its outputs to response bodies.

Accepted bodies (one sample each unless a KServe form carries several):
- images, for models taking float (3, H, W): JPEG, PNG, WebP, GIF or BMP bytes, recognised by
  their magic bytes or an image/* content type; pre-processed as TorchServe's image classifier;
- text, for models taking int64 (L,) token ids with a tokenizer: a text/* body, any UTF-8 body
  that is not JSON, or JSON {"text": ...} / {"data": ...}; tokenised and padded to L, with the
  attention mask and token type ids of the padded row where the model takes them;
- JSON {"data" | "body": base64 image or text}, legacy {"inputs": nested numbers};
- KServe v1 {"instances": [sample, ...]}, each a base64 image, text, {"data" | "b64" | "text": ...},
  nested numbers, or an object of named inputs {"input_ids": [...], "attention_mask": [...]},
  answered {"predictions": [...]};
- KServe v2 {"id"?, "inputs": [{"name", "shape", "datatype", "data"}, ...]}: one entry per model
  input, by name (a single-input model takes any name), numbers of the input's shape or [k, *shape],
  or BYTES (images in base64, or text) for the first input; answered in kind; also with the binary
  tensor extension (packrat.oip: a JSON header, then raw tensors; BYTES elements are then raw image
  bytes or UTF-8 text), answered with binary outputs when the request asks for them;
- a JSON object of named inputs (one sample each);
- raw little-endian bytes of one sample, or torch.save bytes of it (read with weights_only).
A model may take several named inputs (packrat.inputs); the single-sample forms above give its
first input (the image, or the token ids), and an input a request leaves out is filled as its
spec says (an attention mask of ones: no padding; token types of zeros), or refused.
Anything else gets a RequestError with an HTTP status and a one-line reason, so the rest of
its batch can still be answered; decode raises nothing else.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import zipfile
from dataclasses import dataclass

import torch

from packrat.codec import oip
from packrat.errors import REASON_CHARS, RequestError, first_line  # noqa: F401 (re-exported)
from packrat.models.spec import InputSpec
from packrat.models.spec import describe as describe_inputs

TOP_K = 5
TASKS = ("classification", "embedding", "language-model")
ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive
SAMPLE_KEYS = ("data", "b64", "body", "text")  # where a JSON object keeps its one sample
SNIFFED_TYPES = ("", "application/octet-stream", "application/x-www-form-urlencoded")  # say nothing
V2_OUTPUT = "output0"  # the name of a KServe v2 answer's one output
V2_INPUTS = ("FP32", "FP64", "FP16", "INT64", "INT32", "INT16", "INT8", "UINT8")


MAX_BODY_BYTES = 16 * 2**20  # a request body's default limit (413 above it)


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
    max_pixels: int = 50_000_000  # decompression bombs: checked from the header, before decoding
    max_samples: int = 64  # samples one (KServe) request may carry
    truncate_text: bool = False  # text longer than the model takes: truncated instead of 413
    inputs: tuple[InputSpec, ...] | None = None  # every named input; None: one, of the shape above

    def input_specs(self) -> tuple[InputSpec, ...]:
        if self.inputs:
            return tuple(self.inputs)
        return (InputSpec("input", tuple(self.input_shape), self.input_dtype, self.vocab_size),)

    @classmethod
    def for_model(cls, spec, **overrides) -> CodecConfig:
        """From a packrat.models.ModelSpec (with the tokenizer and labels it comes with);
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
    header_length: int | None = None  # binary KServe v2 answers: the JSON header's length (packrat.oip)


def request_body(row: dict):
    """TorchServe puts the body under "data" or "body"."""
    body = row.get("data")
    return row.get("body") if body is None else body


class Codec:
    def __init__(self, config: CodecConfig):
        self.config, self.inputs = config, config.input_specs()
        self.first = self.inputs[0]
        self.names = [spec.name for spec in self.inputs]
        self.dtypes = {spec.name: _dtype(spec) for spec in self.inputs}
        self.shape, self.dtype = tuple(self.first.shape), self.dtypes[self.first.name]
        if config.task not in TASKS:
            raise ValueError(f"unknown task {config.task!r}: use one of {', '.join(TASKS)}")
        self.takes_tokens = self.dtype == torch.int64 and len(self.shape) == 1
        self.text = None
        if config.tokenizer:
            if not self.takes_tokens:
                raise ValueError(f"a tokenizer needs a model taking int64 token ids of shape (L,), "
                                 f"not {self.describe()}")
            from packrat.codec.text import TextEncoder

            self.text = TextEncoder(config.tokenizer, self.shape[0], config.task == "language-model",
                                    config.truncate_text)
        self.labels = _load_labels(config.labels) if config.labels else None

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

    # ---- decoding ---------------------------------------------------------------------------

    def decode(self, body, content_type: str | None, header_length: int | str | None = None) -> Decoded:
        """The request's samples and how to answer it; RequestError and nothing else.
        `header_length`: the KServe v2 binary extension's Inference-Header-Content-Length (as sent)."""
        try:
            kind = (content_type or "").split(";")[0].strip().lower()
            return self._decode(body, kind, oip.header_length(header_length))
        except RequestError:
            raise
        except Exception as exc:  # a bug or a body nobody foresaw: still only this request's failure
            raise RequestError(400, f"cannot decode request: {type(exc).__name__}: {first_line(exc)}") from None

    def _decode(self, body, kind: str, header_length: int | None) -> Decoded:
        if isinstance(body, str):  # TorchServe decodes text/* bodies
            body, kind = body.encode("utf-8"), kind or "text/plain"
        if isinstance(body, memoryview):
            body = body.tobytes()
        if isinstance(body, (bytes, bytearray)):
            return self._from_bytes(bytes(body), kind, header_length)
        if body is None:
            raise RequestError(400, "empty request: send one input sample as the body")
        if isinstance(body, (dict, list)):  # TorchServe decodes JSON bodies
            return self._from_json(body)
        raise RequestError(400, f"unsupported request body: {type(body).__name__}")

    def _from_bytes(self, body: bytes, kind: str, header_length: int | None) -> Decoded:
        limit = self.config.max_body_bytes
        if len(body) > limit:
            raise RequestError(413, f"request too large: {len(body)} bytes (limit {limit})")
        if not body and kind.startswith("application/x-www-form-urlencoded"):
            raise RequestError(400, "empty request: a form post (curl -d/--data-binary without a Content-Type) is "
                                    "split into fields by TorchServe; send -H 'Content-Type: image/jpeg' (or the "
                                    "body's type), or use curl -T FILE")
        if not body:
            raise RequestError(400, "empty request: send one input sample as the body")
        if header_length is not None:  # the KServe v2 binary extension says where its JSON ends
            return self._v2(*oip.split(body, header_length))
        if body[:4] == ZIP_MAGIC:
            return self._plain(self._first(self._one(self._load_tensor(bytes(body)))))
        if kind.startswith("image/") or (self.input_kind == "image" and _is_image(body)):
            return self._plain(self._first(self._image(bytes(body))))
        if "json" in kind:
            return self._json_bytes(body)
        json_error = None
        # text/plain text for a text model may well start with "[" or "{"
        sniffed = kind in SNIFFED_TYPES or (kind.startswith("text/") and not self.takes_tokens)
        if sniffed and body[:64].lstrip()[:1] in (b"{", b"["):
            try:
                return self._json_bytes(body)
            except RequestError as exc:  # or raw bytes / text that merely start like JSON
                json_error = exc
        text = _as_text(body) if self.takes_tokens or kind.startswith("text/") else None
        if text is not None:
            return self._plain(self._text(text))
        if json_error is not None and len(body) != self._raw_size():
            raise json_error
        return self._plain(self._first(self._raw(body)))

    def _json_bytes(self, body: bytes) -> Decoded:
        """A JSON body, or a KServe v2 binary one that came without its header length (found by
        parsing: JSON followed by bytes)."""
        try:
            value = _parse_json(body)
        except RequestError:
            binary = oip.split(body, None)
            if binary is None or not _is_v2(binary[0]):
                raise
            return self._v2(*binary)
        return self._from_json(value)

    def _from_json(self, body) -> Decoded:
        if isinstance(body, dict):
            if "instances" in body:
                return self._v1(body["instances"])
            if _is_v2(body):
                return self._v2(body)
            inputs = body.get("inputs")
            if "inputs" in body:  # legacy: nested numbers of one sample
                return self._plain(self._first(self._one(self._numbers(inputs))))
            if any(key in body for key in SAMPLE_KEYS) or self._named(body):
                return self._plain(self._sample(body))
        names = f", or the model's inputs by name ({', '.join(self.names)})" if len(self.inputs) > 1 else ""
        raise RequestError(400, f'JSON body must be an object with "data", "text", "inputs" or "instances"{names}')

    def _v1(self, instances) -> Decoded:
        if not isinstance(instances, list) or not instances:
            raise RequestError(400, '"instances" must be a non-empty list of samples')
        self._count(len(instances))
        return Decoded(self._finish(_stack([self._sample(item) for item in instances])), "kserve-v1")

    def _v2(self, body: dict, binary: bytes = b"") -> Decoded:
        """A KServe v2 body; `binary`: the bytes after its JSON (binary tensor extension)."""
        request_id = body.get("id")
        if request_id is not None and not isinstance(request_id, str):
            raise RequestError(400, '"id" must be a string')
        inputs = body.get("inputs")
        if not isinstance(inputs, list) or not inputs:
            raise RequestError(400, '"inputs" must be a non-empty list of objects {"name", "shape", "datatype", ...}')
        parts: dict[str, torch.Tensor] = {}
        for entry, chunk in zip(inputs, oip.chunks(inputs, binary)):
            if not isinstance(entry, dict):
                raise RequestError(400, 'each of "inputs" must be an object {"name", "shape", "datatype", "data"}')
            spec = self._v2_input(entry.get("name"))
            if spec.name in parts:
                raise RequestError(400, f"input {spec.name!r} given twice")
            datatype, data = entry.get("datatype"), entry.get("data")
            if datatype == "BYTES":
                if spec is not self.first:
                    raise RequestError(400, f"BYTES (images or text) go to the first input, {self.first.name!r}, "
                                            f"not {spec.name!r}")
                parts.update(self._v2_bytes(data) if chunk is None else self._v2_raw_bytes(oip.elements(chunk)))
            else:
                parts[spec.name] = self._v2_numbers(spec, datatype, entry.get("shape"), data, chunk)
        binary_output = oip.binary_output(body, V2_OUTPUT)
        return Decoded(self._finish(parts), "kserve-v2", request_id, binary_output)

    def _v2_input(self, name) -> InputSpec:
        """The input a v2 entry is for: by name; a single-input model takes any name."""
        if len(self.inputs) == 1:
            return self.first
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise RequestError(400, f"unknown input {str(name)[:40]!r}: this model takes {', '.join(self.names)}")

    def _v2_bytes(self, data) -> dict[str, torch.Tensor]:
        """One sample per element (base64 image or text); shape [k] or [k, 1]."""
        rows = data if isinstance(data, list) else [data]
        items = [x for row in rows for x in (row if isinstance(row, list) else [row])]
        if not items:
            raise RequestError(400, "KServe v2 input has no data")
        self._count(len(items))
        return _stack([self._sample(item) for item in items])

    def _v2_raw_bytes(self, items: list[bytes]) -> dict[str, torch.Tensor]:
        """One sample per binary BYTES element: raw image bytes, or UTF-8 text."""
        if not items:
            raise RequestError(400, "KServe v2 input has no data")
        self._count(len(items))
        if self.input_kind == "image":
            return _stack([self._first(self._image(item)) for item in items])
        texts = [_as_text(item) for item in items]
        if None in texts:
            raise RequestError(400, "a BYTES element is neither an image nor UTF-8 text")
        return _stack([self._text(text) for text in texts])

    def _v2_numbers(self, spec: InputSpec, datatype, shape, data, chunk: bytes | None = None) -> torch.Tensor:
        """An input's numbers: JSON "data", or its binary `chunk`, of `shape` ([k, *the input's] or its own)."""
        if datatype not in V2_INPUTS:
            raise RequestError(400, f"unsupported datatype {str(datatype)[:20]!r}: use BYTES or one of "
                                    f"{', '.join(V2_INPUTS)}")
        if datatype.startswith("FP") and not spec.is_float:
            raise RequestError(400, f"wrong dtype{self._for(spec)}: got {datatype}, expected {self.describe(spec)}")
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            raise RequestError(400, '"shape" must be a list of non-negative integers')
        if chunk is None:
            values = self._numbers(data, spec).flatten()
        else:
            values = oip.tensor(chunk, datatype).to(self.dtypes[spec.name])
        if math.prod(shape) != values.numel():
            raise RequestError(400, f"shape {shape} does not match the {values.numel()} values in data")
        values = values.view(shape)
        if tuple(shape) == spec.shape:
            return values[None]
        if tuple(shape[1:]) != spec.shape:
            raise RequestError(400, f"wrong shape{self._for(spec)}: got {shape}, expected {list(spec.shape)} or "
                                    f"[k, {', '.join(map(str, spec.shape))}] ({self.describe(spec)})")
        return values

    def _for(self, spec: InputSpec) -> str:
        """" for NAME" in a reason, where the model has several inputs to tell apart."""
        return f" for {spec.name}" if len(self.inputs) > 1 else ""

    def _named(self, value: dict) -> bool:
        """Whether a JSON object holds the model's inputs by name (a multi-input model's sample)."""
        return len(self.inputs) > 1 and any(name in value for name in self.names)

    def _sample(self, value) -> dict[str, torch.Tensor]:
        """One sample from a JSON value: base64 image or text, an object holding one, an object of
        named inputs, or numbers (the first input); each input without a batch dimension."""
        if isinstance(value, str):
            return self._first(self._image(_b64(value))) if self.input_kind == "image" else self._text(value)
        if isinstance(value, dict):
            if self._named(value):
                return self._named_sample(value)
            for key in SAMPLE_KEYS:
                if key in value:
                    return self._sample(value[key])
            raise RequestError(400, 'a sample object must be {"data": ...}, {"b64": ...} or {"text": ...}')
        if isinstance(value, list):
            return self._first(self._one(self._numbers(value)))
        raise RequestError(400, f"cannot read a sample from a JSON {type(value).__name__}")

    def _named_sample(self, value: dict) -> dict[str, torch.Tensor]:
        unknown = [key for key in value if key not in self.names]
        if unknown:
            raise RequestError(400, f"unknown input {str(unknown[0])[:40]!r}: this model takes {', '.join(self.names)}")
        return {spec.name: self._one(self._numbers(value[spec.name], spec), spec)
                for spec in self.inputs if spec.name in value}

    def _first(self, sample: torch.Tensor) -> dict[str, torch.Tensor]:
        return {self.first.name: sample}

    def _image(self, data: bytes) -> torch.Tensor:
        if self.input_kind != "image":
            raise RequestError(400, f"this model takes {self.describe()}, not images")
        from packrat.codec.images import to_sample

        return to_sample(data, self.shape, self.config.max_pixels)

    def _text(self, text: str) -> dict[str, torch.Tensor]:
        if self.text is not None:
            row = self.text.encode(text)  # ids, and the mask and type ids of the padded row
            ids = {self.first.name: row.pop("input_ids")}
            return ids | {name: tensor for name, tensor in row.items() if name in self.dtypes}
        if self.takes_tokens:
            raise RequestError(400, "this model was archived without a tokenizer: send token ids, "
                                    "or archive with --tokenizer DIR")
        raise RequestError(400, f"this model takes {self.describe()}, not text")

    def _numbers(self, value, spec: InputSpec | None = None) -> torch.Tensor:
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

    def _raw_size(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def _raw(self, body: bytes | bytearray) -> torch.Tensor:
        size = self._raw_size()
        if len(body) != size:
            also = ", or an image" if self.input_kind == "image" else ", or text" if self.text else ""
            raise RequestError(400, f"wrong size: {len(body)} bytes, expected {size} ({self.describe()}{also})")
        return torch.frombuffer(bytearray(body), dtype=self.dtype).view(self.shape)

    def _load_tensor(self, body: bytes) -> torch.Tensor:
        try:  # torch.load inflates compressed entries: refuse zip bombs before it does
            unpacked = sum(entry.file_size for entry in zipfile.ZipFile(io.BytesIO(body)).infolist())
        except (zipfile.BadZipFile, ValueError, EOFError) as exc:
            raise RequestError(400, f"undecodable body: not a torch.save tensor ({first_line(exc)})") from None
        limit = self._raw_size() + 2**20
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

    def _one(self, value: torch.Tensor, spec: InputSpec | None = None) -> torch.Tensor:
        """A tensor of one sample; a batch of one counts as one sample."""
        spec = spec or self.first
        if tuple(value.shape) == (1, *spec.shape):
            value = value[0]
        if tuple(value.shape) != spec.shape:
            shape = "x".join(map(str, value.shape)) or "scalar"
            raise RequestError(400, f"wrong shape{self._for(spec)}: got {shape}, expected {self.describe(spec)}")
        return value

    def _plain(self, sample: dict[str, torch.Tensor]) -> Decoded:
        return Decoded(self._finish({name: tensor[None] for name, tensor in sample.items()}), "plain")

    def _count(self, k: int) -> None:
        if k > self.config.max_samples:
            raise RequestError(413, f"too many samples: {k} (limit {self.config.max_samples})")

    def _finish(self, parts: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Every input, in the model's order, after the checks every path shares: inputs left out
        filled (or refused), one sample count, finite numbers, integers in their range."""
        count = next(iter(parts.values())).shape[0]
        if count == 0:
            raise RequestError(400, "no samples in the request")
        self._count(count)
        return tuple(self._checked(spec, parts, count) for spec in self.inputs)

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
        if dtype.is_floating_point and not torch.isfinite(samples).all():
            raise RequestError(400, "inputs must be finite numbers: got NaN or infinity")
        vocab = spec.vocab_size
        if vocab and not dtype.is_floating_point:
            bad = samples[(samples < 0) | (samples >= vocab)]
            if bad.numel():
                what = "token id" if spec is self.first else f"{spec.name} value"
                raise RequestError(400, f"{what} {int(bad[0])} is outside the model's "
                                        f"{'vocabulary' if spec is self.first else 'range'} [0, {vocab})")
        return samples.contiguous()

    # ---- encoding ---------------------------------------------------------------------------

    def encode(self, outputs: torch.Tensor, decoded: Decoded) -> bytes:
        """The body answering the request that `decoded` came from (see encoded())."""
        return self.encoded(outputs, decoded).body

    def encoded(self, outputs: torch.Tensor, decoded: Decoded) -> Encoded:
        """Compact UTF-8 JSON answering the request that `decoded` came from; a KServe v2 request
        asking for binary outputs gets a JSON header and the raw outputs (packrat.oip)."""
        outputs = outputs.detach().cpu()
        if decoded.form == "kserve-v2":
            outputs, head = self._v2_answer(outputs, decoded.request_id)
            if decoded.binary_output:
                body, length = oip.encode(head, [outputs])
                return Encoded(body, "application/octet-stream", length)
            body = {**head, "outputs": [{**head["outputs"][0], "data": outputs.flatten().tolist()}]}
        elif decoded.form == "kserve-v1":
            body = {"predictions": [self._answer(row) for row in outputs]}
        else:
            body = self._answer(outputs[0])
        return Encoded(json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8"))

    def _v2_answer(self, outputs: torch.Tensor, request_id: str | None) -> tuple[torch.Tensor, dict]:
        """The outputs as a v2 datatype can carry them, and the answer without their data."""
        datatype = oip.datatype(outputs.dtype)
        if datatype is None:  # e.g. complex: answer what JSON can carry
            outputs, datatype = outputs.float(), "FP32"
        output = {"name": V2_OUTPUT, "shape": list(outputs.shape), "datatype": datatype}
        head = {"model_name": self.config.model_name} | ({"id": request_id} if request_id is not None else {})
        return outputs, {**head, "outputs": [output]}

    def _answer(self, output: torch.Tensor) -> dict:
        """One sample's plain answer."""
        if self.config.task == "classification":
            scores = torch.softmax(output.float().flatten(), dim=0)
            top, classes = scores.topk(min(TOP_K, scores.numel()))
            return {"predictions": [self._prediction(int(c), float(s)) for c, s in zip(classes, top)]}
        if self.config.task == "language-model":
            logits = output.float().reshape(-1, output.shape[-1])[-1]  # (L, V) outputs: the last position's
            top, tokens = logits.topk(min(TOP_K, logits.numel()))
            return {"next_tokens": [self._next_token(int(t), float(v)) for t, v in zip(tokens, top)]}
        return {"embedding": output.float().flatten().tolist()}

    def _prediction(self, index: int, score: float) -> dict:
        label = self.labels.get(index) if self.labels is not None else None
        return {"class": index, **({"label": label} if label is not None else {}), "score": score}

    def _next_token(self, token: int, logit: float) -> dict:
        text = {"text": self.text.token_text(token)} if self.text is not None else {}
        return {"token": token, **text, "logit": logit}


def sample_request(inputs: tuple[InputSpec, ...], sample: tuple[torch.Tensor, ...]) -> tuple[bytes, str]:
    """(body, content type) of a request for one sample (each input without its batch dimension)
    that Codec reads back exactly: raw little-endian bytes for a single-input model, a KServe v2
    JSON body with one entry per input otherwise (benchmarks and load tests send these)."""
    if len(inputs) == 1:
        array = sample[0].contiguous().numpy()
        return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes(), "application/octet-stream"
    entries = [{"name": spec.name, "shape": list(tensor.shape), "data": tensor.flatten().tolist(),
                "datatype": oip.datatype(tensor.dtype)}
               for spec, tensor in zip(inputs, sample)]
    return json.dumps({"inputs": entries}, separators=(",", ":")).encode(), "application/json"


def _dtype(spec: InputSpec) -> torch.dtype:
    dtype = getattr(torch, spec.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown input dtype {spec.dtype!r}: use a torch dtype name such as float32")
    return dtype


def _stack(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Samples (each its inputs without a batch dimension) as a batch per input; an input that
    only some samples give is refused, since filling it for the others would mix two meanings."""
    names = set(samples[0])
    if any(set(sample) != names for sample in samples):
        raise RequestError(400, "every sample of a request must give the same inputs")
    return {name: torch.stack([sample[name] for sample in samples]) for name in samples[0]}


def _is_v2(body) -> bool:
    """A KServe v2 inference request: {"inputs": [{...}, ...]} (legacy bodies hold numbers there)."""
    inputs = body.get("inputs") if isinstance(body, dict) else None
    return isinstance(inputs, list) and bool(inputs) and isinstance(inputs[0], dict)


def _is_image(body: bytes | bytearray) -> bool:
    from packrat.codec.images import is_image

    return is_image(bytes(body[:32]))


def _parse_json(body: bytes | bytearray):
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except RecursionError:
        raise RequestError(400, "undecodable body: JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise RequestError(400, f"undecodable body: not valid JSON ({type(exc).__name__}: {first_line(exc)})") from None


def _reject_constant(name: str):
    raise RequestError(400, f"JSON holds {name}: only finite numbers are accepted")


def _as_text(body: bytes | bytearray) -> str | None:
    """The body as text if it reads as UTF-8 without NULs (raw int64 token ids always have some)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


def _b64(value: str) -> bytes:
    """Base64 (standard alphabet, line breaks and missing padding allowed; data: URLs too)."""
    if value.startswith("data:") and "base64," in value[:100]:
        value = value.split("base64,", 1)[1]
    value = "".join(value.split())
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(400, "undecodable body: image data is not base64") from None


def _load_labels(path: str) -> dict[int, str]:
    """index_to_name.json: {"0": "tench"} or TorchServe's ImageNet {"0": ["n01440764", "tench"]}."""
    try:
        with open(path, encoding="utf-8") as file:
            raw = json.load(file)
        return {int(key): str(value[-1] if isinstance(value, list) and value else value)
                for key, value in raw.items()}
    except OSError as exc:
        raise ValueError(f"cannot read labels file {path}: {exc.strerror or exc}") from None
    except (ValueError, AttributeError, TypeError) as exc:
        raise ValueError(f"labels file {path} must map class indices to names like TorchServe's "
                         f"index_to_name.json ({type(exc).__name__}: {first_line(exc)})") from None
