"""The batch's input rows (packrat.codec.rows, packrat.codec.batch): where each input's rows lie, requests decoded into
their rows (a raw body already in its row read where it lies, an image normalised straight into
it), the model run on the rows as they are, and answers equal to those of the path without rows."""

from __future__ import annotations

import json

import pytest
import torch

from packrat.codec.payloads import build_payload
from packrat.codec.batch import answer_batch
from packrat.codec.rows import ALIGN, InputRows, RowsLayout
from packrat.codec.codec import RAW_CHECKS, Codec
from packrat.codec.config import CodecConfig
from packrat.models.spec import InputSpec
from packrat.models.zoo import prepare, resolve

TEXT = CodecConfig((8,), "int64", "embedding", inputs=(
    InputSpec("input_ids", (8,), "int64", 50), InputSpec("attention_mask", (8,), "int64", fill="ones")))


@pytest.fixture(scope="module")
def tiny():
    module, _, _ = prepare(resolve("tiny"), 4, graph_mode="eager")
    return module, Codec(CodecConfig.for_model(resolve("tiny")))


def test_layout_puts_each_input_on_its_own_cache_lines():
    layout = RowsLayout.of(TEXT, 3)
    assert layout.regions == ((0, 64), (192, 64)) and layout.size == 384 and layout.row_bytes == 64
    odd = RowsLayout.of(CodecConfig((3,), "float32", "embedding", inputs=(
        InputSpec("a", (3,), "float32"), InputSpec("b", (5,), "int64"))), 5)
    assert odd.regions[1][0] % ALIGN == 0 and odd.regions[1][0] >= 5 * 12
    assert odd.row_offset(2) == 24 and odd.size % ALIGN == 0


def test_rows_take_samples_and_know_the_ones_decoded_in_place():
    rows = InputRows.allocate(TEXT, 3)
    ids, mask = rows.row(1)
    assert rows.put(1, (torch.arange(8)[None], torch.ones(1, 8, dtype=torch.int64)))
    assert ids.tolist() == list(range(8)) and mask.tolist() == [1] * 8
    in_place = rows.row(2)[0]
    in_place.fill_(3)
    assert rows.put(2, (in_place[None], torch.zeros(1, 8, dtype=torch.int64)))
    assert not rows.put(0, (torch.zeros(2, 8, dtype=torch.int64), torch.zeros(2, 8, dtype=torch.int64)))
    assert not rows.put(3, (torch.zeros(1, 8, dtype=torch.int64),) * 2)  # no such row
    first = rows.first(3)[0]
    assert first.data_ptr() == rows.tensors[0].data_ptr() and first.shape == (3, 8)
    gathered = rows.taken([1, 2])[0]
    assert gathered.tolist() == [list(range(8)), [3] * 8]
    assert rows.from_row(1).row(0)[0].data_ptr() == ids.data_ptr()


def raw_in_rows(codec: Codec, bodies: list[bytes]) -> tuple[InputRows, list[tuple]]:
    """Rows with each body written into its row, as the pool's parent writes raw bodies."""
    rows = InputRows.allocate(codec.config, len(bodies))
    view = memoryview(rows.buffer)
    placed = []
    for index, body in enumerate(bodies):
        start = rows.layout.row_offset(index)
        view[start:start + len(body)] = body
        placed.append((view[start:start + len(body)], "application/octet-stream"))
    return rows, placed


def test_raw_bodies_in_their_rows_answer_as_without_rows(tiny):
    module, codec = tiny
    samples = resolve("tiny").example_inputs(3)[0]
    bodies = [sample.numpy().tobytes() for sample in samples]
    rows, placed = raw_in_rows(codec, bodies)
    seen = []
    in_rows = answer_batch(lambda x: seen.append(x.data_ptr()) or module(x), codec, placed, rows=rows,
                           in_rows=frozenset(range(3)))
    assert seen == [rows.tensors[0].data_ptr()], "the model did not read the rows where they lie"
    plain = answer_batch(module, codec, [(body, "application/octet-stream") for body in bodies])
    assert [a.status for a in in_rows] == [200] * 3
    for got, want in zip(in_rows, plain):
        got, want = json.loads(got.body)["predictions"], json.loads(want.body)["predictions"]
        assert [p["class"] for p in got] == [p["class"] for p in want]
        assert [p["score"] for p in got] == pytest.approx([p["score"] for p in want], rel=1e-5)


def test_a_failed_request_leaves_a_hole_its_batch_mates_do_not_see(tiny):
    module, codec = tiny
    photo, kind = build_payload("tiny", "jpeg")
    rows = InputRows.allocate(codec.config, 3)
    answers = answer_batch(module, codec, [(photo, kind), (b"not an image", "image/png"), (photo, kind)], rows=rows)
    alone = answer_batch(module, codec, [(photo, kind)])
    assert [a.status for a in answers] == [200, 400, 200]
    assert json.loads(answers[2].body)["predictions"][0]["class"] == json.loads(alone[0].body)["predictions"][0]["class"]


def test_images_are_decoded_straight_into_their_rows(tiny):
    _, codec = tiny
    photo, kind = build_payload("tiny", "jpeg")
    rows = InputRows.allocate(codec.config, 2)
    decoded = codec.decode(photo, kind, into=rows.row(1))
    assert decoded.samples[0].data_ptr() == rows.row(1)[0].data_ptr()
    assert torch.equal(decoded.samples[0][0], codec.decode(photo, kind).samples[0][0])


def test_a_request_of_several_samples_takes_the_path_without_rows(tiny):
    module, codec = tiny
    sample = resolve("tiny").example_inputs(2)[0]
    v1 = json.dumps({"instances": sample.tolist()}).encode()
    rows = InputRows.allocate(codec.config, 2)
    (one_of_two, several) = answer_batch(module, codec, [(sample[0].numpy().tobytes(), None), (v1, "application/json")],
                                         rows=rows)
    assert one_of_two.status == several.status == 200
    assert len(json.loads(several.body)["predictions"]) == 2


def test_a_body_is_ready_in_its_row_only_where_decode_would_read_it_as_raw_and_check_nothing(tiny):
    _, codec = tiny
    raw = resolve("tiny").example_inputs(1)[0][0].numpy().tobytes()
    assert codec.ready_in_row(raw, "application/octet-stream") and codec.ready_in_row(raw, None)
    png_start = b"\x89PNG\r\n\x1a\n" + raw[8:]
    json_start = b' {"data"' + raw[8:]
    assert not codec.ready_in_row(png_start, "application/octet-stream")  # sniffed as an image first
    assert not codec.ready_in_row(json_start, None)  # tried as JSON first
    assert not codec.ready_in_row(raw, "image/png") and not codec.ready_in_row(raw, "application/json")
    assert not codec.ready_in_row(raw, "application/octet-stream", header_length="16")
    assert not codec.ready_in_row(raw[:-4], None)
    tokens = Codec(CodecConfig((8,), "int64", "embedding", vocab_size=50))  # ids to check against the vocabulary
    assert not tokens.ready_in_row(torch.zeros(8, dtype=torch.int64).numpy().tobytes(), None)
    assert not Codec(TEXT).ready_in_row(bytes(64), None)  # a second input to fill


def test_the_ready_in_row_check_a_content_type_keeps_agreeing_and_holds_bounded_memory(tiny):
    """The check is kept for each content type seen (a batch's bodies mostly share one); a client
    sending a new type with every body does not grow what is kept, and each answer stays the rule's."""
    _, codec = tiny
    raw = resolve("tiny").example_inputs(1)[0][0].numpy().tobytes()
    png_start = b"\x89PNG\r\n\x1a\n" + raw[8:]
    for n in range(3 * RAW_CHECKS):
        kind = f"application/x-odd-{n}" if n % 2 else "application/octet-stream"
        assert codec.ready_in_row(raw, kind) and not codec.ready_in_row(png_start, kind)
        assert not codec.ready_in_row(raw, f"image/x-odd-{n}") and not codec.ready_in_row(raw, f"text/x-{n}")
    assert len(codec._raw_checks) <= RAW_CHECKS


def test_raw_sized_bodies_in_rows_that_decode_must_read_are_answered_alone(tiny):
    module, codec = tiny
    samples = resolve("tiny").example_inputs(3)[0]
    bodies = [sample.numpy().tobytes() for sample in samples]
    bodies[1] = b"\x89PNG\r\n\x1a\n" + bodies[1][8:]  # the size of a sample, the start of an image
    rows, placed = raw_in_rows(codec, bodies)
    answers = answer_batch(module, codec, placed, rows=rows, in_rows=frozenset(range(3)))
    assert [a.status for a in answers] == [200, 400, 200]
    tokens = Codec(CodecConfig((8,), "int64", "embedding", vocab_size=50))
    ids = [torch.arange(8), torch.full((8,), 50), torch.zeros(8, dtype=torch.int64)]
    rows, placed = raw_in_rows(tokens, [row.numpy().tobytes() for row in ids])
    answers = answer_batch(lambda x: x.float(), tokens, placed, rows=rows, in_rows=frozenset(range(3)))
    assert [a.status for a in answers] == [200, 400, 200] and "outside the model's vocabulary" in answers[1].body.decode()


def test_a_binary_v2_input_of_one_sample_is_copied_straight_into_its_row(tiny):
    """The tensor after a binary v2 header, one sample in the input's own dtype, is copied into the
    request's row and read there (no tensor of its own first); another dtype, or several samples,
    take the path without it. Either way the answers are the path without rows'."""
    from packrat.codec import oip
    from packrat.codec.batch import answer_batch
    from packrat.codec.payloads import v2_binary_payload

    module, codec = tiny
    body, kind, length = v2_binary_payload(resolve("tiny"))
    rows = InputRows.allocate(codec.config, 2)
    decoded = codec.decode(memoryview(bytearray(body)), kind, length, into=rows.row(0))
    assert decoded.form == "kserve-v2" and decoded.samples[0].data_ptr() == rows.row(0)[0].data_ptr()
    sample = resolve("tiny").example_inputs(1)[0]
    as_fp64, fp64_length = oip.request({"inputs": [{"name": "input", "shape": list(sample.shape), "datatype": "FP64"}]},
                                       [sample.double().numpy().tobytes()])
    other = codec.decode(as_fp64, kind, fp64_length, into=rows.row(1))
    assert other.samples[0].data_ptr() != rows.row(1)[0].data_ptr() and torch.equal(other.samples[0], sample)
    requests = [(body, kind, length), (as_fp64, kind, fp64_length)]
    with_rows = answer_batch(module, codec, requests, rows=InputRows.allocate(codec.config, 2))
    without = answer_batch(module, codec, requests)
    assert [(a.status, a.body) for a in with_rows] == [(a.status, a.body) for a in without]
    assert all(a.status == 200 for a in with_rows)
