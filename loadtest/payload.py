"""The request body for one model sample, in either encoding the handler accepts."""
from __future__ import annotations

import json


from packrat.models import resolve

CONTENT_TYPES = {"raw": "application/octet-stream", "json": "application/json"}


def build_payload(model: str, kind: str = "raw") -> tuple[bytes, str]:
    """(body, content type) for sample 0 of the model's deterministic example input."""
    if kind not in CONTENT_TYPES:
        raise ValueError(f"payload must be one of {sorted(CONTENT_TYPES)}, got {kind!r}")
    sample = resolve(model).example_input(1)[0].numpy()
    if kind == "json":
        body = json.dumps({"inputs": sample.tolist()}).encode()
    else:
        # The handler reads little-endian whatever machine this client runs on.
        body = sample.astype(sample.dtype.newbyteorder("<"), copy=False).tobytes()
    return body, CONTENT_TYPES[kind]
