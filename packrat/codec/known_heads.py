"""Binary KServe v2 requests whose JSON header was seen before, decoded without parsing it again.

A client sends the same header with every request of a kind (tritonclient: the same input, shape,
datatype and outputs). Where a header, fully decoded once, gave one input's raw values in that
input's own dtype (nothing converted, no range to check: Samples.raw_is_row), the same header over
as many bytes gives those bytes again: they are read where they lie, or copied into the request's
row. Up to HEADS headers are kept per codec; a client sending a new one with every request clears
them rather than growing them, and pays the full decode it paid before.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from packrat.codec import oip
from packrat.codec.config import Decoded
from packrat.codec.samples import Samples

HEADS = 64
HEAD_BYTES = 4096  # tritonclient's header for one input is a few hundred bytes; larger ones are not kept


class Known(NamedTuple):
    """What a header decodes to, whatever the bytes after it."""
    shape: tuple[int, ...]  # the values' shape in the batch: (k, *the input's shape)
    data_bytes: int  # the binary data after the header: exactly the values
    request_id: str | None
    binary_output: bool


class KnownHeads:
    """One codec's headers seen, each with what it decodes to."""

    def __init__(self, samples: Samples):
        self.samples = samples
        self.datatype = oip.datatype(samples.dtype)
        self._known: dict[bytes, Known] = {}

    def decode(self, body, length: int | None, into=None) -> Decoded | None:
        """The request decoded as its header decoded before (into its row, `into`, where it is one
        sample), or None: no binary header of bytes (`length`), a header not seen, or a body it did
        not decode from (the full decode then says what is wrong)."""
        key = _key(body, length)
        if key is None or len(body) > self.samples.config.max_body_bytes:
            return None
        view = memoryview(body)
        known = self._known.get(key)
        if known is None or len(view) - length != known.data_bytes:
            return None
        data = view[length:]
        if into is not None and known.shape[0] == 1:
            oip.copy_into(into[0], data)
            values = into[0][None]
        else:
            values = oip.tensor(data, self.datatype).view(known.shape)
        return Decoded((values,), "kserve-v2", known.request_id, known.binary_output)

    def learn(self, body, length: int | None, decoded: Decoded) -> None:
        """Keep what `body`'s header decoded to, where the same header over as many bytes gives
        those bytes as the input's values and nothing else."""
        key = _key(body, length)
        if key is None or not self.samples.raw_is_row or decoded.form != "kserve-v2":
            return
        head = json.loads(key)  # decoded once already: valid
        entries = head.get("inputs")
        entry = entries[0] if len(entries) == 1 else {}
        values = decoded.samples[0]
        data_bytes = len(body) - length
        if (entry.get("datatype") != self.datatype or "binary_data_size" not in oip.parameters(entry)
                or values.numel() * values.element_size() != data_bytes):
            return
        if len(self._known) >= HEADS:
            self._known.clear()
        self._known[key] = Known(tuple(values.shape), data_bytes, decoded.request_id, decoded.binary_output)


def _key(body, length: int | None) -> bytes | None:
    """A binary body's header, as kept; None where there is none to keep (no header length, a
    body not of bytes, a header over HEAD_BYTES)."""
    if length is None or length > HEAD_BYTES or not isinstance(body, (bytes, bytearray, memoryview)):
        return None
    return bytes(memoryview(body)[:length])
