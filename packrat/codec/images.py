"""Image bodies to one model input sample, pre-processed as TorchServe's image classifier does:
EXIF orientation, RGB, resize the short side to size / 0.875 (bilinear), centre crop, scale to
[0, 1], normalise with the ImageNet mean and std."""

from __future__ import annotations

import io
import warnings

import torch

from packrat.errors import RequestError, first_line

FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")  # what Pillow may open: no obscure decoders
CROP_FRACTION = 0.875  # 224 of 256, 299 of 342
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
BMP_HEADER_SIZES = {12, 40, 52, 56, 64, 108, 124}  # "BM" alone is too weak a magic


def is_image(data: bytes) -> bool:
    """Whether the bytes start like one of FORMATS, whatever the content type said."""
    return (data[:3] == b"\xff\xd8\xff" or data[:8] == b"\x89PNG\r\n\x1a\n"
            or data[:6] in (b"GIF87a", b"GIF89a") or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")
            or (data[:2] == b"BM" and int.from_bytes(data[14:18], "little") in BMP_HEADER_SIZES))


def to_sample(data: bytes, shape: tuple[int, int, int], max_pixels: int) -> torch.Tensor:
    """A float32 tensor of `shape` (3, H, W), or RequestError (413 for too many pixels)."""
    from PIL import Image

    with warnings.catch_warnings():
        # Pillow only warns between its two bomb limits; make that a refusal too.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = _decode(data, max_pixels)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise RequestError(413, f"image too large: {first_line(exc)}") from None
        except RequestError:
            raise
        except Image.UnidentifiedImageError:
            raise RequestError(400, f"not an image: none of {', '.join(FORMATS)} recognised the body") from None
        except Exception as exc:  # truncated or corrupt data
            raise RequestError(400, f"undecodable image: {type(exc).__name__}: {first_line(exc)}") from None
    return _normalise(_resize_crop(image, shape[1], shape[2], max_pixels))


def _decode(data: bytes, max_pixels: int):
    from PIL import Image, ImageOps

    image = Image.open(io.BytesIO(data), formats=FORMATS)  # reads the header only
    width, height = image.size
    if width * height > max_pixels:
        raise RequestError(413, f"image too large: {width}x{height} pixels (limit {max_pixels})")
    image.load()  # decode now: a truncated file fails here (Pillow's LOAD_TRUNCATED_IMAGES is off)
    return ImageOps.exif_transpose(image).convert("RGB")


def _resize_crop(image, height: int, width: int, max_pixels: int):
    from PIL import Image

    short = round(max(height, width) / CROP_FRACTION)
    w, h = image.size
    size = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    if size[0] * size[1] > max_pixels:  # a thin strip would grow enormous along its long side
        raise RequestError(413, f"image too large: {w}x{h} pixels resize to {size[0]}x{size[1]} "
                                f"(limit {max_pixels})")
    image = image.resize(size, Image.Resampling.BILINEAR)
    left, top = round((size[0] - width) / 2), round((size[1] - height) / 2)
    return image.crop((left, top, left + width, top + height))


def _normalise(image) -> torch.Tensor:
    pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    sample = pixels.view(image.height, image.width, 3).permute(2, 0, 1).float() / 255
    return ((sample - MEAN) / STD).contiguous()
