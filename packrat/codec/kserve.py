"""KServe's request forms: v1 {"instances": [...]}, and v2 / Open Inference Protocol
{"id"?, "inputs": [{"name", "shape", "datatype", "data"}, ...]} in JSON or with the binary tensor
extension (packrat.codec.oip); and the head of a v2 answer."""

from __future__ import annotations

import math

import torch

from packrat.codec import oip
from packrat.codec.config import V2_OUTPUT, Decoded
from packrat.codec.samples import Samples, as_text, stacked
from packrat.errors import RequestError
from packrat.models.spec import InputSpec

V2_INPUTS = ("FP32", "FP64", "FP16", "INT64", "INT32", "INT16", "INT8", "UINT8")


def is_v2(body) -> bool:
    """A KServe v2 inference request: {"inputs": [{...}, ...]} (legacy bodies hold numbers there)."""
    inputs = body.get("inputs") if isinstance(body, dict) else None
    return isinstance(inputs, list) and bool(inputs) and isinstance(inputs[0], dict)


def v1(samples: Samples, instances) -> Decoded:
    if not isinstance(instances, list) or not instances:
        raise RequestError(400, '"instances" must be a non-empty list of samples')
    samples.count(len(instances))
    return Decoded(samples.batch(stacked([samples.sample(item) for item in instances])), "kserve-v1")


def v2(samples: Samples, body: dict, binary: bytes = b"", into=None) -> Decoded:
    """A KServe v2 body; `binary`: the bytes after its JSON (binary tensor extension); `into`: the
    request's row of the batch (a tensor per input), where an input of one sample in binary is
    copied straight into."""
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise RequestError(400, '"id" must be a string')
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise RequestError(400, '"inputs" must be a non-empty list of objects {"name", "shape", "datatype", ...}')
    parts: dict[str, torch.Tensor] = {}
    for entry, chunk in zip(inputs, oip.chunks(inputs, binary)):
        if not isinstance(entry, dict):
            raise RequestError(400, 'each of "inputs" must be an object {"name", "shape", "datatype", "data"}')
        spec = _input(samples, entry.get("name"))
        if spec.name in parts:
            raise RequestError(400, f"input {spec.name!r} given twice")
        datatype, data = entry.get("datatype"), entry.get("data")
        if datatype == "BYTES":
            if spec is not samples.first:
                raise RequestError(400, f"BYTES (images or text) go to the first input, {samples.first.name!r}, "
                                        f"not {spec.name!r}")
            parts.update(_bytes(samples, data) if chunk is None else _raw_bytes(samples, oip.elements(chunk)))
        else:
            row = into[samples.inputs.index(spec)] if into is not None else None
            parts[spec.name] = _numbers(samples, spec, datatype, entry.get("shape"), data, chunk, row)
    binary_output = oip.binary_output(body, V2_OUTPUT)
    return Decoded(samples.batch(parts), "kserve-v2", request_id, binary_output)


def answer_head(outputs: torch.Tensor, model_name: str, request_id: str | None) -> tuple[torch.Tensor, dict]:
    """The outputs as a v2 datatype can carry them, and the v2 answer without their data."""
    datatype = oip.datatype(outputs.dtype)
    if datatype is None:  # e.g. complex: answer what JSON can carry
        outputs, datatype = outputs.float(), "FP32"
    output = {"name": V2_OUTPUT, "shape": list(outputs.shape), "datatype": datatype}
    head = {"model_name": model_name} | ({"id": request_id} if request_id is not None else {})
    return outputs, {**head, "outputs": [output]}


def model_metadata(name: str, inputs: tuple[InputSpec, ...], output: dict | None = None) -> dict:
    """KServe v2 model metadata: the model's named inputs (batch dimension -1) and its one output,
    `output` ({"datatype", "shape"}, batch dimension included) where a front end has seen one, else
    FP32 of unknown width."""
    output = output or {"datatype": "FP32", "shape": [-1, -1]}
    return {"name": name, "versions": ["1"], "platform": "pytorch",
            "inputs": [{"name": spec.name, "datatype": oip.datatype(getattr(torch, spec.dtype)),
                        "shape": [-1, *spec.shape]} for spec in inputs],
            "outputs": [{"name": V2_OUTPUT, "datatype": output["datatype"], "shape": [-1, *output["shape"][1:]]}]}


def _input(samples: Samples, name) -> InputSpec:
    """The input a v2 entry is for: by name; a single-input model takes any name."""
    if len(samples.inputs) == 1:
        return samples.first
    for spec in samples.inputs:
        if spec.name == name:
            return spec
    raise RequestError(400, f"unknown input {str(name)[:40]!r}: this model takes {', '.join(samples.names)}")


def _bytes(samples: Samples, data) -> dict[str, torch.Tensor]:
    """One sample per element (base64 image or text); shape [k] or [k, 1]."""
    rows = data if isinstance(data, list) else [data]
    items = [x for row in rows for x in (row if isinstance(row, list) else [row])]
    if not items:
        raise RequestError(400, "KServe v2 input has no data")
    samples.count(len(items))
    return stacked([samples.sample(item) for item in items])


def _raw_bytes(samples: Samples, items: list[bytes]) -> dict[str, torch.Tensor]:
    """One sample per binary BYTES element: raw image bytes, or UTF-8 text."""
    if not items:
        raise RequestError(400, "KServe v2 input has no data")
    samples.count(len(items))
    if samples.input_kind == "image":
        return stacked([samples.first_input(samples.image(item)) for item in items])
    texts = [as_text(item) for item in items]
    if None in texts:
        raise RequestError(400, "a BYTES element is neither an image nor UTF-8 text")
    return stacked([samples.text_sample(text) for text in texts])


def _numbers(samples: Samples, spec: InputSpec, datatype, shape, data, chunk: bytes | None,
             row: torch.Tensor | None = None) -> torch.Tensor:
    """An input's numbers: JSON "data", or its binary `chunk`, of `shape` ([k, *the input's] or its own).
    A binary chunk of one sample in the input's own dtype is copied into `row` (its row of the batch)
    where one is given, and read there: one copy of the bytes, not three (to bytes, to a tensor, to
    the row)."""
    if datatype not in V2_INPUTS:
        raise RequestError(400, f"unsupported datatype {str(datatype)[:20]!r}: use BYTES or one of "
                                f"{', '.join(V2_INPUTS)}")
    named = samples.for_input(spec)
    if datatype.startswith("FP") and not spec.is_float:
        raise RequestError(400, f"wrong dtype{named}: got {datatype}, expected {samples.describe(spec)}")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise RequestError(400, '"shape" must be a list of non-negative integers')
    if chunk is None:
        values = samples.numbers(data, spec).flatten()
    elif row is not None and oip.DTYPES.get(datatype) == row.dtype and len(chunk) == row.numel() * row.element_size():
        oip.copy_into(row, chunk)
        values = row
    else:
        values = oip.tensor(chunk, datatype).to(samples.dtypes[spec.name])
    if math.prod(shape) != values.numel():
        raise RequestError(400, f"shape {shape} does not match the {values.numel()} values in data")
    values = values.view(shape)
    if tuple(shape) == spec.shape:
        return values[None]
    if tuple(shape[1:]) != spec.shape:
        raise RequestError(400, f"wrong shape{named}: got {shape}, expected {list(spec.shape)} or "
                                f"[k, {', '.join(map(str, spec.shape))}] ({samples.describe(spec)})")
    return values
