"""Image body to normalised sample on one core (issue 41): the pipeline as it was against packrat's.

    taskset -c 1 .venv/bin/python benchmarks/decode.py [--rounds 7] [--shape 3,224,224] [--json OUT]

Two synthetic photos (500x375, and a 4000x3000 "camera" one), interleaved rounds on this process's
first core. `reference` below is the pipeline before issue 41, the one copy of it, which
tests/test_images.py compares packrat.codec.images.to_sample with."""
from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import torch

from packrat.bench.harness import doc_parser, first_cores, pin
from packrat.bench.results import fmt_num, markdown_table, write_json
from packrat.bench.rounds import interleaved, median_spread
from packrat.cli.types import shape as shape_type
from packrat.codec.images import CROP_FRACTION, FORMATS, MEAN, STD, refusals, to_sample
from packrat.errors import RequestError

MAX_PIXELS = 100_000_000  # above the photos here: packrat's default limit is no part of what is timed
PHOTOS = {"500x375": (500, 375), "4000x3000": (4000, 3000)}  # synthetic_jpeg's default quality, 90
ITERS = {"500x375": 40, "4000x3000": 2}  # calls per case and round: a round of each takes ~0.1-0.3 s


# ---- the reference: packrat.codec.images before issue 41, verbatim but for names and comments ----

def reference(data: bytes, shape: tuple[int, int, int], max_pixels: int) -> torch.Tensor:
    """A float32 tensor of `shape` (3, H, W), or RequestError (413 for too many pixels)."""
    with refusals():  # the errors' mapping is shared with the new path, unchanged by issue 41
        image = _reference_decode(data, max_pixels)
    return _reference_normalise(_reference_resize_crop(image, shape[1], shape[2], max_pixels))


def _reference_decode(data: bytes, max_pixels: int):
    from PIL import Image, ImageOps

    image = Image.open(io.BytesIO(data), formats=FORMATS)
    width, height = image.size
    if width * height > max_pixels:
        raise RequestError(413, f"image too large: {width}x{height} pixels (limit {max_pixels})")
    image.load()
    return ImageOps.exif_transpose(image).convert("RGB")


def _reference_resize_crop(image, height: int, width: int, max_pixels: int):
    from PIL import Image

    short = round(max(height, width) / CROP_FRACTION)
    w, h = image.size
    size = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    if size[0] * size[1] > max_pixels:
        raise RequestError(413, f"image too large: {w}x{h} pixels resize to {size[0]}x{size[1]} "
                                f"(limit {max_pixels})")
    image = image.resize(size, Image.Resampling.BILINEAR)
    left, top = round((size[0] - width) / 2), round((size[1] - height) / 2)
    return image.crop((left, top, left + width, top + height))


def _reference_normalise(image) -> torch.Tensor:
    pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    sample = pixels.view(image.height, image.width, 3).permute(2, 0, 1).float() / 255
    return ((sample - MEAN) / STD).contiguous()


# ---- the benchmark --------------------------------------------------------------------------------

def per_image_ms(fn, body: bytes, iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        fn(body)
    return (time.perf_counter() - start) * 1e3 / iters


def measure(body: bytes, shape: tuple[int, int, int], rounds: int, iters: int) -> dict:
    """old and new per-image ms over interleaved rounds ({"median", "spread"} each), new/old of
    the medians and each round's ratio's spread, and how far apart their samples are."""
    out = torch.empty(shape)
    cases = {"old": lambda: per_image_ms(lambda b: reference(b, shape, MAX_PIXELS), body, iters),
             "new": lambda: per_image_ms(lambda b: to_sample(b, shape, MAX_PIXELS, out), body, iters)}
    for case in cases.values():  # warm: first calls load Pillow's plugins and torch's kernels
        case()
    samples = interleaved(cases, rounds)
    old, new = median_spread(samples["old"]), median_spread(samples["new"])
    ratios = [n / o for n, o in zip(samples["new"], samples["old"])]
    diff = (to_sample(body, shape, MAX_PIXELS) - reference(body, shape, MAX_PIXELS)).abs()
    return {"old_ms": old, "new_ms": new, "ratio": new["median"] / old["median"],
            "round_ratios": median_spread(ratios), "samples": samples,
            "mean_abs_diff": diff.mean().item(), "max_abs_diff": diff.max().item()}


def report(results: dict) -> str:
    def ms(figure):
        return f"{fmt_num(figure['median'], 2)} [{fmt_num(figure['spread'][0], 2)}-{fmt_num(figure['spread'][1], 2)}]"

    rows = [(name, f"{r['kb']:.0f}", ms(r["old_ms"]), ms(r["new_ms"]), fmt_num(r["ratio"], 2),
             f"{fmt_num(r['round_ratios']['spread'][0], 2)}-{fmt_num(r['round_ratios']['spread'][1], 2)}",
             f"{r['mean_abs_diff']:.4f} / {r['max_abs_diff']:.3f}") for name, r in results.items()]
    return markdown_table(["photo", "KB", "old ms", "new ms", "new/old", "per round", "mean / max |diff|"], rows)


def build_parser():
    parser = doc_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--shape", type=shape_type, default=(3, 224, 224), help="the model's sample, 3,H,W")
    parser.add_argument("--json", type=Path, default=None, help="keep every figure here")
    return parser


def main(argv=None) -> int:
    from packrat.codec.payloads import synthetic_jpeg

    args = build_parser().parse_args(argv)
    pin(first_cores(1))
    shape = tuple(args.shape)
    results = {}
    for name, (width, height) in PHOTOS.items():
        body = synthetic_jpeg(width, height)
        print(f"{name}: {len(body) / 1e3:.0f} KB, {args.rounds} rounds ...", file=sys.stderr, flush=True)
        results[name] = {"kb": len(body) / 1e3, **measure(body, shape, args.rounds, ITERS[name])}
    print(report(results))
    if args.json:
        write_json(args.json, {"core": first_cores(1), "shape": shape, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
