"""A model's outputs as the answer to the request they came from: top-k classes (with labels),
an embedding, or the next tokens (with their text), in the request's form (plain, KServe v1, or
KServe v2 in JSON or with binary outputs)."""

from __future__ import annotations

import functools
import json

import torch

from packrat.codec import kserve, oip
from packrat.codec.config import CodecConfig, Decoded, Encoded
from packrat.errors import first_line

TOP_K = 5
TOP_FORMS = ("plain", "kserve-v1")  # the forms a classifier's answer is its top classes in
V2_HEADERS = 64  # binary answers' headers kept ...
V2_KEPT_ID = 256  # ... for request ids this long at most: a client's ids hold no more than 64 x this


class Answers:
    def __init__(self, config: CodecConfig, text=None):
        self.config, self.text = config, text  # text: the TextEncoder, to spell next tokens
        self.labels = load_labels(config.labels) if config.labels else None
        self._class_fields: dict[int, str] = {}  # top_json's start of each class's prediction
        self._v2_headers: dict[tuple, bytes] = {}  # _binary_v2's

    def tops(self, outputs: torch.Tensor) -> list[tuple[list[float], list[int]]] | None:
        """A classifier's top-k (scores, classes) of each row of a batch's outputs, one sample a
        row, found in one call for the batch; None for another task."""
        if self.config.task != "classification" or outputs.dim() < 1 or not len(outputs):
            return None
        # each step only where it changes something: each is a call through torch's dispatcher
        rows = outputs if outputs.dim() == 2 else outputs.reshape(len(outputs), -1)
        scores = torch.softmax(rows.detach() if rows.requires_grad else rows, dim=1, dtype=torch.float32)
        top, classes = scores.topk(min(TOP_K, scores.shape[1]), dim=1)
        return list(zip(top.tolist(), classes.tolist()))

    def encoded(self, outputs: torch.Tensor, decoded: Decoded) -> Encoded:
        """Compact UTF-8 JSON answering the request that `decoded` came from; a KServe v2 request
        asking for binary outputs gets a JSON header and the raw outputs (packrat.codec.oip). A
        classifier's rows whose batch found their tops() are answered by top_json instead."""
        outputs = outputs.detach().cpu()
        if decoded.form == "kserve-v2":
            if decoded.binary_output:
                return self._binary_v2(outputs, decoded.request_id)
            outputs, head = kserve.answer_head(outputs, self.config.model_name, decoded.request_id)
            body = {**head, "outputs": [{**head["outputs"][0], "data": outputs.flatten().tolist()}]}
        elif decoded.form == "kserve-v1":
            body = {"predictions": [self.answer(row) for row in outputs]}
        else:
            body = self.answer(outputs[0])
        return _json(body)

    def _binary_v2(self, outputs: torch.Tensor, request_id: str | None) -> Encoded:
        """A binary v2 answer: its JSON header, made once for each request id, shape and dtype
        (V2_HEADERS kept; a new id with every request clears them), then the outputs' bytes."""
        key = (request_id, outputs.dtype, outputs.shape)
        header = self._v2_headers.get(key)
        if header is None:
            carried, head = kserve.answer_head(outputs, self.config.model_name, request_id)
            if carried is not outputs or len(request_id or "") > V2_KEPT_ID:  # converted (complex), or a long id
                body, length = oip.encode(head, [carried])
                return Encoded(body, "application/octet-stream", length)
            if len(self._v2_headers) >= V2_HEADERS:
                self._v2_headers.clear()
            header = self._v2_headers[key] = oip.header(head, [outputs.numel() * outputs.element_size()])
        return Encoded(header + oip.raw(outputs), "application/octet-stream", len(header))

    def answer(self, output: torch.Tensor) -> dict:
        """One sample's plain answer."""
        if self.config.task == "classification":
            scores = torch.softmax(output.float().flatten(), dim=0)
            top, classes = scores.topk(min(TOP_K, scores.numel()))
            return {"predictions": [self._prediction(int(c), float(s)) for c, s in zip(classes, top)]}
        if self.config.task == "language-model":
            logits = output.float().reshape(-1, output.shape[-1])[-1]  # (L, V) outputs: the last position's
            top, tokens = logits.topk(min(TOP_K, logits.numel()))
            return {"next_tokens": [self._next_token(int(t), float(v)) for t, v in zip(tokens, top)]}
        return {"embedding": output.float().flatten().tolist()}

    def top_json(self, top: tuple[list[float], list[int]], kserve_v1: bool) -> bytes:
        """The JSON of _prediction's answer for one sample's top classes, formatted rather than
        built and encoded (a fifth of json's time a request): the scores are a softmax of outputs
        answer_batch found finite, so repr() writes each as json would."""
        fields = self._class_fields
        listed = ",".join([(fields.get(c) or self._class_field(c)) + repr(s) + "}" for s, c in zip(*top)])
        return (f'{{"predictions":[{{"predictions":[{listed}]}}]}}' if kserve_v1
                else f'{{"predictions":[{listed}]}}').encode("utf-8")

    def _class_field(self, index: int) -> str:
        """A prediction's JSON up to its score, `{"class":N,"label":NAME,"score":`, kept: a class
        is one of the model's outputs, so they are as many as its outputs at most."""
        label = self.labels.get(index) if self.labels is not None else None
        label_field = f'"label":{_COMPACT.encode(label)},' if label is not None else ""
        field = self._class_fields[index] = f'{{"class":{index},{label_field}"score":'
        return field

    def _prediction(self, index: int, score: float) -> dict:
        label = self.labels.get(index) if self.labels is not None else None
        return {"class": index, **({"label": label} if label is not None else {}), "score": score}

    def _next_token(self, token: int, logit: float) -> dict:
        text = {"text": self.text.token_text(token)} if self.text is not None else {}
        return {"token": token, **text, "logit": logit}


# one encoder for every answer: json.dumps with options builds a new one per call
_COMPACT = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _json(body) -> Encoded:
    return Encoded(_COMPACT.encode(body).encode("utf-8"))


def load_labels(path: str) -> dict[int, str]:
    """index_to_name.json: {"0": "tench"} or TorchServe's ImageNet {"0": ["n01440764", "tench"]}."""
    try:
        with open(path, encoding="utf-8") as file:
            raw = json.load(file)
        return {int(key): str(value[-1] if isinstance(value, list) and value else value)
                for key, value in raw.items()}
    except OSError as exc:
        raise ValueError(f"cannot read labels file {path}: {exc.strerror or exc}") from None
    except (ValueError, AttributeError, TypeError) as exc:
        raise ValueError(f"labels file {path} must map class indices to names like TorchServe's "
                         f"index_to_name.json ({type(exc).__name__}: {first_line(exc)})") from None
