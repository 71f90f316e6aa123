"""packrat.codec.images against the pipeline it replaced (`reference` below, the one copy of it: full-size
decode, EXIF turn, resize of the whole image, crop, normalise), on synthetic photos; the reduced
JPEG decode's scale and its EXIF handling; writing into a caller's buffer.

Tolerances, in normalised units (one uint8 level is 1 / (255 * std) = 0.0175 on the channel with the
smallest std):
- decoded at full size, the only change is resizing the crop's box instead of the whole image:
  Pillow's fixed-point rounding then differs by at most one level, here and there;
- decoded at a reduced DCT scale, libjpeg's scaled IDCT replaces part of the bilinear filter's
  averaging: measured on these photos a mean |difference| up to 0.014 (under one level) and a
  largest one of 0.23 (13 levels, single pixels at sharp edges and noise), 0.0085 and 0.16 on the
  4000x3000 photo (docs/benchmarks/serving.md). Asserted: mean 0.02, largest 0.35, and no
  bias (mean signed difference within 0.005): a shifted or stretched crop would break all three.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from packrat.codec.images import CROP_FRACTION, FORMATS, MEAN, STD, refusals, to_sample
from packrat.codec.payloads import synthetic_jpeg
from packrat.errors import RequestError

SHAPE = (3, 224, 224)
LIMIT = 100_000_000
LEVEL = 1 / (255 * 0.224)  # one uint8 step, normalised, on the green channel (the smallest std)


# ---- the reference: packrat.codec.images before issue 41, verbatim but for names and comments ----

def reference(data: bytes, shape: tuple[int, int, int], max_pixels: int) -> torch.Tensor:
    """A float32 tensor of `shape` (3, H, W), or RequestError (413 for too many pixels)."""
    with refusals():  # the errors' mapping is shared with the new path, unchanged by issue 41
        image = Image.open(io.BytesIO(data), formats=FORMATS)
        width, height = image.size
        if width * height > max_pixels:
            raise RequestError(413, f"image too large: {width}x{height} pixels (limit {max_pixels})")
        image.load()
        image = ImageOps.exif_transpose(image).convert("RGB")
    short = round(max(shape[1], shape[2]) / CROP_FRACTION)
    w, h = image.size
    size = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    if size[0] * size[1] > max_pixels:
        raise RequestError(413, f"image too large: {w}x{h} pixels resize to {size[0]}x{size[1]} "
                                f"(limit {max_pixels})")
    image = image.resize(size, Image.Resampling.BILINEAR)
    left, top = round((size[0] - shape[2]) / 2), round((size[1] - shape[1]) / 2)
    image = image.crop((left, top, left + shape[2], top + shape[1]))
    pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    sample = pixels.view(image.height, image.width, 3).permute(2, 0, 1).float() / 255
    return ((sample - MEAN) / STD).contiguous()


def encoded(image: Image.Image, fmt: str = "JPEG", orientation: int | None = None) -> bytes:
    buffer = io.BytesIO()
    options = {"quality": 90} if fmt == "JPEG" else {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def photo(width: int, height: int) -> Image.Image:
    return Image.open(io.BytesIO(synthetic_jpeg(width, height))).convert("RGB")


def difference(body: bytes, shape=SHAPE) -> torch.Tensor:
    return to_sample(body, shape, LIMIT) - reference(body, shape, LIMIT)


def with_alpha() -> bytes:
    image = photo(640, 480).convert("RGBA")
    image.putalpha(Image.linear_gradient("L").resize((640, 480)))  # transparent to opaque: dropped, not blended
    return encoded(image, "PNG")


@pytest.mark.parametrize("body", [
    pytest.param(lambda: synthetic_jpeg(500, 375), id="jpeg-500x375"),
    pytest.param(lambda: synthetic_jpeg(375, 500), id="jpeg-375x500"),
    pytest.param(lambda: synthetic_jpeg(224, 224), id="jpeg-224x224"),
    pytest.param(lambda: synthetic_jpeg(1000, 300), id="jpeg-1000x300"),
    pytest.param(lambda: synthetic_jpeg(333, 517), id="jpeg-333x517-odd"),
    pytest.param(with_alpha, id="png-alpha"),
    pytest.param(lambda: encoded(photo(301, 199), "PNG", orientation=6), id="png-exif-6-odd"),
])
def test_full_size_decodes_match_to_one_level(body):
    diff = difference(body()).abs()
    assert diff.max() <= LEVEL + 1e-5


@pytest.mark.parametrize("body", [
    pytest.param(lambda: synthetic_jpeg(1001, 769), id="jpeg-1001x769-half"),
    pytest.param(lambda: synthetic_jpeg(1200, 2100), id="jpeg-1200x2100-quarter"),
    pytest.param(lambda: encoded(photo(901, 703).convert("L")), id="gray-jpeg-half"),
    *[pytest.param(lambda o=o: encoded(photo(1201, 905), orientation=o), id=f"jpeg-exif-{o}-half")
      for o in (3, 6, 8)],
])
def test_reduced_scale_decodes_match_within_the_tolerance(body):
    diff = difference(body())
    assert diff.abs().mean() < 0.02 and diff.abs().max() < 0.35 and abs(diff.mean()) < 0.005


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_keeps_the_crop_in_place(orientation):
    """Reduced 8 times, 201x153 decodes as 26x20: the last column and row stand for 1 and 1/8
    pixels beyond the image. Turned or flipped, they come first; on steep ramps a crop placed
    without that shifts by most of a pixel (a mean difference of 0.08-0.17) instead of 0.002."""
    y, x = np.mgrid[0:153, 0:201]
    ramps = np.stack([x * 1.2, y * 1.6, (x + y) * 0.7], axis=-1).clip(0, 255).astype(np.uint8)
    diff = difference(encoded(Image.fromarray(ramps), orientation=orientation), (3, 16, 16))
    assert abs(diff.mean()) < 0.01 and diff.abs().max() < 0.1


def decoded_size(monkeypatch, body: bytes) -> tuple[int, int]:
    """The size of the image to_sample resized the crop from: as decoded, turned upright."""
    seen, resize = [], Image.Image.resize

    def spy(self, *args, **kwargs):
        seen.append(self.size)
        return resize(self, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "resize", spy)
    to_sample(body, SHAPE, LIMIT)
    return seen[-1]


@pytest.mark.parametrize("stored, orientation, decoded", [
    ((500, 375), None, (500, 375)),  # 375 / 2 < 256: no reduction
    ((1000, 300), None, (1000, 300)),  # resized to 853x256: none either
    ((2048, 1024), None, (512, 256)),  # resized to 512x256: a quarter
    ((2048, 1024), 6, (256, 512)),  # upright 1024x2048, resized to 256x512: a quarter, turned
    ((2048, 1024), 8, (256, 512)),  # (taken as unturned, 256x512 on 2048x1024 would allow only a half)
    ((1024, 2048), 5, (512, 256)),
    ((4000, 3000), 6, (375, 500)),  # an eighth
])
def test_jpeg_decodes_at_the_smallest_scale_that_covers_the_resize(monkeypatch, stored, orientation, decoded):
    ramps = Image.linear_gradient("L").resize(stored).convert("RGB")
    assert decoded_size(monkeypatch, encoded(ramps, orientation=orientation)) == decoded


def test_out_is_written_and_returned():
    body = synthetic_jpeg()
    batch = torch.full((3, *SHAPE), float("nan"))
    row = batch[1]
    assert to_sample(body, SHAPE, LIMIT, out=row) is row
    assert torch.equal(batch[1], to_sample(body, SHAPE, LIMIT))
    assert batch[0].isnan().all() and batch[2].isnan().all()
    with pytest.raises(ValueError, match="out must be float32 of shape"):
        to_sample(body, SHAPE, LIMIT, out=torch.empty(3, 224, 225))
    with pytest.raises(ValueError, match="out must be float32 of shape"):
        to_sample(body, SHAPE, LIMIT, out=torch.empty(SHAPE, dtype=torch.float64))
