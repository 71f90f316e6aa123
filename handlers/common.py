"""What both handlers share: reading the archive's packrat settings and adapting
TorchServe's request rows to packrat.codec."""

from __future__ import annotations

import logging
from pathlib import Path

from packrat import codec
from packrat.models import ModelSpec, resolve
from packrat.pool import ModelConfig

log = logging.getLogger("packrat.handler")


def settings(context) -> dict:
    """The `packrat:` section of the archive's model-config.yaml."""
    config = getattr(context, "model_yaml_config", None) or {}
    section = config.get("packrat")
    if not section or "model" not in section:
        raise ValueError("model archive has no 'packrat: {model: ...}' section in its model-config.yaml; "
                         "build it with `packrat archive`")
    return section


def model_config(section: dict, model_dir: str) -> tuple[ModelConfig, ModelSpec]:
    """What the pool loads, and the model's description (input shape, dtype, task)."""
    model = section["model"]
    if (Path(model_dir) / model).is_file():  # a TorchScript file shipped inside the archive
        model = str(Path(model_dir) / model)
    shape = tuple(section["input_shape"]) if section.get("input_shape") else None
    spec = resolve(model, shape)
    # IOS-compiled instances: schedules shipped in the archive; missing ones are searched and kept there
    ios_cache = model_dir if section.get("ios") else None
    return ModelConfig(model, tuple(spec.input_shape), graph_mode=section.get("graph_mode", True),
                       ios_cache=ios_cache), spec


def content_type(context, index: int) -> str | None:
    """The request's Content-Type, from the body parameter or the HTTP headers."""
    try:
        properties = context.request_processor[index].get_request_properties()
    except (AttributeError, IndexError, TypeError):
        return None
    for name in ("body", "data"):
        value = properties.get(name)
        if isinstance(value, dict) and value.get("content-type"):
            return value["content-type"]
    for key, value in properties.items():
        if key.lower() == "content-type" and isinstance(value, str):
            return value
    return None


def decode_batch(data: list[dict], spec: codec.InputSpec, context) -> list:
    """Each row as a tensor, or a RequestError for that row alone."""
    decoded = []
    for index, row in enumerate(data):
        try:
            decoded.append(codec.decode(codec.request_body(row), spec, content_type(context, index)))
        except codec.RequestError as exc:
            decoded.append(exc)
    return decoded


def respond(decoded: list, outputs, task: str, context) -> list[dict]:
    """One response per request, in order: the encoded output, or the request's own error."""
    responses, good = [], iter(outputs if outputs is not None else [])
    for index, item in enumerate(decoded):
        context.set_response_content_type(index, "application/json")
        if isinstance(item, codec.RequestError):
            context.set_response_status(item.status, item.reason, index)
            responses.append({"error": item.reason})
        else:
            responses.append(codec.encode(next(good), task))
    return responses
