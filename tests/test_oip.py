"""The KServe v2 binary tensor extension (packrat.codec.oip) through the codec, without a server:
requests as tritonclient builds them, answers as tritonclient reads them, and every refusal."""

from __future__ import annotations

import io
import json
import struct
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from ts.context import Context, RequestProcessor

from packrat.handlers import common
from packrat.codec import answers, known_heads, oip
from packrat.codec.codec import Codec
from packrat.codec.config import CodecConfig
from packrat.codec.rows import InputRows
from packrat.errors import RequestError
from packrat.codec.batch import answer_batch
from packrat.models.spec import InputSpec
from packrat.models.zoo import prepare, resolve
from packrat.serving.pool.api import Answer

IMAGE = CodecConfig((3, 8, 8), "float32", "classification", model_name="img")
TEXT = CodecConfig((4,), "int64", "embedding", model_name="txt",
                   inputs=(InputSpec("input_ids", (4,), "int64", 100), InputSpec("attention_mask", (4,), "int64", 2,
                                                                                 fill="ones")))


@pytest.fixture(scope="module")
def triton():
    return pytest.importorskip("tritonclient.http")


def binary(head: dict, *chunks: bytes) -> tuple[bytes, int]:
    """(body, header length) of a request: the JSON header, then the raw chunks."""
    header = json.dumps(head).encode()
    return header + b"".join(chunks), len(header)


def entry(name: str, tensor: torch.Tensor, datatype: str = "FP32", size: int | None = None) -> dict:
    raw = tensor.numpy().tobytes()
    return {"name": name, "shape": list(tensor.shape), "datatype": datatype,
            "parameters": {"binary_data_size": len(raw) if size is None else size}}


def decode(codec: Codec, request: tuple[bytes, int]):
    return codec.decode(request[0], "application/octet-stream", request[1])


def refusal(codec: Codec, body: bytes, header_length) -> str:
    with pytest.raises(RequestError) as info:
        codec.decode(body, "application/octet-stream", header_length)
    assert info.value.status == 400 and "\n" not in info.value.reason
    return info.value.reason


def test_tritonclient_requests_decode_like_json(triton):
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    given = triton.InferInput("input0", [2, 3, 8, 8], "FP32")
    given.set_data_from_numpy(x.numpy())  # binary_data=True: tritonclient's default
    body, length = triton.InferenceServerClient.generate_request_body(
        [given], outputs=[triton.InferRequestedOutput("output0")], request_id="r7")
    codec = Codec(IMAGE)
    decoded = codec.decode(body, None, str(length))  # headers arrive as text
    assert torch.equal(decoded.samples[0], x) and decoded.request_id == "r7" and decoded.binary_output
    # the same body without its header length: the JSON's end is found by parsing
    assert torch.equal(codec.decode(body, "application/json", None).samples[0], x)
    assert codec.decode(bytearray(body), None).binary_output
    given.set_data_from_numpy(x.numpy(), binary_data=False)
    body, length = triton.InferenceServerClient.generate_request_body(
        [given], outputs=[triton.InferRequestedOutput("output0", binary_data=False)])
    assert length is None
    decoded = codec.decode(body, None)
    assert torch.equal(decoded.samples[0], x) and not decoded.binary_output


def test_several_named_inputs_binary_and_json_mixed():
    ids, mask = torch.tensor([[5, 6, 7, 0]]), torch.tensor([[1, 1, 1, 0]])
    head = {"inputs": [entry("attention_mask", mask, "INT64"),
                       {"name": "input_ids", "shape": [1, 4], "datatype": "INT32", "data": ids.flatten().tolist()}]}
    decoded = decode(Codec(TEXT), binary(head, mask.numpy().tobytes()))
    assert [t.tolist() for t in decoded.samples] == [ids.tolist(), mask.tolist()]
    # INT32 bytes for an int64 input are widened; a left-out mask is filled with ones
    head = {"inputs": [entry("input_ids", ids.int(), "INT32")]}
    got_ids, got_mask = decode(Codec(TEXT), binary(head, ids.int().numpy().tobytes())).samples
    assert got_ids.dtype == torch.int64 and got_ids.tolist() == ids.tolist() and got_mask.tolist() == [[1] * 4]


def test_bytes_elements_are_raw_images():
    pictures = []
    for colour in ((255, 0, 0), (0, 0, 255)):
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8), colour).save(buffer, "PNG")
        pictures.append(buffer.getvalue())
    chunk = b"".join(struct.pack("<I", len(p)) + p for p in pictures)
    head = {"inputs": [{"name": "img", "shape": [2], "datatype": "BYTES",
                        "parameters": {"binary_data_size": len(chunk)}}]}
    (samples,) = decode(Codec(IMAGE), binary(head, chunk)).samples
    assert samples.shape == (2, 3, 8, 8) and samples[0, 0, 0, 0] > samples[1, 0, 0, 0]  # red, then blue


def test_binary_answers_read_back_by_tritonclient(triton):
    codec = Codec(IMAGE)
    x = torch.zeros(1, 3, 8, 8)
    outputs = torch.arange(20, dtype=torch.float32).view(2, 10)
    for asked in ({"outputs": [{"name": "output0", "parameters": {"binary_data": True}}]},
                  {"parameters": {"binary_data_output": True}}):
        decoded = decode(codec, binary({"id": "a", "inputs": [entry("x", x)], **asked}, x.numpy().tobytes()))
        encoded = codec.encoded(outputs, decoded)
        assert encoded.content_type == "application/octet-stream"
        result = triton.InferenceServerClient.parse_response_body(encoded.body, header_length=encoded.header_length)
        assert np.array_equal(result.as_numpy("output0"), outputs.numpy())
        assert result.get_response()["id"] == "a" and "data" not in result.get_response()["outputs"][0]
    # an output asked for in JSON wins over the request-wide binary_data_output
    head = {"inputs": [entry("x", x)], "parameters": {"binary_data_output": True},
            "outputs": [{"name": "output0", "parameters": {"binary_data": False}}]}
    encoded = codec.encoded(outputs, decode(codec, binary(head, x.numpy().tobytes())))
    assert encoded.header_length is None and encoded.content_type == "application/json"
    assert json.loads(encoded.body)["outputs"][0]["data"] == list(range(20))


@pytest.mark.parametrize("case, want", [
    ("length beyond body", "but the body has only"),
    ("length not a number", "must be a byte count"),
    ("header not JSON", "not valid JSON"),
    ("too few bytes", "ends at byte"),
    ("too many bytes", "bytes after the inputs' binary data"),
    ("partial value", "not a whole number of 4-byte values"),
    ("shape disagrees", "does not match the"),
    ("unknown datatype", "unsupported datatype"),
    ("bad size", "must be a non-negative integer"),
    ("bytes element cut", "runs past its binary_data_size"),
    ("unknown output", "unknown output"),
])
def test_malformed_binary_requests_are_400_with_a_reason(case, want):
    x = torch.zeros(1, 3, 8, 8)
    raw = x.numpy().tobytes()
    body, length = binary({"inputs": [entry("x", x)]}, raw)
    bodies = {
        "length beyond body": (body, len(body) + 1),
        "length not a number": (body, "12a"),
        "header not JSON": (body, length - 1),
        "too few bytes": (body[:-4], length),
        "too many bytes": (body + b"\0" * 4, length),
        "partial value": binary({"inputs": [entry("x", x, size=len(raw) - 2)]}, raw[:-2]),
        "shape disagrees": binary({"inputs": [entry("x", x, size=len(raw) - 4)]}, raw[:-4]),
        "unknown datatype": binary({"inputs": [entry("x", x, "FP8")]}, raw),
        "bad size": binary({"inputs": [entry("x", x, size="many")]}, raw),
        "bytes element cut": binary({"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES",
                                                 "parameters": {"binary_data_size": 8}}]},
                                    struct.pack("<I", 9) + b"abcd"),
        "unknown output": binary({"inputs": [entry("x", x)], "outputs": [{"name": "logits"}]}, raw),
    }
    assert want in refusal(Codec(IMAGE), *bodies[case])


HEADS = st.fixed_dictionaries({"inputs": st.lists(st.fixed_dictionaries({
    "name": st.sampled_from(["input_ids", "attention_mask", "x"]),
    "shape": st.lists(st.integers(-1, 5), max_size=3),
    "datatype": st.sampled_from(["INT64", "INT32", "FP32", "BYTES", "BOOL", "FP8"]),
    "parameters": st.fixed_dictionaries({"binary_data_size": st.integers(-2, 40) | st.text(max_size=3)})}),
    max_size=3)})


@settings(max_examples=300, deadline=None)
@given(head=HEADS, tail=st.binary(max_size=64), shift=st.integers(-3, 3), keep_header=st.booleans())
def test_binary_decode_raises_nothing_but_request_error(head, tail, shift, keep_header):
    body, length = binary(head, tail)
    try:
        decoded = Codec(TEXT).decode(body, None, length + shift if keep_header else None)
    except RequestError as exc:
        assert 400 <= exc.status < 500 and "\n" not in exc.reason
    else:
        assert [t.shape[1:] for t in decoded.samples] == [(4,), (4,)]


def test_bad_binary_request_fails_alone_in_its_batch():
    spec = resolve("tiny")
    module, _, _ = prepare(spec, 4, "eager")  # the model as it is: the codec is what is tested, not a graph mode
    codec = Codec(CodecConfig.for_model(spec))
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    good = binary({"inputs": [entry("input", x)], "parameters": {"binary_data_output": True}}, x.numpy().tobytes())
    bad = (good[0][:-1], good[1])
    replies = answer_batch(module, codec, [(good[0], None, good[1]), (bad[0], None, bad[1]),
                                           (good[0], "application/octet-stream", str(good[1]))])
    assert [r.status for r in replies] == [200, 400, 200]
    assert replies[1].content_type == "application/json" and "ends at byte" in json.loads(replies[1].body)["error"]
    with torch.inference_mode():
        want = module(x)
    for reply in replies[::2]:
        assert reply.content_type == "application/octet-stream"
        data = np.frombuffer(reply.body[reply.header_length:], dtype=np.float32).reshape(1, 10)
        torch.testing.assert_close(torch.from_numpy(data.copy()), want, rtol=1e-4, atol=1e-4)


def test_torchserve_rows_carry_the_header_length_and_answers_set_it():
    context = Context("tiny", "/tmp", {}, 2, None, "0.12")
    context.request_processor = [  # TorchServe passes header names as the client sent them
        RequestProcessor({"body": {"content-type": "application/octet-stream"},
                          "inference-header-content-length": "9"}),
        RequestProcessor({"body": {"content-type": "application/json"}, "Inference-Header-Content-Length": "9"})]
    raw = common.to_request({"body": bytearray(b'{"a":1}xy')}, context, 0)
    assert (raw.body, raw.header_length) == (b'{"a":1}xy', "9")
    # a body TorchServe decoded as JSON was JSON and nothing else: re-encoded, its length is no longer right
    assert common.to_request({"body": {"a": 1}}, context, 1).header_length is None
    answers = [Answer(200, b"{}xy", "", "application/octet-stream", 2), Answer(400, b'{"error":"no"}', "no")]
    assert common.respond(answers, context) == [b"{}xy", b'{"error":"no"}']
    assert context.get_response_content_type(0) == "application/octet-stream"
    assert context.get_response_headers(0)["Inference-Header-Content-Length"] == "2"
    assert context.get_response_content_type(1) == "application/json"
    assert "Inference-Header-Content-Length" not in context.get_response_headers(1)
    assert context.get_response_status(1) == (400, "no")


def tritonclient_body(timeout_us: int | None, binary: bool, rows: int = 1) -> tuple[bytes, int | None]:
    """A request body exactly as tritonclient's HTTP client writes it."""
    import tritonclient.http as triton
    from tritonclient.http import _utils

    given = triton.InferInput("input", [rows, 3], "FP32")
    given.set_data_from_numpy(np.ones((rows, 3), np.float32), binary_data=binary)
    return _utils._get_inference_request(inputs=[given], request_id="", outputs=None, sequence_id=0,
                                         sequence_start=False, sequence_end=False, priority=0, timeout=timeout_us,
                                         custom_parameters=None)


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("rows", [1, 20_000])  # a JSON body of 60 000 numbers: its parameters read at its end
def test_tritons_timeout_parameter_is_read_from_the_bodys_header(binary, rows):
    from packrat.codec import oip

    body, length = tritonclient_body(250_000, binary, rows)
    assert oip.timeout_s(body, length) == pytest.approx(0.25)
    assert oip.timeout_s(bytearray(body), None if length is None else str(length)) == pytest.approx(0.25)
    assert oip.timeout_s(*tritonclient_body(None, binary, rows)) is None


@pytest.mark.parametrize("body, expected", [
    (b'{"parameters": {"timeout": 5000}, "inputs": [{"name": "x", "data": [1]}]}', 0.005),  # small: parsed whole
    (b'{"parameters": {"timeout": 5000}, "inputs": [' + b"1," * 40_000 + b'1]}', None),  # large, not at its end
    (b'{"inputs": [{"name": "x", "parameters": {"timeout": 5000}, "data": [1]}]}', None),  # an input's, not its
    (b'{"inputs": [], "parameters": {"timeout": 0}}', None),  # no deadline
    (b'{"inputs": [], "parameters": {"timeout": true}}', None),
    (b'{"inputs": [], "parameters": {"timeout": 2.5e6}}', 2.5),
    (b'{"inputs": [], "parameters": {"timeout": 5', None),  # not JSON: the instance says so
])
def test_a_json_bodys_timeout_is_its_top_level_parameter(body, expected):
    from packrat.codec import oip

    assert oip.timeout_s(body, None) == expected


def huge_header(timeout_last: bool, size: int = 16 << 20) -> bytes:
    """A well-formed JSON header of `size` bytes or so, its numbers all one input's "data", with
    Triton's timeout (5 s) in its top-level parameters, written last (as tritonclient does) or first."""
    numbers = b"0.5," * ((size - 200) // 4) + b"0.5"
    data = b'"inputs":[{"name":"input","shape":[-1],"datatype":"FP32","data":[' + numbers + b"]}]"
    parameters = b'"parameters":{"timeout":5000000}'
    return b"{" + (data + b"," + parameters if timeout_last else parameters + b"," + data) + b"}"


@pytest.mark.parametrize("timeout_last", [True, False], ids=["timeout-last", "timeout-first"])
def test_a_16_mib_header_is_refused_unparsed_and_its_timeout_read_in_bounded_time(timeout_last):
    """Parsed whole, such a header held the front end's event loop 2-3.6 s here; its deadline is now
    read from its last JSON_SCAN_BYTES (tritonclient's order) or not at all, and the codec refuses it
    413 before parsing. The TorchServe handler's row reads the timeout the same way."""
    from packrat.codec import oip

    body = huge_header(timeout_last)
    context = Context("tiny", "/tmp", {}, 1, None, "0.12")
    context.request_processor = [RequestProcessor({"Inference-Header-Content-Length": str(len(body))})]
    started = time.perf_counter()
    request = common.to_request({"body": bytearray(body)}, context, 0)
    read_s = time.perf_counter() - started
    assert request.timeout_s == (5.0 if timeout_last else None)
    codec = Codec(CodecConfig((3, 8, 8), "float32", "classification", model_name="img", max_body_bytes=32 << 20))
    started = time.perf_counter()
    with pytest.raises(RequestError) as info:
        codec.decode(request.body, "application/octet-stream", request.header_length)
    refused_s = time.perf_counter() - started
    assert info.value.status == 413 and "over the limit of 1048576" in info.value.reason
    assert "\n" not in info.value.reason
    assert read_s + refused_s < 0.1  # measured 0.1 ms (one copy of 64 KiB); one byte search over 16 MiB took 17 ms


def test_a_header_at_the_limit_is_parsed():
    from packrat.codec import oip

    x = torch.zeros(1, 3, 8, 8)
    body, length = binary({"inputs": [entry("x", x)], "pad": "p" * oip.MAX_HEADER_BYTES}, x.numpy().tobytes())
    with pytest.raises(RequestError, match="over the limit"):
        Codec(IMAGE).decode(body, None, length)
    body, length = binary({"inputs": [entry("x", x)], "pad": "p" * (oip.MAX_HEADER_BYTES - 200)}, x.numpy().tobytes())
    assert decode(Codec(IMAGE), (body, length)).samples[0].shape == (1, 3, 8, 8)


# ---- headers seen before (codec.known_heads) -----------------------------------------------------

def test_a_header_seen_before_decodes_as_the_first_time_into_its_row_or_in_place():
    codec, rows = Codec(IMAGE), InputRows.allocate(IMAGE, 2)
    first, second = torch.randn(2, 1, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    head = {"id": "r1", "inputs": [entry("x", first)], "parameters": {"binary_data_output": True}}
    for x in (first, second, second):  # the first through the full decode, the others as it learnt
        body, length = binary(head, x.numpy().tobytes())
        into_row = codec.decode(body, None, length, into=rows.row(1))
        received = bytearray(body)
        in_place = codec.decode(received, None, length)
        for decoded in (into_row, in_place):
            assert torch.equal(decoded.samples[0], x) and decoded.samples[0].shape == (1, 3, 8, 8)
            assert (decoded.form, decoded.request_id, decoded.binary_output) == ("kserve-v2", "r1", True)
        assert into_row.samples[0].data_ptr() == rows.row(1)[0].data_ptr()  # copied straight into its row
        received[length:length + 4] = np.float32(42).tobytes()
        assert in_place.samples[0].flatten()[0] == 42  # read where it lies
    assert len(codec._known_heads._known) == 1


def test_a_known_header_over_other_bytes_is_refused_as_before():
    x = torch.zeros(1, 3, 8, 8)
    body, length = binary({"inputs": [entry("x", x)]}, x.numpy().tobytes())
    codec = Codec(IMAGE)
    decode(codec, (body, length))  # learnt
    assert "ends at byte" in refusal(codec, body[:-4], length)
    assert "bytes after the inputs' binary data" in refusal(codec, body + b"\0" * 4, length)


def test_only_headers_whose_values_are_the_bytes_are_kept_and_a_stream_of_new_ones_is_bounded():
    x = torch.zeros(1, 3, 8, 8)
    codec = Codec(IMAGE)
    widened = binary({"inputs": [entry("x", x.double(), "FP64")]}, x.double().numpy().tobytes())
    as_json = json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 8, 8], "datatype": "FP32",
                                      "data": [0.0] * 192}]}).encode()
    decode(codec, widened)
    codec.decode(as_json, None, len(as_json))
    assert not codec._known_heads._known
    ids = torch.tensor([[5, 6, 7, 0]])  # token ids: a range to check, never kept
    tokens, head_length = binary({"inputs": [entry("input_ids", ids, "INT64")]}, ids.numpy().tobytes())
    text = Codec(TEXT)
    decode(text, (tokens, head_length))
    out_of_range = tokens[:head_length] + torch.tensor([[500, 6, 7, 0]]).numpy().tobytes()
    assert "outside the model's vocabulary" in refusal(text, out_of_range, head_length)
    for number in range(known_heads.HEADS + 1):
        decode(codec, binary({"id": str(number), "inputs": [entry("x", x)]}, x.numpy().tobytes()))
    assert 1 <= len(codec._known_heads._known) <= known_heads.HEADS


def test_binary_answers_keep_one_header_per_id_shape_and_dtype():
    codec = Codec(IMAGE)
    x = torch.zeros(1, 3, 8, 8)
    for number in range(answers.V2_HEADERS + 1):
        decoded = decode(codec, binary({"id": f"r{number}", "inputs": [entry("x", x)],
                                        "parameters": {"binary_data_output": True}}, x.numpy().tobytes()))
        outputs = torch.full((1, 10), float(number))
        encoded = codec.encoded(outputs, decoded)
        head = json.loads(encoded.body[:encoded.header_length])
        assert head["id"] == f"r{number}" and head["outputs"][0]["shape"] == [1, 10]
        assert np.frombuffer(encoded.body[encoded.header_length:], np.float32).tolist() == [float(number)] * 10
        wider = codec.encoded(torch.zeros(1, 12, dtype=torch.float64), decoded)
        assert json.loads(wider.body[:wider.header_length])["outputs"][0]["datatype"] == "FP64"
    assert 1 <= len(codec.answers._v2_headers) <= answers.V2_HEADERS
    codec.answers._v2_headers.clear()
    long_id = "r" * (answers.V2_KEPT_ID + 1)  # answered, not kept: ids a client chooses hold no memory
    decoded = decode(codec, binary({"id": long_id, "inputs": [entry("x", x)],
                                    "parameters": {"binary_data_output": True}}, x.numpy().tobytes()))
    encoded = codec.encoded(torch.zeros(1, 10), decoded)
    assert json.loads(encoded.body[:encoded.header_length])["id"] == long_id and not codec.answers._v2_headers


def test_binary_data_is_read_where_it_lies_only_when_writable():
    data = bytearray(np.arange(4, dtype=np.float32).tobytes())
    in_place = oip.tensor(memoryview(data)[4:], "FP32")
    data[4:8] = np.float32(9).tobytes()
    assert in_place.tolist() == [9.0, 2.0, 3.0]
    frozen = bytes(data)
    assert oip.tensor(frozen, "FP32").tolist() == [0.0, 9.0, 2.0, 3.0]
