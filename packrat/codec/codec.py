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
  tensor extension (packrat.codec.oip: a JSON header, then raw tensors; BYTES elements are then raw image
  bytes or UTF-8 text), answered with binary outputs when the request asks for them;
- a JSON object of named inputs (one sample each);
- raw little-endian bytes of one sample, or torch.save bytes of it (read with weights_only).
A model may take several named inputs (packrat.models.spec); the single-sample forms above give its
first input (the image, or the token ids), and an input a request leaves out is filled as its
spec says (an attention mask of ones: no padding; token types of zeros), or refused.
Anything else gets a RequestError with an HTTP status and a one-line reason, so the rest of
its batch can still be answered; decode raises nothing else.

The jobs live in their own modules: forms.py (which form a body takes), kserve.py (KServe v1 and
v2), samples.py (values to the model's input samples, and their checks), answers.py (outputs to
answers); this class ties them to one model's configuration.
"""

from __future__ import annotations

import contextlib

import torch

from packrat.codec import forms, oip
from packrat.codec.answers import Answers
from packrat.codec.config import TASKS, CodecConfig, Decoded, Encoded
from packrat.codec.known_heads import KnownHeads
from packrat.codec.samples import Samples
from packrat.errors import RequestError, first_line

RAW_CHECKS = 64  # content types whose raw-body check is kept (ready_in_row)
_UNSEEN = object()


class Codec:
    """One model's codec: decode() a request into its input samples, encode() the outputs into its answer."""

    def __init__(self, config: CodecConfig):
        if config.task not in TASKS:
            raise ValueError(f"unknown task {config.task!r}: use one of {', '.join(TASKS)}")
        self.config = config
        self.samples = Samples(config)
        self.answers = Answers(config, self.samples.text)
        # a raw tensor body's size where one lies in its row as it is read (-1: none does), and
        # ready_in_row's check of each content type seen
        self._raw_row_bytes = self.samples.raw_size() if self.samples.raw_is_row else -1
        self._raw_checks: dict = {}
        self._known_heads = KnownHeads(self.samples)  # binary v2 headers seen, decoded once

    @property
    def input_kind(self) -> str:
        """"image", "text" (a token model with a tokenizer) or "tensor"."""
        return self.samples.input_kind

    @property
    def shape(self) -> tuple[int, ...]:
        return self.samples.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.samples.dtype

    def describe(self) -> str:
        return self.samples.describe()

    def decode(self, body, content_type: str | None, header_length: int | str | None = None, into=None) -> Decoded:
        """The request's samples and how to answer it; RequestError and nothing else.
        `header_length`: the KServe v2 binary extension's Inference-Header-Content-Length (as sent).
        `into`: the request's row of the batch (rows.InputRows.row), where an image is decoded
        straight into; the samples may then be views of it."""
        try:
            length = oip.header_length(header_length)
            decoded = self._known_heads.decode(body, length, into)
            if decoded is None:
                decoded = forms.read_body(self.samples, body, _kind(content_type), length, into)
                self._known_heads.learn(body, length, decoded)
            return decoded
        except RequestError:
            raise
        except Exception as exc:  # a bug or a body nobody foresaw: still only this request's failure
            raise RequestError(400, f"cannot decode request: {type(exc).__name__}: {first_line(exc)}") from None

    def ready_in_row(self, body, content_type: str | None, header_length: int | str | None = None) -> bool:
        """Whether a body already written into its row of the batch (raw tensor bytes of one
        sample's size) is, as it lies, what decode() would make of it: no other form, no check."""
        if (header_length is not None or len(body) != self._raw_row_bytes
                or len(body) > self.config.max_body_bytes):
            return False
        check = self._raw_checks.get(content_type, _UNSEEN)
        if check is _UNSEEN:  # one check per content type: a batch's bodies mostly share one
            if len(self._raw_checks) >= RAW_CHECKS:  # a client's stream of odd types holds no memory
                self._raw_checks.clear()
            check = self._raw_checks[content_type] = forms.raw_head_check(self.samples, _kind(content_type))
        return check is not None and check(bytes(body[:64]))

    def tokenized(self, requests: list[tuple]):
        """A block within which decode() finds the text of these requests (body, content type, ...)
        tokenised already, in one call of the tokenizer for all of them: the text/* bodies of a
        text model's batch. Any other body, and any other model, is decoded as before."""
        text = self.samples.text
        if text is None:
            return contextlib.nullcontext()
        return text.prepared(list(dict.fromkeys(t for t in map(_plain_text, requests) if t is not None)))

    def encode(self, outputs: torch.Tensor, decoded: Decoded) -> bytes:
        """The body answering the request that `decoded` came from (see encoded())."""
        return self.encoded(outputs, decoded).body

    def encoded(self, outputs: torch.Tensor, decoded: Decoded) -> Encoded:
        """The answer with its content type (and a binary v2 answer's header length): Answers.encoded."""
        return self.answers.encoded(outputs, decoded)


def _kind(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def _plain_text(request: tuple) -> str | None:
    """The text of a text/* body (or of one TorchServe decoded already), else None."""
    body, content_type = request[0], (request[1] or "").lower()
    if isinstance(body, str):
        return body
    if not content_type.startswith("text/") or not isinstance(body, (bytes, bytearray, memoryview)):
        return None
    try:
        return str(body, "utf-8")
    except UnicodeDecodeError:
        return None
