"""Answering a batch of request bodies with a model and a codec: decode each, run the good ones
as one batch, encode each. Shared by the pool's instance processes and the in-process (stock)
handler, so both answer alike. A request's own failure is answered alone: 4xx for bad input,
500 for ours (encoding, or the model failing on that input); its batch-mates are not touched.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch

from packrat.codec.codec import Codec
from packrat.errors import RequestError, error_body, first_line


class Reply(NamedTuple):
    """One request's answer; pool.Answer(*reply) wraps it. A tuple, so it crosses from an instance
    process to the parent as plain pickled data."""
    status: int
    body: bytes  # JSON, or a binary KServe v2 answer
    reason: str = ""  # one line ("" when 200)
    content_type: str = "application/json"
    header_length: int | None = None  # binary KServe v2 answers: Inference-Header-Content-Length


def answer_batch(module, codec: Codec, bodies: list[tuple], mapper=map, laps: list[float] | None = None
                 ) -> list[Reply]:
    """A reply for each (body, content type[, KServe v2 header length]), in order.

    `mapper(fn, items)` decodes the bodies (map: one after another; the pool's instances pass a
    thread pool's map). With `laps`, the time.monotonic() after decoding, after the model's run and
    after encoding are appended to it (the pool's stage timing)."""
    answers: list = [None] * len(bodies)
    decoded = {}
    for index, outcome in enumerate(mapper(_decoded_or_error(codec), bodies)):
        if isinstance(outcome, Reply):
            answers[index] = outcome
        else:
            decoded[index] = outcome
    _lap(laps)
    outputs = run_each(module, {i: d.samples for i, d in decoded.items()})
    _lap(laps)
    for index, item in decoded.items():
        output = outputs[index]
        if isinstance(output, str):
            answers[index] = error(500, output)
            continue
        try:
            encoded = codec.encoded(output, item)
            answers[index] = Reply(200, encoded.body, "", encoded.content_type, encoded.header_length)
        except Exception as exc:  # our failure, this request's alone
            answers[index] = error(500, f"cannot encode the answer: {type(exc).__name__}: {first_line(exc)}")
    _lap(laps)
    return answers


def _decoded_or_error(codec: Codec):
    """One request's decode, its RequestError as its error reply (a mapper must not raise: one
    request's failure would cost the batch)."""
    def decode(request: tuple):
        try:
            return codec.decode(*request)
        except RequestError as exc:
            return error(exc.status, exc.reason)
    return decode


def _lap(laps: list[float] | None) -> None:
    if laps is not None:
        laps.append(time.monotonic())


def run_each(module, samples: dict) -> dict:
    """Each key's outputs from one batched call; if that call fails, each key alone, so only
    the inputs the model really fails on get the failure (a one-line reason instead of outputs).
    A key's samples are one tensor per model input, each (k, ...): the call concatenates them
    input by input and passes the inputs in order."""
    if not samples:
        return {}
    with torch.inference_mode():
        try:
            outputs = module(*batched(list(samples.values())))
            sizes = [len(s[0]) for s in samples.values()]
            return dict(zip(samples, (o.clone() for o in torch.split(outputs, sizes))))
        except Exception as exc:
            if len(samples) == 1:
                return {next(iter(samples)): f"the model failed on this input: {type(exc).__name__}: {first_line(exc)}"}
    result = {}
    for key, value in samples.items():
        result.update(run_each(module, {key: value}))
    return result


def batched(samples: list[tuple[torch.Tensor, ...]]) -> list[torch.Tensor]:
    """Several requests' inputs as one batch: each input's samples concatenated."""
    return [torch.cat(parts) for parts in zip(*samples)]


def error(status: int, reason: str) -> Reply:
    return Reply(status, error_body(reason), reason)
