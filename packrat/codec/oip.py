"""The KServe v2 / Open Inference Protocol binary tensor extension, as bytes: nothing of models.

A request (or answer) is a JSON header followed by raw tensor bytes. The header's length in bytes
travels in the HTTP header `Inference-Header-Content-Length`; each tensor with binary data says
`"parameters": {"binary_data_size": N}` and its N bytes follow in tensor order: little-endian,
row-major; a BYTES tensor is its elements, each a 4-byte little-endian length and the bytes.
An answer carries tensors in binary when the request asks (an output's `"binary_data": true`, else
the request's `"binary_data_output": true`; tritonclient asks by default).
Malformed data raises RequestError (400) with a one-line reason, so only that request fails.
"""

from __future__ import annotations

import json
import struct

import numpy
import torch

from packrat.errors import RequestError, first_line

HEADER = "Inference-Header-Content-Length"
# A binary request's JSON header: tritonclient's holds names and shapes (well under a KiB); one that
# carries tensors as JSON "data" is a JSON body's work, which a plain JSON request does within the body limit.
MAX_HEADER_BYTES = 1 << 20
DTYPES = {"FP32": torch.float32, "FP64": torch.float64, "FP16": torch.float16, "BF16": torch.bfloat16,
          "INT64": torch.int64, "INT32": torch.int32, "INT16": torch.int16, "INT8": torch.int8,
          "UINT8": torch.uint8, "BOOL": torch.bool}


NAMES = {dtype: name for name, dtype in DTYPES.items()}


def datatype(dtype: torch.dtype) -> str | None:
    """The v2 datatype name of a torch dtype ("FP32"), or None where v2 has none (say, complex)."""
    return NAMES.get(dtype)


def header_length(value) -> int | None:
    """The HTTP header's value as a length; None when absent. A value that is no length is refused."""
    if value is None:
        return None
    try:
        length = int(str(value).strip())
    except ValueError:
        raise RequestError(400, f"{HEADER} must be a byte count, not {str(value)[:20]!r}") from None
    if length < 0:
        raise RequestError(400, f"{HEADER} must not be negative: {length}")
    return length


def checked_header(value, body_size: int) -> int | None:
    """The header length `value` gives (None: absent), refused before anything is parsed: 400 where
    it is no byte count or runs past the body, 413 over MAX_HEADER_BYTES."""
    length = header_length(value)
    if length is not None and length > body_size:
        raise RequestError(400, f"{HEADER} is {length} but the body has only {body_size} bytes")
    if length is not None and length > MAX_HEADER_BYTES:
        raise RequestError(413, f"inference header of {length} bytes, over the limit of {MAX_HEADER_BYTES}: "
                                f"send large tensors as binary data, or the request as plain JSON")
    return length


def split(body: bytes, length: int | None):
    """(JSON header, the bytes after it). Without a header length, the end of the JSON value is found
    by parsing; returns None then if nothing follows it (a plain JSON body). With one, `body` may be a
    memoryview: only the header is copied, the rest is a view."""
    if length is None:
        try:  # latin-1 maps byte i to character i, so the end index found is a byte offset;
            # JSON's structure is ASCII, and UTF-8 text in strings only holds bytes >= 0x80
            _, length = json.JSONDecoder().raw_decode(body.decode("latin-1"))
        except (ValueError, RecursionError):
            return None
        if not body[length:].strip():
            return None
    else:
        checked_header(length, len(body))
    try:
        head = json.loads(bytes(body[:length]) if isinstance(body, memoryview) else body[:length])
    except (ValueError, RecursionError) as exc:
        raise RequestError(400, f"the inference header is not valid JSON ({first_line(exc)})") from None
    if not isinstance(head, dict):
        raise RequestError(400, "the inference header must be a JSON object")
    return head, body[length:]


TIMEOUT = b'"timeout"'  # Triton's request parameter: the client's deadline, in microseconds
PARAMETERS = b'"parameters"'
JSON_SCAN_BYTES = 64 << 10  # a plain JSON body this small is parsed whole for its timeout (~1 ms at most)


def timeout_s(body, length: int | str | None) -> float | None:
    """The client's deadline in seconds from Triton's request parameter `"parameters": {"timeout":
    MICROSECONDS}`, or None (none given, or none readable cheaply). Read in the front end, ahead of
    the instance that decodes the body, so it costs at most JSON_SCAN_BYTES of work whatever the
    body's size. The JSON read is a binary body's header (its first `length` bytes) or a plain JSON
    body, alike: its top-level "parameters" is parsed where it closes the JSON (tritonclient writes
    it last) within its last JSON_SCAN_BYTES, else the whole JSON only if it is that small: a large
    one with its parameters elsewhere keeps the server's deadline (parsing megabytes of numbers here
    would cost every request behind it in the event loop). A timeout only tightens its own
    request's deadline, so a misread costs that request alone."""
    try:
        length = header_length(length)
    except RequestError:
        return None  # the instance refuses the body with the reason
    end = len(body) if length is None else min(length, len(body))
    tail = bytes(body[max(0, end - JSON_SCAN_BYTES):end])  # where any timeout read lies; the whole JSON if small
    if TIMEOUT not in tail:
        return None
    found = _last_parameters(tail)
    if found is None and end <= JSON_SCAN_BYTES:
        try:
            whole = json.loads(tail)
        except (ValueError, RecursionError):
            return None
        found = whole.get("parameters") if isinstance(whole, dict) else None
    micros = found.get("timeout") if isinstance(found, dict) else None
    if isinstance(micros, bool) or not isinstance(micros, (int, float)) or not micros > 0:
        return None
    return micros / 1e6


def _last_parameters(body: bytes) -> dict | None:
    """The body's last "parameters" object, if it is the top-level one: only the top-level
    object's closing brace follows it."""
    at = body.rfind(PARAMETERS)
    if at < 0 or body[at - 1:at] == b"\\":  # none, or inside a string
        return None
    rest = body[at + len(PARAMETERS):].decode("latin-1").lstrip()  # latin-1: any bytes decode
    if not rest.startswith(":"):
        return None
    rest = rest[1:].lstrip()
    try:
        found, end = json.JSONDecoder().raw_decode(rest)
    except (ValueError, RecursionError):
        return None
    return found if isinstance(found, dict) and rest[end:].strip() == "}" else None


def chunks(entries: list, data: bytes) -> list[bytes | None]:
    """Each input's binary data (None where it has JSON "data" instead); every byte must be one's."""
    found, offset = [], 0
    for entry in entries:
        size = parameters(entry).get("binary_data_size") if isinstance(entry, dict) else None
        if size is None:
            found.append(None)
            continue
        if type(size) is not int or size < 0:
            raise RequestError(400, '"binary_data_size" must be a non-negative integer')
        if offset + size > len(data):
            raise RequestError(400, f"binary data of {entry.get('name')!r} ends at byte {offset + size}, but only "
                                    f"{len(data)} bytes follow the inference header")
        found.append(data[offset:offset + size])
        offset += size
    if offset != len(data):
        raise RequestError(400, f"{len(data) - offset} bytes after the inputs' binary data: "
                                f"binary_data_size does not match the body")
    return found


def tensor(chunk: bytes, datatype: str) -> torch.Tensor:
    """One tensor's raw little-endian bytes, flat: read where they lie when writable (a body the
    server read into a buffer of its own), else copied, since a tensor may not alias bytes."""
    dtype = DTYPES[datatype]
    if len(chunk) % dtype.itemsize:
        raise RequestError(400, f"{len(chunk)} bytes of {datatype} data: not a whole number of "
                                f"{dtype.itemsize}-byte values")
    if not chunk:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(chunk if writable(chunk) else bytearray(chunk), dtype=dtype)


def writable(buffer) -> bool:
    """Whether a tensor may read `buffer` where it lies: a bytearray, or a writable view of one."""
    return isinstance(buffer, bytearray) or (isinstance(buffer, memoryview) and not buffer.readonly)


def copy_into(tensor: torch.Tensor, chunk) -> None:
    """`chunk`'s raw little-endian bytes into a contiguous `tensor` of as many bytes (numpy's copy:
    the GIL let go for a large one)."""
    numpy.copyto(tensor.view(torch.uint8).view(-1).numpy(), numpy.frombuffer(chunk, numpy.uint8))


def elements(chunk: bytes) -> list[bytes]:
    """A BYTES tensor's elements: each a 4-byte little-endian length, then that many bytes."""
    found, offset = [], 0
    while offset < len(chunk):
        if offset + 4 > len(chunk):
            raise RequestError(400, "BYTES data ends inside an element's 4-byte length")
        (size,) = struct.unpack_from("<I", chunk, offset)
        offset += 4
        if offset + size > len(chunk):
            raise RequestError(400, f"a BYTES element of {size} bytes runs past its binary_data_size")
        found.append(bytes(chunk[offset:offset + size]))
        offset += size
    return found


def binary_output(head: dict, name: str) -> bool:
    """Whether the request asks for output `name` in binary; refuses outputs the model lacks."""
    outputs = head.get("outputs") or []
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise RequestError(400, '"outputs" must be a list of objects {"name", "parameters"}')
    unknown = [o.get("name") for o in outputs if o.get("name") != name]
    if unknown:
        raise RequestError(400, f"unknown output {str(unknown[0])[:40]!r}: this model answers {name!r}")
    for output in outputs:
        asked = parameters(output).get("binary_data")
        if asked is not None:
            return asked is True
    return parameters(head).get("binary_data_output") is True


def parameters(entry: dict) -> dict:
    """An object's "parameters" (absent: none)."""
    found = entry.get("parameters")
    if found is None:
        return {}
    if not isinstance(found, dict):
        raise RequestError(400, '"parameters" must be an object')
    return found


def request(head: dict, chunks: list) -> tuple[bytes, int]:
    """(body, header length) of a request in the binary extension, for a front end that receives
    tensors already parsed (gRPC): `head`'s inputs, each one given a chunk (bytes-like; None keeps its
    JSON "data") marked with its binary_data_size, then those chunks in order. split() and chunks()
    read it back."""
    inputs = [entry if chunk is None else {**entry, "parameters": {**parameters(entry), "binary_data_size": len(chunk)}}
              for entry, chunk in zip(head["inputs"], chunks)]
    header = json.dumps({**head, "inputs": inputs}, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return b"".join([header, *(chunk for chunk in chunks if chunk is not None)]), len(header)


def bytes_chunk(items: list) -> bytes:
    """A BYTES tensor's elements (bytes, or text as UTF-8) in the binary layout elements() reads."""
    raw = [item.encode("utf-8") if isinstance(item, str) else bytes(item) for item in items]
    return b"".join(struct.pack("<I", len(item)) + item for item in raw)


def encode(head: dict, tensors: list[torch.Tensor]) -> tuple[bytes, int]:
    """(body, header length): `head`'s outputs (one per tensor, without "data") marked with their
    binary_data_size, then each tensor's raw bytes."""
    data = [raw(t.detach().cpu()) for t in tensors]
    found = header(head, [len(chunk) for chunk in data])
    return found + b"".join(data), len(found)


def header(head: dict, sizes: list[int]) -> bytes:
    """`head`'s JSON with each output (one per size, without "data") marked with its binary_data_size."""
    outputs = [{**output, "parameters": {**output.get("parameters", {}), "binary_data_size": size}}
               for output, size in zip(head["outputs"], sizes)]
    return json.dumps({**head, "outputs": outputs}, separators=(",", ":"), allow_nan=False).encode("utf-8")


def raw(tensor: torch.Tensor) -> bytes:
    """A CPU tensor's raw bytes, row-major."""
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tensor.view(-1).view(torch.uint8).numpy().tobytes()
