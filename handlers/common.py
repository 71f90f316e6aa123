"""What both handlers share: reading the archive's packrat settings and adapting TorchServe's
request rows and responses to packrat's requests and answers (bytes in, bytes out)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from packrat import graph
from packrat.codec import CodecConfig, request_body
from packrat.models import HF_PREFIX, ModelSpec, resolve
from packrat.pool import Answer, ModelConfig, Request, Watchdog

log = logging.getLogger("packrat.handler")


def settings(context) -> dict:
    """The `packrat:` section of the archive's model-config.yaml."""
    config = getattr(context, "model_yaml_config", None) or {}
    section = config.get("packrat")
    if not section or "model" not in section:
        raise ValueError("model archive has no 'packrat: {model: ...}' section in its model-config.yaml; "
                         "build it with `packrat archive`")
    return section


def model_config(section: dict, model_dir: str, profiled_mode: str | None = None) -> tuple[ModelConfig, ModelSpec]:
    """What the pool loads, and the model's description (input shape, dtype, task). Instances run
    the model as its profile measured it (`profiled_mode`): an eager profile gets eager instances."""
    model = section["model"]
    if (Path(model_dir) / model).is_file():  # a TorchScript or torch.export file shipped inside the archive
        model = str(Path(model_dir) / model)
    elif model.startswith(HF_PREFIX) and (Path(model_dir) / model[len(HF_PREFIX):]).is_dir():
        model = HF_PREFIX + str(Path(model_dir) / model[len(HF_PREFIX):])  # a save_pretrained directory shipped
    shape = tuple(section["input_shape"]) if section.get("input_shape") else None
    spec = resolve(model, shape)
    # IOS-compiled instances: schedules shipped in the archive; missing ones are searched and kept there
    ios_cache = model_dir if section.get("ios") else None
    # Compiled packages shipped in the archive sit in model_dir; missing ones come from (or are
    # built into) this machine's cache.
    return ModelConfig(model, tuple(spec.input_shape), graph_mode=served_mode(section, profiled_mode),
                       ios_cache=ios_cache, compile_cache=model_dir), spec


def served_mode(section: dict, profiled_mode: str | None) -> str:
    """The graph mode the instances run: the archive's `graph_mode` if it sets one, else the mode
    the profile was measured in (its plan rests on those latencies), else the default."""
    mode = section.get("graph_mode")
    if mode is not None:
        return graph.mode_name(mode)  # also reads true/false from archives built before the modes
    return graph.served(profiled_mode)


def mode_mismatch(profiled_mode: str | None, running_mode: str) -> str | None:
    """Why the plan may not hold, when the instances run the model otherwise than its profile
    measured it (say, tracing failed in the worker and they fell back to eager); None if they match."""
    if not profiled_mode or profiled_mode == running_mode:
        return None
    return (f"the profile was measured in {profiled_mode} mode but the instances run in {running_mode} mode: "
            f"the plan rests on latencies they may not have; profile the model as it is served")


def codec_config(section: dict, spec: ModelSpec, model_name: str, model_dir: str) -> CodecConfig:
    """How requests are decoded and answered: the archive's tokenizer, labels and limits."""
    def shipped(key: str) -> str | None:
        return str(Path(model_dir) / section[key]) if section.get(key) else None

    limits = {key: section[key] for key in ("max_body_bytes", "max_pixels", "max_samples", "truncate_text")
              if section.get(key) is not None}
    return CodecConfig.for_model(spec, model_name=model_name, tokenizer=shipped("tokenizer"),
                                 labels=shipped("labels"), **limits)


def pool_settings(section: dict) -> dict:
    """InstancePool keyword arguments from the archive's recovery settings; absent keys keep the
    pool's defaults (request timeout 120 s, queue 1000, hung after 10 × the expected latency, ≥ 5 s)."""
    settings = {key: float(section[key]) for key in ("gather_ms", "request_timeout_s") if section.get(key) is not None}
    if section.get("max_queue") is not None:
        settings["max_queue"] = int(section["max_queue"])
    watchdog = {key: float(section[name]) for key, name in (("factor", "hang_factor"), ("floor_s", "hang_floor_s"),
                                                           ("batch_timeout_s", "batch_timeout_s"))
                if section.get(name) is not None}
    if watchdog:
        settings["watchdog"] = Watchdog(**watchdog)
    return settings


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


def to_request(row: dict, context, index: int) -> Request:
    """One row as bytes: raw bodies as they are; what TorchServe already decoded (JSON, text,
    when its decode_input_request is on) encoded back."""
    body, kind = request_body(row), content_type(context, index)
    if isinstance(body, (bytes, bytearray)):
        return Request(bytes(body), kind)
    if isinstance(body, str):
        return Request(body.encode("utf-8"), kind or "text/plain")
    if body is None:
        return Request(b"", kind)
    return Request(json.dumps(body).encode("utf-8"), "application/json")


def respond(answers: list[Answer], context) -> list[bytes]:
    """One response per request, in order, each with its own status and reason."""
    for index, answer in enumerate(answers):
        context.set_response_content_type(index, "application/json")
        if answer.status != 200:
            context.set_response_status(answer.status, answer.reason, index)
    return [answer.body for answer in answers]
