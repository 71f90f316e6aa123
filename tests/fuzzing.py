"""The fuzzing campaign's requests (issue 71): Hypothesis strategies that build a request for the
`tiny` model (3x32x32 float32 in, 10 logits out) in every form the codec reads, then mutate it at
every level a client can get wrong: the JSON's fields (wrong types, shapes, datatypes, sizes, names,
nesting), the binary extension (sizes and header lengths that lie), the bytes (cut, flipped,
inserted, grown past the body limit), the headers (content types, encodings) and the transport
(chunked, cut short, more bytes than Content-Length).

A good request's numbers stay moderate and a mutation changes only a few of them, so the model
never meets inputs that overflow its outputs: the one legitimate 5xx (the not-finite 500 for a
finite input the model turns into infinity) cannot happen here, and any 5xx is a bug.

Used by test_fuzz_codec.py (the codec, pure, quick tier) and test_fuzz_servers.py (each front end).
"""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from hypothesis import strategies as st

from packrat.codec import oip

MODEL = "tiny"
SHAPE = (3, 32, 32)
VALUES = 3 * 32 * 32
MAX_BODY = 100_000  # the archives' body limit: a good JSON sample is ~30-60 KB, a binary one 12 KB
REQUESTS_ENV = "TESTS_FUZZ_REQUESTS"  # generated requests per front end in test_fuzz_servers.py
SUITE_REQUESTS = 1000


def requests_per_front_end() -> int:
    """How many fuzz requests each front end gets: TESTS_FUZZ_REQUESTS, else the suite's 1,000."""
    return int(os.environ.get(REQUESTS_ENV) or SUITE_REQUESTS)


def sample(seed: int) -> np.ndarray:
    """A good sample: moderate numbers (the model's outputs stay finite), quarters, which JSON writes
    in a few characters (a sample in JSON is ~15 KB)."""
    return (np.random.default_rng(seed).integers(-8, 9, SHAPE) / 4).astype(np.float32)


@dataclass(frozen=True)
class Wire:
    """One request as it goes on the wire. `transport`: "whole", "chunked", "cut" (Content-Length
    says more than is sent, then the client stops sending) or "over" (more bytes than it says)."""
    body: bytes
    content_type: str | None = None
    header_length: str | None = None  # Inference-Header-Content-Length
    path: str = f"/v2/models/{MODEL}/infer"
    headers: tuple[tuple[str, str], ...] = ()
    transport: str = "whole"
    form: str = ""  # what it was built as, for the report

    def describe(self, limit: int = 300) -> str:
        head = self.body[:limit]
        return (f"{self.form} {self.transport} {self.path} type={self.content_type!r} "
                f"length={self.header_length!r} headers={list(self.headers)} {len(self.body)} bytes: {head!r}")


# ---- fixed bodies ---------------------------------------------------------------------------------

def image_bytes(kind: str, size: tuple[int, int] = (40, 30)) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(3).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format=kind)
    return out.getvalue()


def png_bomb(width: int = 60_000, height: int = 60_000) -> bytes:
    """A PNG whose header claims width x height pixels, with almost no data: refused from its header."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def zip_bomb() -> bytes:
    """A zip (torch.save's container) of 32 MB of zeros packed into ~32 KB."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as packed:
        packed.writestr("archive/data.pkl", b"\0" * (32 << 20))
    return buffer.getvalue()


_FIXED: dict[str, bytes] = {}


def fixed(name: str) -> bytes:
    """Bodies costly to build, built once."""
    if name not in _FIXED:
        _FIXED[name] = {"jpeg": lambda: image_bytes("JPEG"), "png": lambda: image_bytes("PNG"),
                        "gif": lambda: image_bytes("GIF"), "bmp": lambda: image_bytes("BMP"),
                        "webp": lambda: image_bytes("WEBP"), "bomb": png_bomb, "zip_bomb": zip_bomb,
                        "saved": lambda: saved(torch.from_numpy(sample(0))),
                        "saved_f64": lambda: saved(torch.from_numpy(sample(0)).double()),
                        "saved_dict": lambda: saved({"x": torch.zeros(3)}),
                        "saved_batch": lambda: saved(torch.from_numpy(sample(0))[None].repeat(2, 1, 1, 1))}[name]()
    return _FIXED[name]


# ---- JSON values: good ones, and wild ones in their place ----------------------------------------

SAFE_NUMBERS = st.sampled_from([0, 1, -1, 0.5, -0.25, 3, 1e3, 255])
WILD_SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(-1e3, 1e3)
                | st.sampled_from([1e300, -1e300, 1e-320, 2**63, 2**64, -2**63 - 1, "", "NaN", "1.5", "input",
                                   "FP32", "BYTES", base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()])
                | st.text(max_size=12))
WILD = st.recursive(WILD_SCALARS, lambda inner: st.lists(inner, max_size=5)
                    | st.dictionaries(st.sampled_from(["name", "shape", "datatype", "data", "parameters", "inputs",
                                                       "instances", "b64", "text", "id", "binary_data_size"])
                                      | st.text(max_size=6), inner, max_size=4), max_leaves=12)
DATATYPES = st.sampled_from(["FP32", "FP32", "FP64", "FP16", "BF16", "INT64", "INT32", "INT16", "INT8", "UINT8",
                             "UINT16", "UINT32", "UINT64", "BOOL", "BYTES", "FP8", "fp32", "", "STRING"]) | st.text(max_size=6)
NAMES = st.text(max_size=8) | WILD
TEXTS = st.text(max_size=20)
OUTPUTS = st.lists(st.fixed_dictionaries({"name": st.sampled_from(["output0", "logits"]) | WILD}), max_size=3) | WILD
SIZE_CHANGES = st.integers(-16, 8) | WILD
SHAPES = (st.sampled_from([[1, 3, 32, 32], [3, 32, 32], [2, 3, 32, 32], [0, 3, 32, 32], [-1, 3, 32, 32], [1, 3, 32],
                           [], [1, 3, 32, 33], [VALUES], [1, VALUES], [65, 3, 32, 32], [2**62, 2**62], [2**64],
                           [1, 3, 32, "32"], [1.0, 3, 32, 32], [True, 3, 32, 32]])
          | st.lists(st.integers(-3, 70), max_size=5) | WILD)


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@st.composite
def data_values(draw, good: list[float]):
    """A v2 input's "data": the good flat list, or one changed a little or a lot."""
    how = draw(st.sampled_from(["good", "good", "good", "one", "cut", "nested", "fill", "wild", "b64", "strings"]))
    if how == "good":
        return good
    if how == "one":  # one value replaced by anything
        changed = list(good)
        changed[draw(st.integers(0, len(good) - 1))] = draw(WILD_SCALARS)
        return changed
    if how == "cut":
        return good[:draw(st.integers(0, len(good) + 1))]
    if how == "nested":
        return np.asarray(good, np.float32).reshape(SHAPE).tolist()
    if how == "fill":
        return [draw(SAFE_NUMBERS)] * draw(st.sampled_from([0, 1, VALUES - 1, VALUES, VALUES + 1, 2 * VALUES]))
    if how == "b64":
        return base64.b64encode(np.asarray(good, np.float32).tobytes()).decode()
    if how == "strings":
        return [str(v) for v in good]
    return draw(WILD)


def maybe(draw, good, wild, chance: int = 5):
    """`good`, or one time in `chance` a draw from `wild`."""
    return draw(wild) if draw(st.integers(0, chance - 1)) == 0 else good


@st.composite
def v2_entry(draw, x: np.ndarray) -> dict:
    entry = {"name": maybe(draw, "input", NAMES),
             "shape": maybe(draw, [1, *SHAPE], SHAPES, 4),
             "datatype": maybe(draw, "FP32", DATATYPES, 4),
             "data": draw(data_values(x.flatten().tolist()))}
    if draw(st.integers(0, 5)) == 0:
        entry["parameters"] = draw(WILD)
    if draw(st.integers(0, 7)) == 0:
        del entry[draw(st.sampled_from(sorted(entry)))]
    return entry


@st.composite
def v2_extras(draw) -> dict:
    """A v2 request's other fields: id, outputs, parameters; good or wild."""
    extras = {}
    if draw(st.booleans()):
        extras["id"] = maybe(draw, draw(st.text(max_size=10)), WILD)
    if draw(st.booleans()):
        extras["outputs"] = maybe(draw, [{"name": "output0", "parameters": {"binary_data": draw(st.booleans())}}],
                                  OUTPUTS)
    if draw(st.booleans()):
        extras["parameters"] = maybe(draw, {"binary_data_output": draw(st.booleans())}, WILD)
    return extras


def dumps(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


# ---- each form: a good request, its fields mutated --------------------------------------------------

@st.composite
def v2_json(draw, x: np.ndarray) -> Wire:
    inputs = [draw(v2_entry(x)) for _ in range(draw(st.sampled_from([1, 1, 1, 0, 2])))]
    body = {"inputs": maybe(draw, inputs, WILD, 12), **draw(v2_extras())}
    return Wire(dumps(body), "application/json", form="v2-json")


CHUNK_DTYPES = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "INT64": np.int64, "INT32": np.int32,
                "INT16": np.int16, "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_}


@st.composite
def v2_binary(draw, x: np.ndarray) -> Wire:
    """tritonclient's form: a JSON header, then raw bytes; sizes and the header length may lie."""
    datatype = maybe(draw, "FP32", DATATYPES, 4)
    dtype = CHUNK_DTYPES.get(datatype if isinstance(datatype, str) else "", np.float32)
    values = x if dtype != np.bool_ else x > 0
    chunk = values.astype(np.dtype(dtype).newbyteorder("<")).tobytes() if dtype not in (np.int8, np.uint8) \
        else np.clip(x * 50, 0, 100).astype(dtype).tobytes()
    if datatype == "BYTES":
        chunk = oip.bytes_chunk([fixed(draw(st.sampled_from(["jpeg", "png"])))] * draw(st.integers(0, 2)))
        if draw(st.booleans()):
            chunk = struct.pack("<I", draw(st.integers(0, 2**32 - 1))) + chunk[4:]  # an element length that lies
    size = maybe(draw, len(chunk), SIZE_CHANGES, 4)
    size = len(chunk) + size if type(size) is int and draw(st.booleans()) else size  # near the truth, or anything
    entry = {"name": maybe(draw, "input", NAMES), "shape": maybe(draw, [1, *SHAPE], SHAPES, 5),
             "datatype": datatype, "parameters": maybe(draw, {"binary_data_size": size}, WILD, 10)}
    head = {"inputs": [entry], **draw(v2_extras())}
    header = dumps(head)
    length = str(len(header)) if draw(st.integers(0, 2)) else lying_length(draw, len(header))
    return Wire(header + chunk, "application/octet-stream", length, form="v2-binary")


LYING_LENGTHS = (st.integers(-2**40, 2**70).map(str)
                 | st.sampled_from(["", " ", "abc", "12a", "0x10", "1e3", "+12", "1_0", "\u00b2", "-0", "9" * 5000])
                 | st.text(max_size=6).filter(str.isprintable))


def lying_length(draw, true_length: int) -> str:
    """An Inference-Header-Content-Length that lies: near the truth, or anything."""
    if draw(st.booleans()):
        return str(true_length + draw(st.integers(-5, 5)))
    return draw(LYING_LENGTHS)


@st.composite
def v1(draw, x: np.ndarray) -> Wire:
    instance = draw(st.sampled_from(["nested", "b64", "data", "named", "wild"]))
    one = {"nested": lambda: x.tolist(), "b64": lambda: base64.b64encode(fixed("jpeg")).decode(),
           "data": lambda: {"data": base64.b64encode(fixed("png")).decode()},
           "named": lambda: {"input": x.tolist()}, "wild": lambda: draw(WILD)}[instance]()
    count = draw(st.sampled_from([1, 1, 1, 0, 2, 65]))
    instances = maybe(draw, [one] * count, WILD, 10)
    return Wire(dumps({"instances": instances}), "application/json", path=f"/v1/models/{MODEL}:predict", form="v1")


@st.composite
def plain_json(draw, x: np.ndarray) -> Wire:
    """The other JSON forms: legacy {"inputs": nested}, {"data"/"b64": base64 image}, named inputs,
    text, deep nesting, or a wild value."""
    kind = draw(st.sampled_from(["legacy", "data", "b64", "named", "text", "deep", "wild"]))
    if kind == "deep":
        return Wire(deep(draw(st.sampled_from([50, 2000, 100_000]))).encode(), "application/json", form="json-deep")
    body = {"legacy": lambda: {"inputs": draw(data_values(x.flatten().tolist())) if draw(st.booleans()) else x.tolist()},
            "data": lambda: {"data": base64.b64encode(fixed(draw(st.sampled_from(["jpeg", "png", "bomb"])))).decode()},
            "b64": lambda: {"b64": maybe(draw, base64.b64encode(fixed("gif")).decode(), TEXTS)},
            "named": lambda: {"input": x.tolist(), draw(st.text(max_size=5)): draw(WILD)},
            "text": lambda: {"text": draw(st.text(max_size=30))},
            "wild": lambda: draw(WILD)}[kind]()
    return Wire(dumps(body), "application/json", path=f"/predictions/{MODEL}", form=f"json-{kind}")


@st.composite
def raw_bytes(draw, x: np.ndarray) -> Wire:
    """Raw tensor bytes, torch.save bytes, images (whole, cut, bombs), text, or noise."""
    kind = draw(st.sampled_from(["raw", "raw", "saved", "saved_f64", "saved_dict", "saved_batch", "zip_bomb", "jpeg",
                                 "png", "gif", "bmp", "webp", "bomb", "text", "noise"]))
    content_type = "application/octet-stream"
    if kind == "raw":
        body = x.astype("<f4").tobytes()
    elif kind == "text":
        body, content_type = draw(st.text(max_size=40)).encode("utf-8", "surrogatepass"), "text/plain"
    elif kind == "noise":
        body = draw(st.binary(max_size=300))
    else:
        body = fixed(kind)
        content_type = f"image/{kind}" if kind in ("jpeg", "png", "gif", "bmp", "webp") else content_type
    return Wire(body, content_type, path=f"/predictions/{MODEL}", form=kind)


def forms(x: np.ndarray):
    return st.one_of(v2_json(x), v2_binary(x), v1(x), plain_json(x), raw_bytes(x))


# ---- mutations of the whole request -----------------------------------------------------------------

@st.composite
def mutated_bytes(draw, body: bytes) -> bytes:
    """A few byte-level edits: cut, flip, insert, delete, duplicate; or grown past the body limit."""
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(body)))
        edit = draw(st.sampled_from(["cut", "flip", "insert", "delete", "duplicate", "grow"]))
        if edit == "cut":
            body = body[:at]
        elif edit == "flip" and at < len(body):
            body = body[:at] + bytes([body[at] ^ draw(st.integers(1, 255))]) + body[at + 1:]
        elif edit == "insert":
            body = body[:at] + draw(st.binary(min_size=1, max_size=8)) + body[at:]
        elif edit == "delete":
            body = body[:at] + body[at + draw(st.integers(1, 64)):]
        elif edit == "duplicate":
            body = body[:at] + body[at:at + 64] + body[at:]
        elif edit == "grow":
            body = body + b" " * draw(st.sampled_from([1, MAX_BODY - len(body), MAX_BODY - len(body) + 1, 3 * MAX_BODY]))
    return body


def _recoded(encoding: str):
    """The body's text (as UTF-8, where it is) written in another encoding."""
    return lambda body: body.decode("utf-8", "replace").encode(encoding, "surrogatepass")


ENCODINGS = st.sampled_from([lambda body: b"\xef\xbb\xbf" + body, _recoded("utf-16"), _recoded("utf-16-be"),
                             _recoded("utf-32"), lambda body: zlib.compress(body)])  # a BOM, UTF-16/32, deflated
CONTENT_TYPES = st.sampled_from([None, "", "application/json", "application/json; charset=utf-16",
                                 "application/octet-stream", "text/plain", "text/plain; charset=latin-1",
                                 "image/jpeg", "image/png", "image/", "application/x-www-form-urlencoded",
                                 "application/x-ndjson", "*/*", "APPLICATION/JSON", "json"]) \
    | st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20)
EXTRA_HEADERS = st.lists(st.sampled_from([("Content-Encoding", "gzip"), ("Content-Encoding", "br"),
                                          ("Accept", "application/x-garbage"), ("Expect", "100-continue"),
                                          ("Accept-Encoding", "gzip"), ("X-Packrat-Fuzz", "\u00e9t\u00e9"),
                                          (oip.HEADER, "7"), ("Connection", "close")]), max_size=2, unique=True)
PATHS = st.sampled_from([f"/v2/models/{MODEL}/infer", f"/v2/models/{MODEL}/versions/1/infer",
                         f"/v1/models/{MODEL}:predict", f"/predictions/{MODEL}", f"/predictions/{MODEL}/",
                         "/v2/models/absent/infer", "/predictions/absent", f"/v2/models/{MODEL}/infer?x=%ff"])


@st.composite
def requests(draw, paths=PATHS, transports=("whole", "chunked", "cut", "over")) -> Wire:
    """A request for the tiny model, built in one of its forms and then mutated (most of the time)."""
    x = sample(draw(st.integers(0, 7)))
    wire = draw(forms(x))
    if draw(st.integers(0, 2)) == 0:
        wire = replace(wire, body=draw(mutated_bytes(wire.body)))
    if draw(st.integers(0, 9)) == 0:
        wire = replace(wire, body=draw(ENCODINGS)(wire.body))
    if draw(st.integers(0, 3)) == 0:
        wire = replace(wire, content_type=draw(CONTENT_TYPES))
    if wire.header_length is None and draw(st.integers(0, 9)) == 0:
        wire = replace(wire, header_length=lying_length(draw, len(wire.body) // 2))
    if draw(st.integers(0, 3)) == 0:
        wire = replace(wire, path=draw(paths))
    transport = draw(st.sampled_from(transports)) if draw(st.integers(0, 5)) == 0 else "whole"
    return replace(wire, headers=tuple(draw(EXTRA_HEADERS)), transport=transport)


def good_requests(index: int) -> Wire:
    """The good request sent between fuzz requests: each form in turn, a new sample each time."""
    x = sample(1000 + index)
    kind = index % 4
    if kind == 0:
        return Wire(x.astype("<f4").tobytes(), "application/octet-stream", path=f"/predictions/{MODEL}", form="good-raw")
    if kind == 1:
        head = dumps({"inputs": [{"name": "input", "shape": [1, *SHAPE], "datatype": "FP32",
                                  "parameters": {"binary_data_size": VALUES * 4}}],
                      "parameters": {"binary_data_output": True}})
        return Wire(head + x.astype("<f4").tobytes(), "application/octet-stream", str(len(head)), form="good-binary")
    if kind == 2:
        body = dumps({"inputs": [{"name": "input", "shape": [1, *SHAPE], "datatype": "FP32",
                                  "data": x.flatten().tolist()}]})
        return Wire(body, "application/json", form="good-v2-json")
    return Wire(dumps({"instances": [x.tolist()]}), "application/json", path=f"/v1/models/{MODEL}:predict",
                form="good-v1")


# ---- what every answer must be --------------------------------------------------------------------

def verdict(status: int | None, body: bytes, wire: Wire | None = None) -> str | None:
    """None for an answer that is fine: a 200, or a 4xx with a one-line reason; else what is wrong.
    `status` None: no answer at all (the connection dropped)."""
    if status is None:
        return "no answer: the connection dropped"
    if status == 200:
        return None
    if not 400 <= status < 500:
        return f"status {status}"
    reason = error_reason(body)
    if reason is None:
        return f"status {status} without a reason: {body[:200]!r}"
    if len(reason.strip().splitlines()) != 1:
        return f"status {status} with a reason not on one line: {reason[:300]!r}"
    return None


def error_reason(body: bytes) -> str | None:
    """The reason of an error body: packrat's {"error"}, Ray's {"message"}, FastAPI's {"detail"},
    TorchServe's {"message"}; None when the body carries none."""
    try:
        value = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        return text or None  # a server's own plain-text refusal (uvicorn's "Invalid HTTP request received.")
    if not isinstance(value, dict):
        return None
    for key in ("error", "message", "detail"):
        if key in value:
            found = value[key]
            return found if isinstance(found, str) else json.dumps(found)
    return None


@dataclass
class Tally:
    """What a campaign saw: answers by status, and every bad one (with the request that got it)."""
    statuses: dict[int | None, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    sent: int = 0
    good: int = 0

    def record(self, status: int | None, problem: str | None, what: str) -> None:
        self.sent += 1
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if problem is not None:
            self.failures.append(f"{problem} <- {what}")

    def summary(self) -> str:
        counts = ", ".join(f"{status}: {count}" for status, count in sorted(self.statuses.items(), key=str))
        return f"{self.sent} requests ({self.good} good ones among them): {counts}; {len(self.failures)} failures"
