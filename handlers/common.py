"""What both handlers share: reading the archive's packrat settings and adapting TorchServe's
request rows and responses to packrat's requests and answers (bytes in, bytes out)."""

from __future__ import annotations

import json
import logging

from packrat.codec.oip import HEADER, timeout_s
from packrat.errors import one_line
from packrat.serving.pool.api import Answer, Request
from packrat.settings import Settings

log = logging.getLogger(__name__)


def settings(context) -> Settings:
    """The settings in the `packrat:` section of the archive's model-config.yaml."""
    config = getattr(context, "model_yaml_config", None) or {}
    section = config.get("packrat")
    if not section or "model" not in section:
        raise ValueError("model archive has no 'packrat: {model: ...}' section in its model-config.yaml; "
                         "build it with `packrat archive`")
    return Settings.from_section(section)


def content_type(context, index: int) -> str | None:
    """The request's Content-Type, from the body parameter or the HTTP headers."""
    for name in ("body", "data"):
        value = _properties(context, index).get(name)
        if isinstance(value, dict) and value.get("content-type"):
            return value["content-type"]
    return header(context, index, "content-type")


def header(context, index: int, name: str) -> str | None:
    """An HTTP request header, by name in any case (TorchServe passes names as the client sent them)."""
    for key, value in _properties(context, index).items():
        if key.lower() == name.lower() and isinstance(value, str):
            return value
    return None


def _properties(context, index: int) -> dict:
    try:
        return context.request_processor[index].get_request_properties()
    except (AttributeError, IndexError, TypeError):
        return {}


def request_body(row: dict):
    """TorchServe puts the body under "data" or "body"."""
    body = row.get("data")
    return row.get("body") if body is None else body


def to_request(row: dict, context, index: int, received_at: float | None = None) -> Request:
    """One row as bytes: raw bodies as they are (TorchServe's bytearray, not copied: the pool copies
    it once, into shared memory); what TorchServe already decoded (JSON, text, when its
    decode_input_request is on) encoded back. `received_at`: the earliest it may have reached
    TorchServe (time.monotonic(); its deadline counts from there); a raw body's Triton `timeout`
    parameter is the client's deadline (oip.timeout_s)."""
    body, kind = request_body(row), content_type(context, index)
    if isinstance(body, (bytes, bytearray)):  # only raw bytes can hold a KServe v2 binary body
        length = header(context, index, HEADER)
        return Request(body, kind, length, received_at, timeout_s(body, length))
    if isinstance(body, str):
        return Request(body.encode("utf-8"), kind or "text/plain", received_at=received_at)
    if body is None:
        return Request(b"", kind, received_at=received_at)
    return Request(json.dumps(body).encode("utf-8"), "application/json", received_at=received_at)


def status_phrase(reason: str) -> str:
    """A reason as the HTTP status phrase TorchServe sends: one line of ASCII. TorchServe's worker
    frames the phrase with its length in characters but writes its UTF-8 bytes: a reason quoting a
    client's non-ASCII text (a name, a header) threw its Java side out of step with the worker, which
    it then restarted, failing every request the worker held (found by fuzzing, issue 71)."""
    return one_line(reason).encode("ascii", "backslashreplace").decode("ascii")


def respond(answers: list[Answer], context) -> list[bytes]:
    """One response per request, in order, each with its own status, reason, content type and,
    for binary KServe v2 answers, the length of their JSON header; for refusals, when to try again."""
    for index, answer in enumerate(answers):
        context.set_response_content_type(index, answer.content_type)
        if answer.header_length is not None:
            context.set_response_header(index, HEADER, str(answer.header_length))
        if answer.retry_after_s is not None:
            context.set_response_header(index, "Retry-After", str(answer.retry_after_s))
        if answer.status != 200:
            context.set_response_status(answer.status, status_phrase(answer.reason), index)
    return [answer.body for answer in answers]
