"""Request bodies to input tensors, and model outputs to response bodies.

One request carries one sample of the model's input shape, as
- JSON ``{"inputs": nested lists}`` (``application/json``; TorchServe hands it over decoded),
- raw bytes of the sample in the model's dtype (``application/octet-stream``, little endian),
- or ``torch.save`` bytes of a tensor (read with ``weights_only=True``: never unpickles code).
A request that is none of these gets a ``RequestError`` with an HTTP status and a
one-line reason, so the rest of its batch can still be answered.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass

import torch

TOP_K = 5
ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive
JSON_TEXT_FACTOR = 32  # JSON numbers take far more bytes than raw ones; beyond this it is abuse


class RequestError(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]  # one sample
    dtype: torch.dtype

    @property
    def raw_bytes(self) -> int:
        return torch.Size(self.shape).numel() * self.dtype.itemsize

    @property
    def max_bytes(self) -> int:
        return self.raw_bytes * JSON_TEXT_FACTOR + 1024

    def describe(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')} of shape {'x'.join(map(str, self.shape))}"


def request_body(row: dict):
    """TorchServe puts the body under "data" or "body"."""
    body = row.get("data")
    return row.get("body") if body is None else body


def decode(body, spec: InputSpec, content_type: str | None = None) -> torch.Tensor:
    """One sample as a tensor of spec's shape and dtype, or RequestError."""
    if body is None:
        raise RequestError(400, "empty request: send one input sample as the body")
    if isinstance(body, (bytes, bytearray)):
        if len(body) > spec.max_bytes:
            raise RequestError(413, f"request too large: {len(body)} bytes (at most {spec.max_bytes})")
        if body[:4] == ZIP_MAGIC:
            return _check(_load_tensor(bytes(body)), spec)
        if _is_json(body, content_type):
            body = _parse_json(body)
        else:
            return _from_raw(body, spec)
    if isinstance(body, str):
        body = _parse_json(body.encode())
    return _from_json(body, spec)


def _is_json(body: bytes | bytearray, content_type: str | None) -> bool:
    if content_type:
        return "json" in content_type.lower()
    return body.lstrip()[:1] in (b"{", b"[")


def _parse_json(body: bytes | bytearray):
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(400, f"undecodable body: not valid JSON ({exc.__class__.__name__}: {exc})") from None


def _load_tensor(body: bytes) -> torch.Tensor:
    try:
        value = torch.load(io.BytesIO(body), weights_only=True, map_location="cpu")
    except (RuntimeError, zipfile.BadZipFile, EOFError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RequestError(400, f"undecodable body: not a torch.save tensor ({first})") from None
    except Exception as exc:  # weights_only refuses arbitrary pickles with UnpicklingError
        raise RequestError(400, f"undecodable body: refused by weights_only loading ({type(exc).__name__})") from None
    if not isinstance(value, torch.Tensor):
        raise RequestError(400, f"torch.save body must hold a tensor, got {type(value).__name__}")
    return value


def _from_raw(body: bytes | bytearray, spec: InputSpec) -> torch.Tensor:
    if len(body) != spec.raw_bytes:
        raise RequestError(400, f"wrong size: {len(body)} bytes, expected {spec.raw_bytes} ({spec.describe()})")
    return torch.frombuffer(bytearray(body), dtype=spec.dtype).view(spec.shape)


def _from_json(body, spec: InputSpec) -> torch.Tensor:
    if not isinstance(body, dict) or "inputs" not in body:
        raise RequestError(400, 'JSON body must be an object {"inputs": [...]}')
    try:
        value = torch.tensor(body["inputs"])
    except (TypeError, ValueError, RuntimeError) as exc:
        raise RequestError(400, f"inputs must be a nested list of numbers ({str(exc).splitlines()[0]})") from None
    if value.dtype.is_floating_point and not spec.dtype.is_floating_point:
        raise RequestError(400, f"wrong dtype: got floating-point numbers, expected integers ({spec.describe()})")
    return _check(value.to(spec.dtype), spec)


def _check(value: torch.Tensor, spec: InputSpec) -> torch.Tensor:
    if value.dtype != spec.dtype:
        raise RequestError(400, f"wrong dtype: got {str(value.dtype).removeprefix('torch.')}, expected {spec.describe()}")
    if tuple(value.shape) == (1, *spec.shape):
        value = value[0]  # a batch of one is one sample
    if tuple(value.shape) != spec.shape:
        shape = "x".join(map(str, value.shape)) or "scalar"
        raise RequestError(400, f"wrong shape: got {shape}, expected {spec.describe()}")
    return value


def encode(output: torch.Tensor, task: str) -> dict:
    """One sample's model output as a JSON-able response body."""
    if task == "classification":
        scores, classes = torch.softmax(output.float(), dim=-1).topk(min(TOP_K, output.shape[-1]))
        return {"predictions": [{"class": int(c), "score": float(s)} for c, s in zip(classes, scores)]}
    if task == "language-model":
        logits, tokens = output.float().topk(min(TOP_K, output.shape[-1]))
        return {"next_tokens": [{"token": int(t), "logit": float(v)} for t, v in zip(tokens, logits)]}
    return {"embedding": output.float().flatten().tolist()}
