"""Request decoding and response encoding, without a server: every accepted form, every refusal."""

from __future__ import annotations

import base64
import io
import json
import math
import pickle
import struct
import zipfile
import zlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile

from packrat.codec import forms
from packrat.codec.batch import answer_batch
from packrat.codec.codec import Codec
from packrat.codec.rows import InputRows

from packrat.codec.config import CodecConfig, Decoded

from packrat.handlers.common import request_body
from packrat.errors import RequestError
from packrat.codec.images import MEAN, STD
from packrat.models.zoo import resolve

IMAGE = CodecConfig((3, 8, 8), "float32", "classification")
VECTOR = CodecConfig((4,), "float32", "embedding")
TOKENS = CodecConfig((8,), "int64", "embedding", vocab_size=50)


# ---- helpers ----------------------------------------------------------------------------------

def saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def image_bytes(image: Image.Image, fmt: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def normalised(rgb) -> torch.Tensor:
    """What a pixel of this colour becomes: [0, 1], then ImageNet mean and std."""
    return ((torch.tensor(rgb, dtype=torch.float32) / 255).view(3, 1, 1) - MEAN) / STD


def png_claiming(width: int, height: int) -> bytes:
    """A real 1x1 PNG whose header claims width x height: the pixel limit without the pixels."""
    data = bytearray(image_bytes(Image.new("RGB", (1, 1))))
    ihdr = struct.pack(">II", width, height) + data[24:29]  # size, then depth/colour/... unchanged
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return bytes(data)


def refusal(codec: Codec, body, content_type=None) -> RequestError:
    with pytest.raises(RequestError) as info:
        codec.decode(body, content_type)
    assert "\n" not in info.value.reason
    return info.value


@pytest.fixture(scope="module")
def bert_json(tmp_path_factory) -> str:
    """BERT-like: WordPiece, lower-cased, "[CLS] text [SEP]", [PAD] = 0."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "the", "cat", "sat", "##s", "."]
    tokenizer = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer.decoder = decoders.WordPiece()
    path = tmp_path_factory.mktemp("bert") / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def word_level(path, pad_section: bool = False) -> str:
    """GPT-2-like enough: whole words, <|endoftext|> (id 5) as the pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["hello", "world", "the", "cat", "sat", "<|endoftext|>", "<unk>"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    if pad_section:
        tokenizer.enable_padding(pad_id=6, pad_token="<unk>")
    tokenizer.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def gpt_json(tmp_path_factory) -> str:
    return word_level(tmp_path_factory.mktemp("gpt") / "tokenizer.json")


@pytest.fixture
def bert(bert_json) -> Codec:
    return Codec(CodecConfig((8,), "int64", "embedding", vocab_size=11, tokenizer=bert_json))


@pytest.fixture
def gpt(gpt_json) -> Codec:
    return Codec(CodecConfig((6,), "int64", "language-model", vocab_size=7, tokenizer=gpt_json))


# ---- configuration ----------------------------------------------------------------------------

def test_config_from_a_model_spec_is_picklable():
    config = CodecConfig.for_model(resolve("gpt2"), model_name="lm", max_samples=4)
    assert (config.input_shape, config.input_dtype, config.task) == ((128,), "int64", "language-model")
    assert (config.vocab_size, config.model_name, config.max_samples) == (50257, "lm", 4)
    assert pickle.loads(pickle.dumps(config)) == config


def test_input_kind(bert):
    assert Codec(IMAGE).input_kind == "image"
    assert bert.input_kind == "text"
    assert Codec(TOKENS).input_kind == "tensor"
    assert Codec(VECTOR).input_kind == "tensor"


@pytest.mark.parametrize("overrides,message", [
    ({"tokenizer": "/nonexistent/tokenizer.json"}, "tokenizer file not found"),
    ({"labels": "/nonexistent/index_to_name.json"}, "cannot read labels file"),
    ({"input_dtype": "floaty"}, "unknown input dtype"),
    ({"task": "detection"}, "unknown task"),
])
def test_bad_configs_fail_with_one_line(overrides, message):
    config = CodecConfig(**{**TOKENS.__dict__, **overrides})
    with pytest.raises(ValueError, match=message):
        Codec(config)


def test_unreadable_tokenizer_and_labels(tmp_path, bert_json):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read tokenizer"):
        Codec(CodecConfig((8,), "int64", "embedding", tokenizer=str(tmp_path)))  # a directory holding one
    (tmp_path / "labels.json").write_text('["tench"]')
    with pytest.raises(ValueError, match="must map class indices to names"):
        Codec(CodecConfig((8,), "int64", "embedding", labels=str(tmp_path / "labels.json")))
    with pytest.raises(ValueError, match="a tokenizer needs a model taking int64"):
        Codec(CodecConfig((3, 8, 8), "float32", "classification", tokenizer=bert_json))


# ---- images -----------------------------------------------------------------------------------

def test_solid_colour_image_becomes_the_normalised_colour():
    decoded = Codec(IMAGE).decode(image_bytes(Image.new("RGB", (30, 20), (10, 200, 90))), None)
    assert decoded.form == "plain" and decoded.samples[0].shape == (1, 3, 8, 8)
    assert decoded.samples[0].dtype == torch.float32
    assert torch.allclose(decoded.samples[0][0], normalised((10, 200, 90)).expand(3, 8, 8), atol=1e-6)


def test_preprocessing_matches_a_reference_computation():
    # A smooth, asymmetric image: resizing 64x48 -> 24x18, then a centred 16x16 crop at (4, 1).
    image = Image.new("RGB", (64, 48))
    image.putdata([(4 * x, 5 * y, (x * y) % 256) for y in range(48) for x in range(64)])
    expected = image.resize((24, 18), Image.Resampling.BILINEAR).crop((4, 1, 20, 17))
    pixels = torch.tensor(list(expected.tobytes()), dtype=torch.float32).view(16, 16, 3).permute(2, 0, 1)
    got = Codec(CodecConfig((3, 16, 16), "float32", "classification")).decode(image_bytes(image), None)
    # Resizing only the crop's box rounds some values the other way: one uint8 level at most.
    assert torch.allclose(got.samples[0][0], (pixels / 255 - MEAN) / STD, atol=1 / (255 * STD.min().item()) + 1e-6)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "GIF", "BMP"])
@pytest.mark.parametrize("content_type", [None, "application/octet-stream", "image/whatever"])
def test_image_formats_by_magic_or_content_type(fmt, content_type):
    body = image_bytes(Image.new("RGB", (16, 16), (255, 0, 0)), fmt)
    sample = Codec(IMAGE).decode(body, content_type).samples[0][0]
    assert torch.allclose(sample, normalised((255, 0, 0)).expand(3, 8, 8), atol=0.05)  # JPEG is lossy


def test_exif_orientation_is_applied():
    # Left half red, right half blue; orientation 6 means "rotate 90 degrees clockwise to view".
    image = Image.new("RGB", (40, 20), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 20, 20))
    exif = Image.Exif()
    exif[0x0112] = 6
    red = Codec(IMAGE).decode(image_bytes(image, exif=exif), None).samples[0][0, 0]
    assert red[0].mean() > red[-1].mean() + 1  # red went to the top ...
    assert torch.allclose(red[:, 0], red[:, -1])  # ... not the left


def test_base64_images_in_every_json_form():
    body = image_bytes(Image.new("RGB", (8, 8), (0, 255, 0)))
    codec, colour = Codec(IMAGE), normalised((0, 255, 0)).expand(3, 8, 8)
    plain = [{"data": b64(body)}, {"body": b64(body)}, {"data": "data:image/png;base64," + b64(body)},
             json.dumps({"data": b64(body)}).encode()]
    for request in plain:
        decoded = codec.decode(request, None)
        assert decoded.form == "plain" and torch.allclose(decoded.samples[0][0], colour, atol=1e-6)
    v1 = codec.decode({"instances": [{"data": b64(body)}, {"b64": b64(body)}, b64(body)]}, None)
    assert v1.form == "kserve-v1" and v1.samples[0].shape == (3, 3, 8, 8)
    v2 = codec.decode({"id": "r1", "inputs": [{"name": "in", "shape": [2], "datatype": "BYTES",
                                               "data": [b64(body), b64(body)]}]}, None)
    assert (v2.form, v2.request_id, v2.samples[0].shape) == ("kserve-v2", "r1", (2, 3, 8, 8))


def test_pixel_limit_is_checked_from_the_header():
    codec = Codec(CodecConfig((3, 8, 8), "float32", "classification", max_pixels=1_000_000))
    error = refusal(codec, png_claiming(10_000, 1_000))
    assert (error.status, error.reason) == (413, "image too large: 10000x1000 pixels (limit 1000000)")


def test_pillow_decompression_bomb_checks_also_give_413():
    assert refusal(Codec(IMAGE), png_claiming(20_000, 20_000)).status == 413  # Pillow's error
    lax = Codec(CodecConfig((3, 8, 8), "float32", "classification", max_pixels=10**9))
    assert refusal(lax, png_claiming(10_000, 10_000)).status == 413  # Pillow's warning


def test_a_thin_strip_that_would_resize_huge_is_refused():
    error = refusal(Codec(CodecConfig((3, 224, 224), "float32", "classification")),
                    image_bytes(Image.new("RGB", (4000, 1))))
    assert error.status == 413 and "resize to" in error.reason


def test_truncated_and_corrupt_images_get_400():
    assert not ImageFile.LOAD_TRUNCATED_IMAGES
    noise = Image.frombytes("RGB", (64, 64), bytes(range(256)) * 48)
    jpeg = image_bytes(noise, "JPEG")
    for body in (jpeg[: len(jpeg) // 2], b"\xff\xd8\xff" + b"\x00" * 100, image_bytes(noise)[:-40]):
        error = refusal(Codec(IMAGE), body)
        assert error.status == 400 and error.reason.startswith(("undecodable image", "not an image"))
        assert "0x" not in error.reason  # no object addresses in what users read
    assert refusal(Codec(IMAGE), {"data": "not base64!"}).reason == "undecodable body: image data is not base64"
    assert refusal(Codec(IMAGE), b"TIFF-ish", "image/tiff").reason.startswith("not an image: none of JPEG")


def test_images_for_models_that_do_not_take_them():
    body = image_bytes(Image.new("RGB", (8, 8)))
    assert refusal(Codec(VECTOR), body, "image/png").reason == "this model takes float32 of shape 4, not images"


# ---- text -------------------------------------------------------------------------------------

def test_text_is_tokenised_and_padded_on_the_right_for_encoders(bert):
    expected = torch.tensor([[2, 4, 5, 3, 0, 0, 0, 0]])  # [CLS] hello world [SEP] [PAD]...
    for body, content_type in [("Hello world", None), (b"Hello world", None), (b"Hello world", "text/plain"),
                               ({"text": "Hello world"}, None), ({"data": "Hello world"}, None),
                               (b'{"text": "Hello world"}', "application/json"), (b"Hello world", "text/x-foo")]:
        decoded = bert.decode(body, content_type)
        assert decoded.form == "plain" and torch.equal(decoded.samples[0], expected), body


def test_language_models_are_padded_on_the_left(gpt):
    assert torch.equal(gpt.decode("the cat sat", None).samples[0], torch.tensor([[5, 5, 5, 2, 3, 4]]))


def test_pad_token_from_the_tokenizers_padding_section(tmp_path):
    path = word_level(tmp_path / "tokenizer.json", pad_section=True)
    codec = Codec(CodecConfig((4,), "int64", "embedding", tokenizer=path))
    assert codec.decode("cat", None).samples[0].tolist() == [[3, 6, 6, 6]]


def test_text_in_kserve_forms(bert):
    v1 = bert.decode({"instances": ["hello", {"text": "the cat"}, {"data": "world"}]}, None)
    assert v1.form == "kserve-v1" and v1.samples[0][:, 1].tolist() == [4, 6, 5]
    v2 = bert.decode({"inputs": [{"name": "t", "shape": [2, 1], "datatype": "BYTES",
                                  "data": [["cats"], ["sat."]]}]}, None)
    assert v2.samples[0][:, :5].tolist() == [[2, 7, 9, 3, 0], [2, 8, 10, 3, 0]]


def test_text_that_starts_like_json_is_still_text(bert):
    assert bert.decode(b"[hello] world", "text/plain").samples[0][0, 1].item() == 1  # "[" is [UNK]
    assert bert.decode(b"{hello", None).samples[0].shape == (1, 8)  # not JSON, so text


def test_text_too_long_is_refused_or_truncated(bert_json, gpt_json):
    long = "the cat sat " * 4
    error = refusal(Codec(CodecConfig((8,), "int64", "embedding", tokenizer=bert_json)), long)
    assert (error.status, error.reason) == (413, "text too long: 14 tokens, the model takes at most 8")
    cut = Codec(CodecConfig((8,), "int64", "embedding", tokenizer=bert_json, truncate_text=True))
    assert cut.decode(long, None).samples[0].tolist() == [[2, 6, 7, 8, 6, 7, 8, 3]]  # [SEP] kept
    lm = Codec(CodecConfig((4,), "int64", "language-model", tokenizer=gpt_json, truncate_text=True))
    assert lm.decode(long + "hello", None).samples[0].tolist() == [[2, 3, 4, 0]]  # the end kept


@pytest.mark.parametrize("pad_left, truncate", [(False, False), (True, False), (False, True), (True, True)])
def test_encode_batch_gives_encodes_rows_and_refuses_each_text_alone(bert_json, pad_left, truncate):
    from packrat.codec.text import TextEncoder

    encoder = TextEncoder(bert_json, 8, pad_left, truncate)
    texts = ["Hello world", "the cat sat " * 4, "  ", "cats sat.", "", "hello"]
    rows = encoder.encode_batch(texts)
    assert len(rows) == len(texts)
    for text, row in zip(texts, rows):
        try:
            expected = encoder.encode(text)
        except RequestError as exc:
            assert isinstance(row, RequestError) and (row.status, row.reason) == (exc.status, exc.reason)
        else:
            assert row.keys() == expected.keys() and all(torch.equal(row[k], expected[k]) for k in row)
    assert [getattr(r, "status", 200) for r in rows] == [200, 200 if truncate else 413, 400, 200, 400, 200]
    assert encoder.encode_batch([]) == [] and encoder.encode_batch([""])[0].status == 400


def test_a_batch_of_texts_is_tokenised_in_one_call_and_answered_as_one_by_one(bert, monkeypatch):
    texts = [b"Hello world", b"the cat sat " * 4, b"  ", b"cats sat.", "hello"]  # one too long, one empty
    bodies = [(text, "text/plain; charset=utf-8") for text in texts] + [(b"Hello world", None)]
    one_by_one = answer_batch(lambda ids, *rest: ids.float(), bert, bodies)
    calls = []
    batch_call = bert.samples.text.encode_batch
    monkeypatch.setattr(bert.samples.text, "encode_batch", lambda texts: calls.append(texts) or batch_call(texts))
    monkeypatch.setattr(bert.samples.text.tokenizer, "encode", None)  # no text tokenised alone from here
    batched = answer_batch(lambda ids, *rest: ids.float(), bert, bodies[:-1])
    assert calls == [["Hello world", "the cat sat " * 4, "  ", "cats sat.", "hello"]]
    assert [(a.status, a.body) for a in batched] == [(a.status, a.body) for a in one_by_one[:-1]]
    assert [a.status for a in batched] == [200, 413, 400, 200, 200]


def test_text_refusals(bert):
    assert (refusal(bert, "   ").status, refusal(bert, {"text": ""}).status) == (400, 400)
    assert refusal(bert, {"text": ""}).reason.startswith("empty text")
    no_tokenizer = refusal(Codec(TOKENS), b"hello world")
    assert no_tokenizer.reason == ("this model was archived without a tokenizer: send token ids, "
                                   "or archive with --tokenizer DIR")
    assert refusal(Codec(TOKENS), {"text": "hi"}).reason == no_tokenizer.reason
    assert refusal(Codec(VECTOR), b"hello", "text/plain").reason == "this model takes float32 of shape 4, not text"


def test_raw_token_ids_are_not_mistaken_for_text(bert):
    ids = torch.tensor([2, 4, 5, 3, 0, 0, 0, 0])
    for content_type in (None, "application/octet-stream"):
        assert torch.equal(bert.decode(ids.numpy().tobytes(), content_type).samples[0][0], ids)


# ---- tensors ----------------------------------------------------------------------------------

def test_raw_bytes_and_torch_save():
    x = torch.randn(3, 8, 8)
    assert torch.equal(Codec(IMAGE).decode(bytearray(x.numpy().tobytes()), "application/octet-stream").samples[0][0], x)
    assert torch.equal(Codec(IMAGE).decode(memoryview(x.numpy().tobytes()), None).samples[0][0], x)
    tokens = torch.arange(8)
    assert torch.equal(Codec(TOKENS).decode(saved(tokens), None).samples[0][0], tokens)
    assert torch.equal(Codec(TOKENS).decode(saved(tokens[None]), None).samples[0][0], tokens)


def test_raw_floats_that_start_like_json_are_still_raw():
    x = torch.tensor([struct.unpack("<f", b"{\x00\x00\x3f")[0], 1.0, 2.0, 3.0])
    assert torch.equal(Codec(VECTOR).decode(x.numpy().tobytes(), "application/octet-stream").samples[0][0], x)


def test_json_numbers_in_every_form():
    codec, x = Codec(VECTOR), [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]
    assert codec.decode({"inputs": x[0]}, None).samples[0].tolist() == [x[0]]  # legacy
    assert codec.decode(json.dumps({"inputs": [x[0]]}).encode(), None).samples[0].tolist() == [x[0]]  # batch of one
    v1 = codec.decode({"instances": x}, None)
    assert (v1.form, v1.samples[0].tolist()) == ("kserve-v1", x)
    for data in (x, sum(x, [])):  # nested or flat
        v2 = codec.decode({"inputs": [{"name": "in", "shape": [2, 4], "datatype": "FP32", "data": data}]}, None)
        assert (v2.form, v2.request_id, v2.samples[0].tolist()) == ("kserve-v2", None, x)
    ints = codec.decode({"inputs": [{"name": "in", "shape": [4], "datatype": "INT32", "data": [1, 2, 3, 4]}]}, None)
    assert ints.samples[0].dtype == torch.float32 and ints.samples[0].tolist() == [[1, 2, 3, 4]]


# ---- refusals ---------------------------------------------------------------------------------

def v2(datatype="FP32", shape=(4,), data=(1.0, 2.0, 3.0, 4.0), **extra) -> dict:
    return {"inputs": [{"name": "in", "shape": list(shape), "datatype": datatype, "data": list(data)}], **extra}


@pytest.mark.parametrize("config,body,content_type,status,reason", [
    (VECTOR, b"abc", "application/octet-stream", 400, "wrong size: 3 bytes, expected 16 (float32 of shape 4)"),
    (IMAGE, b"abc", None, 400, "expected 768 (float32 of shape 3x8x8, or an image)"),
    (VECTOR, {"inputs": [[1.0, 2.0]]}, None, 400, "wrong shape: got 1x2, expected float32 of shape 4"),
    (VECTOR, {"inputs": [[1, 2], [3]]}, None, 400, "inputs must be a nested list of numbers"),
    (VECTOR, {"inputs": ["a", "b", "c", "d"]}, None, 400, "inputs must be a nested list of numbers"),
    (VECTOR, {"inputs": [True] * 4}, None, 400, "inputs must be numbers, got bool"),
    (VECTOR, {"nothing": 1}, None, 400, 'JSON body must be an object with "data", "text", "inputs" or "instances"'),
    (VECTOR, [1.0, 2.0, 3.0, 4.0], None, 400, "JSON body must be an object"),
    (TOKENS, {"inputs": [0.5] * 8}, None, 400, "wrong dtype: got floating-point numbers, expected int64 of shape 8"),
    (TOKENS, {"inputs": [1] * 7 + [50]}, None, 400, "token id 50 is outside the model's vocabulary [0, 50)"),
    (TOKENS, {"inputs": [-1] + [1] * 7}, None, 400, "token id -1 is outside the model's vocabulary"),
    (TOKENS, torch.full((8,), 99).numpy().tobytes(), None, 400, "token id 99 is outside"),
    (TOKENS, v2("FP32", [8], [1.0] * 8), None, 400, "wrong dtype: got FP32, expected int64 of shape 8"),
    (VECTOR, v2("STRING"), None, 400, "unsupported datatype 'STRING'"),
    (VECTOR, v2(shape=[3]), None, 400, "shape [3] does not match the 4 values in data"),
    (VECTOR, v2(shape=[2, 2]), None, 400, "wrong shape: got [2, 2], expected [4] or [k, 4]"),
    (VECTOR, v2(shape="4"), None, 400, '"shape" must be a list of non-negative integers'),
    (VECTOR, v2(id=7), None, 400, '"id" must be a string'),
    (VECTOR, v2("BYTES", [0], []), None, 400, "KServe v2 input has no data"),
    (VECTOR, {"instances": []}, None, 400, '"instances" must be a non-empty list'),
    (VECTOR, {"instances": [{"x": 1}]}, None, 400, "a sample object must be"),
    (VECTOR, {"instances": [None]}, None, 400, "cannot read a sample from a JSON NoneType"),
    (VECTOR, b'{"inputs": [1, 2', "application/json", 400, "undecodable body: not valid JSON"),
    (VECTOR, b'{"inputs": [1, 2, 3', None, 400, "undecodable body: not valid JSON"),
    (VECTOR, b"\xff\xfe{", "application/json", 400, "undecodable body: not valid JSON"),
    (VECTOR, b'{"inputs": [1, NaN, 3, 4]}', None, 400, "JSON holds NaN: only finite numbers are accepted"),
    (VECTOR, b'{"inputs": [1, -Infinity, 3, 4]}', None, 400, "JSON holds -Infinity"),
    (VECTOR, b"[" * 100_000 + b"]" * 100_000, None, 400, "undecodable body"),
    (VECTOR, saved(torch.zeros(4, dtype=torch.float64)), None, 400, "wrong dtype: got float64, expected float32"),
    (VECTOR, saved({"a": torch.zeros(1)}), None, 400, "torch.save body must hold a tensor, got dict"),
    (VECTOR, b"PK\x03\x04garbage", None, 400, "undecodable body: not a torch.save tensor"),
    (VECTOR, b"x" * (VECTOR.max_body_bytes + 1), None, 413, "request too large: 16777217 bytes (limit 16777216)"),
    (VECTOR, b"", None, 400, "empty request"),
    (VECTOR, None, None, 400, "empty request"),
    (IMAGE, b"", "application/x-www-form-urlencoded", 400, "a form post (curl -d/--data-binary without a Content-Type)"),
    (VECTOR, 42, None, 400, "unsupported request body: int"),
    (VECTOR, {"instances": [[0.0] * 4] * 65}, None, 413, "too many samples: 65 (limit 64)"),
    (VECTOR, v2(shape=[65, 4], data=[0.0] * 260), None, 413, "too many samples: 65 (limit 64)"),
    (VECTOR, v2("BYTES", [65], ["x"] * 65), None, 413, "too many samples: 65 (limit 64)"),
])
def test_bad_requests_get_a_status_and_one_line(config, body, content_type, status, reason):
    error = refusal(Codec(config), body, content_type)
    assert error.status == status and reason in error.reason, error.reason


NOT_FINITE_BODIES = [
    (b'{"inputs": [1, 1e999, 3, 4]}', "application/json"),
    ({"inputs": [1.0, float("nan"), 3.0, 4.0]}, None),  # JSON as TorchServe hands it over, decoded
    (v2(data=[1e300, 0, 0, 0]), None),  # inf as float32
    (torch.tensor([1.0, math.inf, 0, 0]).numpy().tobytes(), None),
    (saved(torch.tensor([math.nan, 0.0, 0.0, 0.0])), None),
]


@pytest.mark.parametrize("body,content_type", NOT_FINITE_BODIES)
def test_inputs_that_are_not_finite_are_refused_where_the_outputs_show_them(body, content_type):
    """Passed on by the model (here: doubled), NaN or infinity in an input is that request's 400;
    its batch-mate is answered."""
    good = torch.ones(4).numpy().tobytes()
    bad, fine = answer_batch(lambda x: x * 2, Codec(VECTOR), [(body, content_type), (good, None)])
    assert bad.status == 400 and "inputs must be finite numbers" in bad.reason, bad.reason
    assert fine.status == 200


def test_outputs_that_are_not_finite_from_finite_inputs_are_ours():
    nan = torch.tensor([math.nan] * 4)
    (reply,) = answer_batch(lambda x: x * nan, Codec(VECTOR), [(torch.ones(4).numpy().tobytes(), None)])
    assert reply.status == 500 and "not finite" in reply.reason


CLASSES = CodecConfig((4,), "float32", "classification")


ROW_OUTPUTS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, math.nan, 0.0, 0.0], [-math.inf, 0.0, 1.0, 2.0],
                            [math.inf, 0.0, 1.0, 2.0], [4.0, 3.0, 2.0, 1.0]])
FORMS = {"plain": lambda x: (x.numpy().tobytes(), "application/octet-stream"),
         "kserve-v1": lambda x: ({"instances": [x.tolist()]}, None),
         "kserve-v2 JSON": lambda x: (v2(data=x.tolist()), None),
         "kserve-v2 binary": lambda x: (v2(data=x.tolist(), parameters={"binary_data_output": True}), None)}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("rows", [InputRows.allocate(CLASSES, 5), None], ids=["rows", "each"])
def test_every_row_with_an_output_not_finite_is_answered_so_in_every_form(form, rows):
    """NaN or +inf anywhere among a row's outputs: that row alone is answered "not finite" (500: its
    inputs were finite) in every form, its batch-mates answered. An -inf logit (a class masked) is
    answered where the answer is the row's top classes (its score is 0), and "not finite" where the
    answer is the outputs themselves (KServe v2). With rows the batch runs whole; without, each
    request alone."""
    bodies = [FORMS[form](torch.ones(4))] * len(ROW_OUTPUTS)
    if rows is not None:
        replies = answer_batch(lambda x: ROW_OUTPUTS[:len(x)], Codec(CLASSES), bodies, rows=rows)
    else:
        replies = [answer_batch(lambda x, i=i: ROW_OUTPUTS[i:i + 1], Codec(CLASSES), [body])[0]
                   for i, body in enumerate(bodies)]
    top_classes = not form.startswith("kserve-v2")
    assert [r.status for r in replies] == [200, 500, 200 if top_classes else 500, 500, 200], [r.reason for r in replies]
    assert all(r.reason == "the model's outputs for this input are not finite (NaN or infinity)"
               for r in replies[1:4] if r.status == 500)
    if top_classes:  # the masked class comes last, at probability 0
        answer = json.loads(replies[2].body)
        predictions = (answer["predictions"][0] if form == "kserve-v1" else answer)["predictions"]
        assert [(p["class"], p["score"]) for p in predictions][-1] == (0, 0.0)


@pytest.mark.parametrize("rows", [InputRows.allocate(CLASSES, 3), None], ids=["rows", "each"])
def test_a_batch_of_top_classes_with_a_row_not_finite_answers_the_others(rows):
    """Every answer of the batch its top classes, so no pass over the outputs: a row's own top
    scores say it is not finite, the rows around it are answered."""
    outputs = torch.tensor([[1.0, 2.0, 3.0, 4.0], [math.inf, 0.0, 1.0, 2.0], [4.0, 3.0, 2.0, 1.0]])
    bodies = [FORMS["plain"](torch.ones(4))] * 3
    if rows is not None:
        replies = answer_batch(lambda x: outputs[:len(x)], Codec(CLASSES), bodies, rows=rows)
    else:
        replies = [answer_batch(lambda x, i=i: outputs[i:i + 1], Codec(CLASSES), [body])[0]
                   for i, body in enumerate(bodies)]
    assert [r.status for r in replies] == [200, 500, 200]
    assert [json.loads(r.body)["predictions"][0]["class"] for r in (replies[0], replies[2])] == [3, 0]


def test_a_model_that_absorbs_a_non_finite_input_answers_it():
    (reply,) = answer_batch(lambda x: torch.zeros(len(x), 4), Codec(VECTOR), [NOT_FINITE_BODIES[3]])
    assert reply.status == 200


class Boom:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def test_arbitrary_pickles_are_refused():
    buffer = io.BytesIO()
    torch.save(Boom(), buffer, pickle_module=pickle)
    assert "not a torch.save tensor" in refusal(Codec(VECTOR), buffer.getvalue()).reason


def test_compressed_torch_save_bombs_are_refused_unopened():
    source, packed = zipfile.ZipFile(io.BytesIO(saved(torch.zeros(10**6)))), io.BytesIO()
    with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as archive:
        for entry in source.infolist():
            archive.writestr(entry.filename, source.read(entry))
    error = refusal(Codec(VECTOR), packed.getvalue())
    assert error.status == 413 and error.reason.startswith("torch.save body too large")


def test_unforeseen_failures_become_400(monkeypatch):
    codec = Codec(VECTOR)
    monkeypatch.setattr(forms, "from_json", lambda samples, body: {}["missing"])
    error = refusal(codec, {"inputs": [1.0]})
    assert (error.status, error.reason) == (400, "cannot decode request: KeyError: 'missing'")


def test_request_body_reads_data_or_body():
    assert request_body({"data": b"1"}) == b"1"
    assert request_body({"body": b"2"}) == b"2"


# ---- answers ----------------------------------------------------------------------------------

LOGITS = torch.tensor([0.0, 5.0, 1.0, 3.0, 2.0, 4.0, -1.0])


def answer(codec: Codec, outputs: torch.Tensor, form: str = "plain", request_id=None):
    body = codec.encode(outputs, Decoded(torch.zeros(len(outputs)), form, request_id))
    assert b" " not in body  # compact
    return json.loads(body)


def test_classification_top5_with_softmax_scores():
    top = answer(Codec(CodecConfig((4,), "float32", "classification")), LOGITS[None])["predictions"]
    assert [p["class"] for p in top] == [1, 5, 3, 4, 2] and "label" not in top[0]
    assert top[0]["score"] == pytest.approx(torch.softmax(LOGITS, 0)[1].item())


@pytest.mark.parametrize("names", [{"1": "tench", "5": "goldfish"},
                                   {"1": ["n01440764", "tench"], "5": ["n01443537", "goldfish"]}])
def test_labels_from_index_to_name(tmp_path, names):
    (tmp_path / "index_to_name.json").write_text(json.dumps(names))
    codec = Codec(CodecConfig((4,), "float32", "classification", labels=str(tmp_path / "index_to_name.json")))
    top = answer(codec, LOGITS[None])["predictions"]
    assert [p.get("label") for p in top[:3]] == ["tench", "goldfish", None]
    assert list(top[0]) == ["class", "label", "score"]


def test_language_model_next_tokens(gpt):
    tokens = answer(gpt, LOGITS[None])["next_tokens"]
    assert [(t["token"], t["text"]) for t in tokens[:3]] == [(1, "world"), (5, "<|endoftext|>"), (3, "cat")]
    assert tokens[0]["logit"] == 5.0
    without = Codec(CodecConfig((6,), "int64", "language-model"))
    assert answer(without, LOGITS.expand(2, 7)[None])["next_tokens"][0] == {"token": 1, "logit": 5.0}


def test_embedding_and_kserve_v1():
    codec = Codec(VECTOR)
    assert answer(codec, torch.ones(1, 3)) == {"embedding": [1.0, 1.0, 1.0]}
    assert answer(codec, torch.eye(2), "kserve-v1") == {"predictions": [{"embedding": [1.0, 0.0]},
                                                                         {"embedding": [0.0, 1.0]}]}


def test_kserve_v2_round_trip():
    codec = Codec(CodecConfig((4,), "float32", "embedding", model_name="vec"))
    decoded = codec.decode(v2(shape=[1, 4], id="abc"), "application/json")
    outputs = torch.arange(6, dtype=torch.float32).view(1, 2, 3)
    assert json.loads(codec.encode(outputs, decoded)) == {
        "model_name": "vec", "id": "abc",
        "outputs": [{"name": "output0", "shape": [1, 2, 3], "datatype": "FP32", "data": [0, 1, 2, 3, 4, 5]}]}
    ints = answer(codec, torch.tensor([[7, 8]]), "kserve-v2")
    assert "id" not in ints and ints["outputs"][0]["datatype"] == "INT64"


# ---- fuzzing: decode raises RequestError and nothing else ---------------------------------------

KEYS = st.sampled_from(["inputs", "instances", "data", "b64", "body", "text", "id", "shape", "datatype", "name"])
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    | st.sampled_from(["FP32", "INT64", "BYTES", "hello world", b64(b"\x89PNG\r\n\x1a\n")]),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(KEYS | st.text(max_size=5), inner, max_size=5),
    max_leaves=30)
CONTENT_TYPES = st.sampled_from([None, "application/json", "text/plain", "image/png", "application/octet-stream"])
BODIES = (st.binary(max_size=200) | JSONISH | JSONISH.map(lambda v: json.dumps(v).encode())
          | st.sampled_from([b"\x89PNG\r\n\x1a\n" + bytes(30), b"\xff\xd8\xff" + bytes(30), b"PK\x03\x04" + bytes(30)]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODIES, content_type=CONTENT_TYPES)
def test_decode_raises_nothing_but_request_error(bert, body, content_type):
    for codec in (Codec(IMAGE), Codec(VECTOR), Codec(TOKENS), bert):
        try:
            decoded = codec.decode(body, content_type)
        except RequestError as exc:
            assert 400 <= exc.status < 500 and "\n" not in exc.reason
            continue
        assert decoded.samples[0].shape[1:] == codec.shape and decoded.samples[0].shape[0] >= 1
        assert decoded.samples[0].dtype == codec.dtype


# ---- several named inputs (text models: ids, mask, token types) ---------------------------------

from packrat.codec.forms import sample_request  # noqa: E402
from packrat.models.spec import InputSpec, token_inputs  # noqa: E402


def text_config(length: int = 8, task: str = "embedding", tokenizer: str | None = None, **more) -> CodecConfig:
    inputs = token_inputs(length, 11, token_types=True)
    return CodecConfig((length,), "int64", task, vocab_size=11, tokenizer=tokenizer, inputs=inputs, **more)


def ids_entry(name: str, rows: list[list[int]]) -> dict:
    return {"name": name, "shape": [len(rows), len(rows[0])], "datatype": "INT64",
            "data": [x for row in rows for x in row]}


def test_text_gives_the_mask_and_token_types_of_its_padded_row(bert_json, gpt_json):
    ids, mask, types = Codec(text_config(tokenizer=bert_json)).decode("the cat", None).samples
    assert ids.tolist() == [[2, 6, 7, 3, 0, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 0, 0, 0, 0]] and types.tolist() == [[0] * 8]
    lm = Codec(CodecConfig((6,), "int64", "language-model", vocab_size=7, tokenizer=gpt_json,
                           inputs=token_inputs(6, 7)))
    ids, mask = lm.decode("the cat sat", None).samples
    assert ids.tolist() == [[5, 5, 5, 2, 3, 4]] and mask.tolist() == [[0, 0, 0, 1, 1, 1]]


def test_v2_takes_each_input_by_name_and_fills_what_is_left_out():
    codec = Codec(text_config())
    body = {"inputs": [ids_entry("attention_mask", [[1, 1, 0, 0, 0, 0, 0, 0]] * 2),
                       ids_entry("input_ids", [[2, 5, 0, 0, 0, 0, 0, 0], [2, 6, 0, 0, 0, 0, 0, 0]])]}
    ids, mask, types = codec.decode(body, None).samples
    assert ids[:, 1].tolist() == [5, 6] and mask.sum().item() == 4 and types.shape == (2, 8) and not types.any()
    ids, mask, types = codec.decode({"inputs": [ids_entry("input_ids", [[2, 5, 3, 0, 0, 0, 0, 0]])]}, None).samples
    assert mask.tolist() == [[1] * 8] and types.tolist() == [[0] * 8]  # ids alone: no padding, one segment


def test_named_inputs_in_plain_json_and_v1_instances():
    codec = Codec(text_config())
    sample = {"input_ids": [2, 5, 3, 0, 0, 0, 0, 0], "attention_mask": [1, 1, 1, 0, 0, 0, 0, 0]}
    plain = codec.decode(sample, None)
    assert plain.form == "plain" and plain.samples[1].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0]]
    v1 = codec.decode({"instances": [sample, sample]}, None)
    assert v1.form == "kserve-v1" and [x.shape for x in v1.samples] == [(2, 8)] * 3


def test_raw_ids_of_a_text_model_get_a_mask_of_ones():
    ids = torch.arange(8)
    decoded = Codec(text_config()).decode(ids.numpy().tobytes(), "application/octet-stream")
    assert decoded.samples[0].tolist() == [list(range(8))] and decoded.samples[1].tolist() == [[1] * 8]


@pytest.mark.parametrize(("body", "reason"), [
    ({"inputs": [ids_entry("input_ids", [[1] * 8]), ids_entry("input_ids", [[1] * 8])]}, "input 'input_ids' given twice"),
    ({"inputs": [ids_entry("input_ids", [[1] * 8]), ids_entry("mask", [[1] * 8])]},
     "unknown input 'mask': this model takes input_ids, attention_mask, token_type_ids"),
    ({"inputs": [ids_entry("input_ids", [[1] * 8]), ids_entry("attention_mask", [[1] * 8] * 2)]},
     "inputs disagree on the number of samples"),
    ({"inputs": [ids_entry("input_ids", [[1] * 8]), ids_entry("attention_mask", [[2] * 8])]},
     "attention_mask value 2 is outside the model's range [0, 2)"),
    ({"inputs": [ids_entry("input_ids", [[1] * 7])]}, "wrong shape for input_ids: got [1, 7]"),
    ({"inputs": [ids_entry("attention_mask", [[1] * 8])]}, "missing input 'input_ids'"),
    ({"inputs": [ids_entry("input_ids", [[1] * 8]), "x"]}, 'each of "inputs" must be an object'),
    ({"input_ids": [1] * 8, "extra": [1]}, "unknown input 'extra'"),
    ({"instances": [{"input_ids": [1] * 8}, {"input_ids": [1] * 8, "attention_mask": [1] * 8}]},
     "every sample of a request must give the same inputs"),
    ({"inputs": [{"name": "attention_mask", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]},
     "BYTES (images or text) go to the first input, 'input_ids'"),
])
def test_named_input_refusals(body, reason):
    error = refusal(Codec(text_config()), body)
    assert error.status == 400 and reason in error.reason, error.reason


def test_sample_requests_decode_back_to_the_same_inputs():
    spec = resolve("bert_base", (8,))
    sample = tuple(x[0] for x in spec.example_inputs(1))
    body, kind = sample_request(spec.inputs, sample)
    decoded = Codec(CodecConfig.for_model(spec)).decode(body, kind)
    assert all(torch.equal(a[0], b) for a, b in zip(decoded.samples, sample))
    image = resolve("tiny")
    body, kind = sample_request(image.inputs, (image.example_input(1)[0],))
    assert kind == "application/octet-stream"
    assert torch.equal(Codec(CodecConfig.for_model(image)).decode(body, kind).samples[0], image.example_input(1))


def test_an_input_without_a_fill_must_be_sent():
    inputs = (InputSpec("image", (2,), "float32"), InputSpec("scale", (1,), "float32"))
    codec = Codec(CodecConfig((2,), "float32", "embedding", inputs=inputs))
    error = refusal(codec, {"inputs": [{"name": "image", "shape": [2], "datatype": "FP32", "data": [1, 2]}]})
    assert error.status == 400 and "missing input 'scale'" in error.reason
