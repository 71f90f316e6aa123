"""The request body a client sends for one model sample, in each encoding the codec accepts: what
load tests and benchmarks send and what the profiler's served points answer (packrat/profiling/point.py).

raw   the sample's tensor bytes (little-endian), application/octet-stream (a model of several
      inputs: a KServe v2 JSON body of them)
json  {"inputs": nested lists}, application/json
jpeg  a synthetic photo-like 500x375 JPEG (the server decodes, resizes and crops it), image/jpeg
text  an English paragraph (the server tokenizes it), text/plain; charset=utf-8: as much of it as
      the model's sequence length takes (fitted_text)

`natural_payload(model)` is what a user of that model would send: a photo to an image
model, text to a token model, the raw tensor otherwise; `served_payload(spec)` the same for a
model served with its own codec, where a token model without a tokenizer takes token ids.
`v2_binary_payload(spec)` is one sample as tritonclient sends it: KServe v2 with binary tensors;
`v2_json_payload(spec)` the same in KServe v2 JSON (each input's numbers under "data").
"""
from __future__ import annotations

import functools
import io
import json

import numpy as np

from packrat.codec.forms import sample_request
from packrat.models.zoo import resolve

CONTENT_TYPES = {
    "raw": "application/octet-stream",
    "json": "application/json",
    "jpeg": "image/jpeg",
    "text": "text/plain; charset=utf-8",
}
PAYLOAD_KINDS = tuple(CONTENT_TYPES)

JPEG_WIDTH, JPEG_HEIGHT = 500, 375  # a typical photo's 4:3, larger than any model input: the server resizes
JPEG_QUALITY = 90
JPEG_SEED = 0

# Fixed, 91 words; "café" makes the body non-ASCII so the charset matters.
TEXT = (
    "The harbour town woke slowly on the first cold morning of autumn. Fishing boats rocked against "
    "the stone quay while gulls argued over scraps near the café and the market stalls. A baker opened "
    "her shutters, and the smell of warm bread drifted down the narrow street towards the lighthouse. "
    "Children ran past with their coats unbuttoned, late for school again. Out on the grey water, a "
    "small ferry sounded its horn twice and turned for the islands, carrying letters, vegetables and "
    "three sleepy passengers who had missed the evening boat."
)


def _is_image(spec) -> bool:
    return spec.input_dtype.is_floating_point and len(spec.input_shape) == 3 and spec.input_shape[0] == 3


def _is_tokens(spec) -> bool:
    return not spec.input_dtype.is_floating_point and not spec.input_dtype.is_complex \
        and len(spec.input_shape) == 1


def natural_payload(model: str, input_shape: tuple[int, ...] | None = None) -> str:
    """"jpeg" for a model whose one-sample input is float (3, H, W), "text" for integer token ids
    (bert_base, gpt2), "raw" otherwise."""
    spec = resolve(model, input_shape)
    if _is_image(spec):
        return "jpeg"
    if _is_tokens(spec):
        return "text"
    return "raw"


def served_payload(spec) -> str:
    """The natural payload of a model as it is served with its own codec (CodecConfig.for_model:
    the tokenizer it comes with): "jpeg" for an image model, "text" for a token model that has a
    tokenizer, "raw" otherwise, token models without one included (a zoo model: their instances
    cannot read text, so their clients send token ids). What `packrat profile` times by default."""
    if _is_image(spec):
        return "jpeg"
    if _is_tokens(spec) and getattr(spec, "tokenizer", None):
        return "text"
    return "raw"


def check_payload(model: str, kind: str, input_shape: tuple[int, ...] | None = None) -> None:
    """ValueError when the model cannot take this kind of body (raw and json fit every model)."""
    if kind not in CONTENT_TYPES:
        raise ValueError(f"payload must be one of {', '.join(PAYLOAD_KINDS)}, got {kind!r}")
    check_payload_of(resolve(model, input_shape), kind, model)


def check_payload_of(spec, kind: str, model: str | None = None) -> None:
    """check_payload for a resolved spec (`model`: its name in the message)."""
    if kind not in CONTENT_TYPES:
        raise ValueError(f"payload must be one of {', '.join(PAYLOAD_KINDS)}, got {kind!r}")
    model = model or spec.name
    if kind == "jpeg" and not _is_image(spec):
        raise ValueError(f"a jpeg payload needs an image model (float input of shape 3,H,W); {model} takes "
                         f"{str(spec.input_dtype).replace('torch.', '')} {tuple(spec.input_shape)}")
    if kind == "text" and not _is_tokens(spec):
        raise ValueError(f"a text payload needs a token model (integer ids, e.g. bert_base, gpt2); {model} takes "
                         f"{str(spec.input_dtype).replace('torch.', '')} {tuple(spec.input_shape)}")


@functools.lru_cache(maxsize=None)
def synthetic_jpeg(width: int = JPEG_WIDTH, height: int = JPEG_HEIGHT, quality: int = JPEG_QUALITY,
                   seed: int = JPEG_SEED) -> bytes:
    """A deterministic photo-like JPEG: sky and ground gradients, a sun, a house, a tree,
    smooth texture and sensor-like noise (which keeps it at a realistic 50-200 KB)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = x / width, y / height
    horizon = 0.62
    sky = np.stack([90 + 80 * v, 140 + 70 * v, 230 - 40 * u], axis=-1)
    ground = np.stack([70 + 60 * u, 120 - 50 * (v - horizon), 40 + 20 * u], axis=-1)
    img = np.where((v < horizon + 0.03 * np.sin(9 * u))[..., None], sky, ground)

    def paint(mask: np.ndarray, colour, shade: np.ndarray | float = 1.0) -> None:
        shade = np.broadcast_to(np.asarray(shade, np.float32), mask.shape)[mask][:, None]
        img[mask] = np.asarray(colour, np.float32) * shade

    sun = (x - 0.8 * width) ** 2 + (y - 0.18 * height) ** 2
    paint(sun < (0.07 * width) ** 2, (250, 220, 120))
    house = (np.abs(x - 0.3 * width) < 0.11 * width) & (y > 0.45 * height) & (y < 0.72 * height)
    paint(house, (180, 90, 70), 0.85 + 0.3 * u)
    roof = (y <= 0.45 * height) & (y > 0.3 * height) & (np.abs(x - 0.3 * width) < (y - 0.3 * height) * 0.9)
    paint(roof, (110, 50, 40))
    window = (np.abs(x - 0.27 * width) < 0.025 * width) & (np.abs(y - 0.55 * height) < 0.04 * height)
    paint(window, (240, 230, 160))
    crown = ((x - 0.62 * width) / 0.09 / width) ** 2 + ((y - 0.45 * height) / 0.16 / height) ** 2 < 1
    paint(crown, (40, 110, 50), 0.8 + 0.4 * v)
    trunk = (np.abs(x - 0.62 * width) < 0.012 * width) & (y > 0.58 * height) & (y < 0.7 * height)
    paint(trunk, (90, 60, 30))

    # Smooth texture (coarse noise, bilinearly upsampled), then fine per-pixel noise.
    coarse = np.clip(128 + rng.normal(0, 14, size=(height // 20, width // 20, 3)), 0, 255).astype(np.uint8)
    texture = np.asarray(Image.fromarray(coarse, "RGB").resize((width, height), Image.BILINEAR), np.float32) - 128
    img += texture + rng.normal(0, 12, size=img.shape).astype(np.float32)
    pixels = np.clip(img, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=quality)
    return out.getvalue()


def build_payload(model: str, kind: str | None = None,
                  input_shape: tuple[int, ...] | None = None) -> tuple[bytes, str]:
    """(body, content type) of one request; kind None means the model's natural payload.

    raw and json carry sample 0 of the model's deterministic example input.
    """
    kind = kind or natural_payload(model, input_shape)
    check_payload(model, kind, input_shape)
    return payload_of(resolve(model, input_shape), kind)


def payload_of(spec, kind: str) -> tuple[bytes, str]:
    """(body, content type) of one request of `kind` (checked by the caller) for the model `spec`
    (packrat.models.spec.ModelSpec)."""
    if kind == "jpeg":
        return synthetic_jpeg(), CONTENT_TYPES[kind]
    if kind == "text":
        return fitted_text(spec).encode("utf-8"), CONTENT_TYPES[kind]
    sample = tuple(x[0] for x in spec.example_inputs(1))
    if kind == "json":  # one input: {"inputs": numbers}; several: each by name
        named = {s.name: x.tolist() for s, x in zip(spec.inputs, sample)}
        return json.dumps({"inputs": sample[0].tolist()} if len(sample) == 1 else named).encode(), CONTENT_TYPES[kind]
    # Raw little-endian bytes (whatever machine this client runs on), or for several inputs KServe v2.
    return sample_request(spec.inputs, sample)


def fitted_text(spec) -> str:
    """TEXT, or where the model's tokenizer makes it longer than the model's sequence length (a
    BERT of 64 positions takes 64 of its 103 tokens), its longest prefix of whole words that fits:
    the text a served point or a load test sends must be one the server answers, not a 413."""
    if not getattr(spec, "tokenizer", None) or not _is_tokens(spec):
        return TEXT  # a model that cannot read text refuses it with its own reason
    from packrat.codec.text import TextEncoder

    encoder = TextEncoder(spec.tokenizer, spec.input_shape[0], pad_left=False, truncate=False)
    words = TEXT.split(" ")

    def fits(count: int) -> bool:
        return len(encoder.tokenizer.encode(" ".join(words[:count])).ids) <= encoder.length

    low, high = 1, len(words)  # the most words that fit, by bisection: a tokenizer call is ~0.1 ms
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return " ".join(words[:low])


def v2_binary_payload(spec) -> tuple[bytes, str, int]:
    """(body, content type, header length) of one request for sample 0 of `spec`'s example input as
    tritonclient sends it by default: a KServe v2 JSON header naming each input (its batch dimension
    1 included), then their raw little-endian bytes (packrat.codec.oip), the answer asked in binary.
    The header length goes in Inference-Header-Content-Length."""
    from packrat.codec import oip

    tensors = spec.example_inputs(1)
    head = {"inputs": [{"name": s.name, "shape": list(x.shape), "datatype": oip.datatype(x.dtype)}
                       for s, x in zip(spec.inputs, tensors)], "parameters": {"binary_data_output": True}}
    arrays = [x.contiguous().numpy() for x in tensors]
    chunks = [a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes() for a in arrays]  # whatever this machine's order
    body, length = oip.request(head, chunks)
    return body, CONTENT_TYPES["raw"], length


def v2_json_payload(spec) -> tuple[bytes, str]:
    """(body, content type) of one request for sample 0 of `spec`'s example input as a KServe v2
    JSON client sends it: each input named, with its shape (the batch dimension 1 included), its
    datatype and its numbers flat, in row-major order, under "data"."""
    from packrat.codec import oip

    tensors = spec.example_inputs(1)
    head = {"inputs": [{"name": s.name, "shape": list(x.shape), "datatype": oip.datatype(x.dtype),
                        "data": x.contiguous().flatten().tolist()} for s, x in zip(spec.inputs, tensors)]}
    return json.dumps(head, separators=(",", ":")).encode(), CONTENT_TYPES["json"]
