"""Which form a request body takes, from its content type and its first bytes: an image, text,
JSON (plain, KServe v1 or v2), KServe v2 with binary tensors, torch.save bytes or raw tensor
bytes; each read into samples of the model's inputs (samples.py). And the inverse for one
sample, `sample_request`, which benchmarks and load tests send."""

from __future__ import annotations

import json

import torch

from packrat.codec import kserve, oip
from packrat.codec.config import Decoded
from packrat.codec.samples import SAMPLE_KEYS, Samples, as_text
from packrat.errors import RequestError, first_line
from packrat.models.spec import InputSpec

ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive
SNIFFED_TYPES = ("", "application/octet-stream", "application/x-www-form-urlencoded")  # say nothing


def read_body(samples: Samples, body, kind: str, header_length: int | None, into=None) -> Decoded:
    """A body as TorchServe or a front end hands it over (bytes, or text and JSON already decoded).
    `into`: the request's row of the batch (a tensor per input) where an image is decoded straight
    into, or None."""
    if isinstance(body, str):  # TorchServe decodes text/* bodies
        body, kind = body.encode("utf-8"), kind or "text/plain"
    if isinstance(body, (bytes, bytearray, memoryview)):
        return from_bytes(samples, body, kind, header_length, into)
    if body is None:
        raise RequestError(400, "empty request: send one input sample as the body")
    if isinstance(body, (dict, list)):  # TorchServe decodes JSON bodies
        return from_json(samples, body)
    raise RequestError(400, f"unsupported request body: {type(body).__name__}")


def from_bytes(samples: Samples, buffer: bytes | bytearray | memoryview, kind: str, header_length: int | None,
               into=None) -> Decoded:
    """A body of bytes in any bytes-like `buffer`. A raw tensor body is read where it lies (a
    writable buffer, such as an instance's shared memory, is not copied); every other form from a
    bytes copy of it, since parsers want bytes."""
    if isinstance(buffer, memoryview) and buffer.ndim == 1 and buffer.itemsize == 1:
        body = buffer  # sniffed by slices below; copied to bytes only where parsed
    else:
        body = buffer = memoryview(buffer).cast("B")
    limit = samples.config.max_body_bytes
    if len(body) > limit:
        raise RequestError(413, f"request too large: {len(body)} bytes (limit {limit})")
    if not body and kind.startswith("application/x-www-form-urlencoded"):
        raise RequestError(400, "empty request: a form post (curl -d/--data-binary without a Content-Type) is "
                                "split into fields by TorchServe; send -H 'Content-Type: image/jpeg' (or the "
                                "body's type), or use curl -T FILE")
    if not body:
        raise RequestError(400, "empty request: send one input sample as the body")
    head = bytes(body[:64])
    if header_length is not None:  # the KServe v2 binary extension says where its JSON ends
        oip.checked_header(header_length, len(body))  # before the copy
        return kserve.v2(samples, *oip.split(body, header_length), into=into)
    if head[:4] == ZIP_MAGIC:
        return _plain(samples, samples.first_input(samples.one(samples.saved_tensor(bytes(body)))))
    if _image(samples, head, kind):
        return _plain(samples, samples.first_input(samples.image(body, _first(into))))
    if "json" in kind:
        return _json_bytes(samples, bytes(body))
    json_error = None
    if _json_sniffed(samples, head, kind):
        try:
            return _json_bytes(samples, bytes(body))
        except RequestError as exc:  # or raw bytes / text that merely start like JSON
            json_error = exc
    text = as_text(bytes(body)) if _text_sniffed(samples, kind) else None
    if text is not None:
        return _plain(samples, samples.text_sample(text))
    if json_error is not None and len(body) != samples.raw_size():
        raise json_error
    return _plain(samples, samples.first_input(samples.raw(buffer)))


def raw_head_check(samples: Samples, kind: str):
    """For bodies of content kind `kind` sent without a KServe v2 header length: a test of a body's
    first 64 bytes telling whether from_bytes reads a body of the raw tensor's size as the raw tensor
    without trying any other form first (such a body, once in its row of the batch, is ready as it
    lies: codec.batch); None where the kind rules the raw tensor out whatever the bytes (an image,
    JSON, text)."""
    if kind.startswith("image/") or "json" in kind or _text_sniffed(samples, kind):
        return None
    image, sniffed = samples.input_kind == "image", kind in SNIFFED_TYPES  # text/* was ruled out above

    def check(head: bytes) -> bool:
        return (head[:4] != ZIP_MAGIC and not (image and _is_image(head))
                and not (sniffed and head.lstrip()[:1] in (b"{", b"[")))
    return check


def _image(samples: Samples, head: bytes, kind: str) -> bool:
    return kind.startswith("image/") or (samples.input_kind == "image" and _is_image(head))


def _json_sniffed(samples: Samples, head: bytes, kind: str) -> bool:
    # text/plain text for a text model may well start with "[" or "{"
    sniffed = kind in SNIFFED_TYPES or (kind.startswith("text/") and not samples.takes_tokens)
    return sniffed and head.lstrip()[:1] in (b"{", b"[")


def _text_sniffed(samples: Samples, kind: str) -> bool:
    return samples.takes_tokens or kind.startswith("text/")


def from_json(samples: Samples, body) -> Decoded:
    if isinstance(body, dict):
        if "instances" in body:
            return kserve.v1(samples, body["instances"])
        if kserve.is_v2(body):
            return kserve.v2(samples, body)
        if "inputs" in body:  # legacy: nested numbers of one sample
            return _plain(samples, samples.first_input(samples.one(samples.numbers(body["inputs"]))))
        if any(key in body for key in SAMPLE_KEYS) or samples.holds_named(body):
            return _plain(samples, samples.sample(body))
    names = f", or the model's inputs by name ({', '.join(samples.names)})" if len(samples.inputs) > 1 else ""
    raise RequestError(400, f'JSON body must be an object with "data", "text", "inputs" or "instances"{names}')


def sample_request(inputs: tuple[InputSpec, ...], sample: tuple[torch.Tensor, ...], v2: bool = False
                   ) -> tuple[bytes, str]:
    """(body, content type) of a request for one sample (each input without its batch dimension)
    that the codec reads back exactly: raw little-endian bytes for a single-input model, a KServe
    v2 JSON body with one entry per input otherwise, or always with `v2` (benchmarks and load tests
    send these; a v2 request gets every output back)."""
    if len(inputs) == 1 and not v2:
        array = sample[0].contiguous().numpy()
        return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes(), "application/octet-stream"
    entries = [{"name": spec.name, "shape": list(tensor.shape), "data": tensor.flatten().tolist(),
                "datatype": oip.datatype(tensor.dtype)}
               for spec, tensor in zip(inputs, sample)]
    return json.dumps({"inputs": entries}, separators=(",", ":")).encode(), "application/json"


def _plain(samples: Samples, sample: dict[str, torch.Tensor]) -> Decoded:
    return Decoded(samples.batch_of_one(sample), "plain")


def _json_bytes(samples: Samples, body: bytes) -> Decoded:
    """A JSON body, or a KServe v2 binary one that came without its header length (found by
    parsing: JSON followed by bytes)."""
    try:
        value = _parse_json(body)
    except RequestError:
        binary = oip.split(body, None)
        if binary is None or not kserve.is_v2(binary[0]):
            raise
        return kserve.v2(samples, *binary)
    return from_json(samples, value)


def _first(into):
    return None if into is None else into[0]


def _is_image(body: bytes) -> bool:
    from packrat.codec.images import is_image

    return is_image(body[:32])


def _parse_json(body: bytes):
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except RecursionError:
        raise RequestError(400, "undecodable body: JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise RequestError(400, f"undecodable body: not valid JSON ({type(exc).__name__}: {first_line(exc)})") from None


def _reject_constant(name: str):
    raise RequestError(400, f"JSON holds {name}: only finite numbers are accepted")
