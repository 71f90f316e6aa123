"""Request decoding and response encoding, without a server."""

from __future__ import annotations

import io
import json
import pickle

import pytest
import torch

from packrat.codec import InputSpec, RequestError, decode, encode, request_body

IMAGE = InputSpec((3, 4, 4), torch.float32)
TOKENS = InputSpec((8,), torch.int64)


def saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def test_raw_bytes_round_trip():
    x = torch.randn(3, 4, 4)
    assert torch.equal(decode(bytearray(x.numpy().tobytes()), IMAGE, "application/octet-stream"), x)


def test_json_already_decoded_by_torchserve_and_as_bytes():
    x = torch.arange(48, dtype=torch.float32).view(3, 4, 4)
    assert torch.equal(decode({"inputs": x.tolist()}, IMAGE), x)
    body = json.dumps({"inputs": x.tolist()}).encode()
    assert torch.equal(decode(body, IMAGE, "application/json"), x)
    assert torch.equal(decode(body, IMAGE, None), x)  # sniffed
    assert torch.equal(decode({"inputs": [x.tolist()]}, IMAGE), x)  # a batch of one


def test_torch_save_bytes():
    tokens = torch.arange(8)
    assert torch.equal(decode(saved(tokens), TOKENS), tokens)


def test_int_json_for_token_models():
    assert decode({"inputs": list(range(8))}, TOKENS).dtype == torch.int64


@pytest.mark.parametrize("body,spec,status,reason", [
    (b"abc", IMAGE, 400, "wrong size: 3 bytes, expected 192 (float32 of shape 3x4x4)"),
    ({"inputs": [[1.0, 2.0]]}, IMAGE, 400, "wrong shape: got 1x2, expected float32 of shape 3x4x4"),
    ({"data": [1]}, IMAGE, 400, 'JSON body must be an object {"inputs": [...]}'),
    ({"inputs": [[1, 2], [3]]}, IMAGE, 400, "inputs must be a nested list of numbers"),
    ({"inputs": [0.5] * 8}, TOKENS, 400, "wrong dtype: got floating-point numbers, expected integers"),
    (b'{"inputs": [1, 2', IMAGE, 400, "undecodable body: not valid JSON"),
    (b"\xff\xfe{", IMAGE, 400, "undecodable body"),
    (saved(torch.zeros(3, 4, 4, dtype=torch.float64)), IMAGE, 400, "wrong dtype: got float64, expected float32"),
    (saved({"a": torch.zeros(1)}), IMAGE, 400, "torch.save body must hold a tensor, got dict"),
    (b"PK\x03\x04garbage", IMAGE, 400, "undecodable body: not a torch.save tensor"),
    (b"x" * (IMAGE.max_bytes + 1), IMAGE, 413, "request too large"),
    (None, IMAGE, 400, "empty request"),
])
def test_bad_requests_get_a_status_and_one_line(body, spec, status, reason):
    with pytest.raises(RequestError) as info:
        decode(body, spec, "application/json" if isinstance(body, bytes) and body[:1] in b"{\xff" else None)
    assert info.value.status == status
    assert reason in info.value.reason
    assert "\n" not in info.value.reason


class Boom:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def test_arbitrary_pickles_are_refused():
    buffer = io.BytesIO()
    torch.save(Boom(), buffer, pickle_module=pickle)
    with pytest.raises(RequestError, match="undecodable body"):
        decode(buffer.getvalue(), IMAGE)


def test_request_body_reads_data_or_body():
    assert request_body({"data": b"1"}) == b"1"
    assert request_body({"body": b"2"}) == b"2"


def test_encode_per_task():
    logits = torch.tensor([0.0, 5.0, 1.0, 3.0, 2.0, 4.0, -1.0])
    top = encode(logits, "classification")["predictions"]
    assert [p["class"] for p in top] == [1, 5, 3, 4, 2]
    assert top[0]["score"] == pytest.approx(torch.softmax(logits, 0)[1].item())
    assert [t["token"] for t in encode(logits, "language-model")["next_tokens"]] == [1, 5, 3, 4, 2]
    assert encode(torch.ones(4), "embedding") == {"embedding": [1.0, 1.0, 1.0, 1.0]}
