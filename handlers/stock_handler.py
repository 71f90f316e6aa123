"""The baseline: a plain BaseHandler-style handler running the model in the worker
process, with TorchServe's own workers and threads. Same decoding and responses as
the packrat handler, so a comparison measures only how the cores are used."""

from __future__ import annotations

import torch
from ts.torch_handler.base_handler import BaseHandler

from handlers import common
from packrat import codec
from packrat.models import prepare


class StockHandler(BaseHandler):
    def initialize(self, context):
        section = common.settings(context)
        model, self.spec = common.model_config(section, context.system_properties["model_dir"])
        self.input = codec.InputSpec(tuple(self.spec.input_shape), self.spec.input_dtype)
        batch = int(context.system_properties.get("batch_size") or 1)
        self.model, example, _ = prepare(self.spec, batch, graph_mode=model.graph_mode)
        with torch.inference_mode():
            self.model(example)  # warm-up, as the pool does
        self.initialized = True

    def handle(self, data, context):
        decoded = common.decode_batch(data, self.input, context)
        good = [item for item in decoded if isinstance(item, torch.Tensor)]
        outputs = None
        if good:
            with torch.inference_mode():
                outputs = self.model(torch.stack(good))
        return common.respond(decoded, outputs, self.spec.task, context)
