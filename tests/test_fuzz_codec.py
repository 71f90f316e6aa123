"""The fuzzing campaign's quick part (issue 71): the codec alone, on the requests tests/fuzzing.py
generates and mutates for the tiny model. Whatever the bytes and headers, decode() gives a parsed
request or a RequestError with a 4xx status and a one-line reason, never another exception; a batch
of such requests answers each one 200 or 4xx, its good requests 200; the front ends' cheap reads of
a body (Triton's timeout, the header length) never raise. The servers' campaigns are in
test_fuzz_servers.py."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fuzzing import MAX_BODY, Wire, good_requests, requests, verdict
from packrat.codec import oip
from packrat.codec.batch import answer_batch
from packrat.codec.codec import Codec
from packrat.codec.config import CodecConfig
from packrat.errors import RequestError
from packrat.handlers import common
from packrat.models.zoo import prepare, resolve

QUICK = settings(max_examples=100, deadline=None, database=None, phases=[Phase.explicit, Phase.generate, Phase.shrink],
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec(CodecConfig.for_model(resolve("tiny"), max_body_bytes=MAX_BODY))


@pytest.fixture(scope="module")
def module():
    return prepare(resolve("tiny"), 2, "eager")[0]


def refusal_is_clean(exc: RequestError) -> None:
    assert 400 <= exc.status < 500, (exc.status, exc.reason)
    assert exc.reason.strip() and "\n" not in exc.reason, exc.reason


def torchserve_body(wire: Wire):
    """The body as TorchServe's Python side hands it to the handler: JSON decoded (NaN allowed), text
    as str, anything else (or JSON it cannot decode) as a bytearray."""
    kind = (wire.content_type or "").lower()
    if "json" in kind:
        try:
            return json.loads(wire.body)
        except (ValueError, RecursionError):
            return bytearray(wire.body)
    if kind.startswith("text/"):
        try:
            return wire.body.decode("utf-8")
        except UnicodeDecodeError:
            return bytearray(wire.body)
    return bytearray(wire.body)


class Rows:
    """TorchServe's context for one request: its headers, as the handler reads them."""

    def __init__(self, wire: Wire):
        headers = {"content-type": wire.content_type} if wire.content_type is not None else {}
        if wire.header_length is not None:
            headers[oip.HEADER] = wire.header_length
        self.request_processor = [type("Row", (), {"get_request_properties": staticmethod(lambda: headers)})]


@QUICK
@given(wire=requests())
def test_decode_gives_samples_or_a_clean_refusal(codec, wire):
    try:
        decoded = codec.decode(wire.body, wire.content_type, wire.header_length)
    except RequestError as exc:
        refusal_is_clean(exc)
        return
    assert decoded.samples[0].shape[1:] == codec.shape and 1 <= len(decoded.samples[0]) <= 64
    assert decoded.samples[0].dtype == torch.float32


@QUICK
@given(wire=requests())
def test_torchserve_rows_decode_alike(codec, wire):
    """What the packrat handler makes of TorchServe's row (JSON and text decoded already)."""
    request = common.to_request({"body": torchserve_body(wire)}, Rows(wire), 0)
    try:
        codec.decode(request.body, request.content_type, request.header_length)
    except RequestError as exc:
        refusal_is_clean(exc)


@QUICK
@given(wire=requests())
def test_the_front_ends_reads_of_a_body_never_raise(wire):
    timeout = oip.timeout_s(wire.body, wire.header_length)
    assert timeout is None or timeout > 0
    try:
        oip.checked_header(wire.header_length, len(wire.body))
    except RequestError as exc:
        refusal_is_clean(exc)


@settings(QUICK, max_examples=25)
@given(wires=st.lists(requests(), min_size=1, max_size=3), good_at=st.integers(0, 3))
def test_a_batch_of_fuzz_answers_each_request_alone_and_its_good_one_200(codec, module, wires, good_at):
    good = good_requests(good_at)
    wires = wires[:good_at] + [good] + wires[good_at:]
    replies = answer_batch(module, codec, [(w.body, w.content_type, w.header_length) for w in wires])
    for wire, reply in zip(wires, replies):
        assert verdict(reply.status, reply.body) is None, (reply.status, reply.body[:300], wire.describe())
    assert replies[min(good_at, len(wires) - 1)].status == 200


def test_a_refusal_quoting_non_ascii_keeps_torchserves_frame_in_step():
    """TorchServe's worker frames the status phrase with its length in characters and writes its
    UTF-8 bytes: a reason quoting a client's non-ASCII name threw the Java side out of step and the
    worker was restarted. The phrase is one line of ASCII; the body keeps the reason as JSON."""
    from ts.context import Context, RequestProcessor
    from ts.protocol.otf_message_handler import create_predict_response

    from packrat.serving.pool.api import Answer

    context = Context("tiny", "/tmp", {}, 1, None, "0.12")
    context.request_processor = [RequestProcessor({})]
    reason = "unsupported datatype 'q\ue757\U0001f600\nx'"
    body = common.respond([Answer.error(400, reason)], context)
    phrase = context.get_response_status(0)[1]
    assert phrase == "unsupported datatype 'q\\ue757\\U0001f600\\nx'" and phrase.isascii()
    assert json.loads(body[0])["error"] == reason
    frame = create_predict_response(body, {0: "id"}, "", 200, context=context)
    at = frame.index(phrase.encode()) - 4  # the phrase's length, then the phrase
    assert int.from_bytes(frame[at:at + 4], "big") == len(phrase.encode())
